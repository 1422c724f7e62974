"""evaluate's acceptance pass (serve/counters.py answer()) against a small HTTP server standing in for vLLM (the
real server's pass: tests/test_categories.py, tests/test_real.py): a category's prompts in flight together,
--concurrency at most, the counters read only once a category's answers are all in, and again until they settle."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

from specops_host.serve import counters

LINE = 'vllm:spec_decode_{}_total{{engine="0",model_name="verifier"}} {}\n'


class Fake:
    """Each completion: 0.2 s, then 2 drafts (one token accepted of 3 each) counted 0.15 s after it returns (as
    vLLM records a step's stats just after it hands back the step's outputs)."""

    def __init__(self):
        self.lock, self.now, self.most, self.drafts, self.accepted, self.log = threading.Lock(), 0, 0, 0, 0, []

    def count_later(self):
        time.sleep(0.15)
        with self.lock:
            self.drafts, self.accepted = self.drafts + 2, self.accepted + 2

    def handler(self):
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def reply(self, body: bytes):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                with fake.lock:
                    d, acc = fake.drafts, fake.accepted
                self.reply((LINE.format("num_drafts", d) + LINE.format("num_draft_tokens", 3 * d)
                            + LINE.format("num_accepted_tokens", acc)).encode())

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.now += 1
                    fake.most = max(fake.most, fake.now)
                    fake.log.append(body["prompt"])
                time.sleep(0.2)
                with fake.lock:
                    fake.now -= 1
                threading.Thread(target=fake.count_later).start()
                self.reply(json.dumps({"usage": {"completion_tokens": 5}}).encode())
        return H


def test_a_categorys_prompts_go_together_and_its_counters_are_read_once_settled():
    fake = Fake()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        prompts = [{"prompt": f"w{i}", "category": "writing"} for i in range(6)] + \
                  [{"prompt": f"m{i}", "category": "math"} for i in range(3)]
        t0 = time.time()
        before = counters.parse_metrics(counters.get(f"{base}/metrics"))
        tokens, by_cat, after = counters.answer(base, prompts, SimpleNamespace(concurrency=4, max_tokens=5), before)
        took = time.time() - t0
    finally:
        srv.shutdown()
    assert fake.most == 4  # (6 writing prompts, 4 in flight at most; the math ones after them)
    assert sorted(fake.log[:6]) == [f"w{i}" for i in range(6)] and sorted(fake.log[6:]) == ["m0", "m1", "m2"]
    assert tokens == 45 and set(by_cat) == {"writing", "math"}
    # (every answer's counts in its own category's figure, though counted after the answer returned)
    assert after["drafts"] == 18 and by_cat["writing"]["counters"]["drafts"] == 12, by_cat
    assert by_cat["math"]["counters"]["drafts"] == 6 and by_cat["math"]["mean_acceptance_length"] == 2.0
    assert took < 2.0, took  # (in turn, the 9 prompts alone would take 1.8 s, and a 1 s wait per category 2 more)
