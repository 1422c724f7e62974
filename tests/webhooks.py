"""A real webhook on 127.0.0.1 for the notification tests: it records each POST and answers at once,
or, for its first `drip` requests, answers `HTTP/1.1 200 OK` and then one byte every `every` seconds
(what a per-read socket timeout never ends), at most `drips` bytes: it stops by itself."""

import http.server
import json
import threading
import time


class Dripping(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        hook = self.server.hook
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        got = {"at": time.time(), "path": self.path, "auth": self.headers.get("Authorization"),
               "text": json.loads(body or b"{}").get("text"), "closed": None}
        with hook.lock:
            hook.got.append(got)
            drip = len(hook.got) <= hook.drip
        if not drip:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            got["closed"] = time.time()
            return
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self.wfile.flush()
            for _ in range(hook.drips):
                time.sleep(hook.every)
                self.wfile.write(b"X")
                self.wfile.flush()
        except OSError:
            pass
        got["closed"] = time.time()
        self.close_connection = True

    def log_message(self, *a):
        pass


class Webhook:
    def __init__(self, drip=0, every=5.0, drips=12):
        self.drip, self.every, self.drips = drip, every, drips
        self.got, self.lock = [], threading.Lock()
        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dripping)
        self.srv.daemon_threads = True
        self.srv.hook = self
        self.port = self.srv.server_port
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()
