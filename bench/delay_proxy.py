"""A userspace TCP delay proxy on 127.0.0.1: every chunk it reads is written to the other side
D ms later, in order, in both directions (a link with a round trip of 2*D ms and no loss).

    .venv/bin/python bench/delay_proxy.py --target 127.0.0.1:PORT --delay-ms 25 [--port 0]
                                          [--max-seconds 3600]

Prints `listening 127.0.0.1:PORT` once it accepts connections, then serves until --max-seconds
have passed (or SIGTERM/SIGINT). Binds 127.0.0.1 only and connects to 127.0.0.1 only.

Why it reproduces a long link: an SSH channel may have at most its window (2 MiB in OpenSSH)
unacknowledged; the window adjustment travels back through the proxy, so one channel moves
about window / (2*D) per second, as over a real path with that round trip (`tc netem` is not
available here). The proxy itself buffers at most --max-buffer-mib per direction per connection
(it stops reading beyond that: TCP back-pressure, as a bottleneck queue would).

In process: `with DelayProxy(target_port, delay_ms) as p: ... p.port` runs the same proxy as a
child process (its own interpreter: the proxy's copying does not share the caller's GIL).
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))  # bench/inspect.py would shadow the stdlib's
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import asyncio  # noqa: E402
import collections  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

CHUNK_BUFFER = 32 << 20  # default per direction, per connection


class _Pipe(asyncio.Protocol):
    """One direction's receiving end: what arrives is queued and written to `peer` D seconds later."""

    def __init__(self, delay: float, max_buffer: int):
        self.delay, self.max_buffer = delay, max_buffer
        self.transport: asyncio.Transport | None = None
        self.peer: "_Pipe | None" = None  # the protocol of the other socket (whose transport we write to)
        self.queue: collections.deque = collections.deque()
        self.queued = 0
        self.timer: asyncio.TimerHandle | None = None
        self.eof = False
        self.paused_by_peer = False
        self.paused_by_queue = False
        self.loop = asyncio.get_event_loop()

    # -- reading side --------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes):
        if self.delay <= 0 and not self.queue and self.peer is not None:
            self._write(data)
            return
        self.queue.append((self.loop.time() + self.delay, data))
        self.queued += len(data)
        if self.queued > self.max_buffer and not self.paused_by_queue:
            self.paused_by_queue = True
            self.transport.pause_reading()
        self.schedule()

    def schedule(self):
        """Arm the one timer for the queue's head (not before the other side is connected)."""
        if self.timer is None and self.queue and self.peer is not None:
            self.timer = self.loop.call_at(self.queue[0][0], self._flush)

    def eof_received(self):
        self.eof = True
        if not self.queue and self.peer is not None:
            self._write_eof()
        return True  # keep our transport open for the other direction

    def connection_lost(self, exc):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # -- writing side (to the peer's transport) --------------------------------------
    def _flush(self):
        self.timer = None
        now = self.loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, data = self.queue.popleft()
            self.queued -= len(data)
            self._write(data)
        if self.paused_by_queue and self.queued <= self.max_buffer // 2:
            self.paused_by_queue = False
            if not self.paused_by_peer:
                self.transport.resume_reading()
        if self.queue:
            self.schedule()
        elif self.eof:
            self._write_eof()

    def _write(self, data: bytes):
        if self.peer is not None and self.peer.transport is not None and not self.peer.transport.is_closing():
            self.peer.transport.write(data)

    def _write_eof(self):
        t = self.peer.transport if self.peer is not None else None
        if t is not None and not t.is_closing() and t.can_write_eof():
            try:
                t.write_eof()
            except OSError:  # the other side is gone already
                t.close()

    # -- flow control: the peer's transport (which we write to) is full ------------------
    def pause_writing(self):  # called on the protocol owning the full transport: pause its source
        src = self.peer
        if src is not None and src.transport is not None:
            src.paused_by_peer = True
            src.transport.pause_reading()

    def resume_writing(self):
        src = self.peer
        if src is not None and src.transport is not None:
            src.paused_by_peer = False
            if not src.paused_by_queue:
                src.transport.resume_reading()


async def serve(target_port: int, delay_ms: float, port: int = 0, max_seconds: float = 3600,
                max_buffer: int = CHUNK_BUFFER, ready=None) -> None:
    loop = asyncio.get_running_loop()
    delay = delay_ms / 1000.0

    async def on_client(client: _Pipe):
        try:
            _, upstream = await loop.create_connection(lambda: _Pipe(delay, max_buffer), "127.0.0.1", target_port)
        except OSError:
            client.transport.close()
            return
        client.peer, upstream.peer = upstream, client
        upstream.schedule()  # (what the server sent before the pair was joined was queued)
        if upstream.eof and not upstream.queue:
            upstream._write_eof()
        # the client's reading was paused until now (see factory)
        client.transport.resume_reading()

    def factory():
        p = _Pipe(delay, max_buffer)
        orig = p.connection_made

        def made(transport):
            orig(transport)
            transport.pause_reading()
            loop.create_task(on_client(p))
        p.connection_made = made
        return p

    server = await loop.create_server(factory, "127.0.0.1", port, reuse_address=True)
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready(bound)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await asyncio.wait_for(stop.wait(), timeout=max_seconds)
    except asyncio.TimeoutError:
        pass
    server.close()


class DelayProxy:
    """The proxy as a child process: `with DelayProxy(port, 25) as p: connect to p.port`."""

    def __init__(self, target_port: int, delay_ms: float, max_seconds: float = 3600):
        self.target_port, self.delay_ms, self.max_seconds = target_port, delay_ms, max_seconds
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> "DelayProxy":
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--target", f"127.0.0.1:{self.target_port}",
             "--delay-ms", str(self.delay_ms), "--max-seconds", str(self.max_seconds)],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"delay proxy did not start: {line!r}")
        self.port = int(line.split(":")[-1])
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # by PID
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="127.0.0.1:PORT (loopback only)")
    ap.add_argument("--delay-ms", type=float, required=True, help="added to each direction")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=3600)
    ap.add_argument("--max-buffer-mib", type=float, default=CHUNK_BUFFER / 2**20)
    a = ap.parse_args()
    host, _, port = a.target.rpartition(":")
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit("delay_proxy: the target must be on 127.0.0.1")
    if not 0 <= a.delay_ms <= 10_000 or not 0 < a.max_seconds <= 24 * 3600:
        raise SystemExit("delay_proxy: --delay-ms in 0..10000, --max-seconds in (0, 86400]")

    def ready(bound):
        print(f"listening 127.0.0.1:{bound}", flush=True)

    t0 = time.time()
    asyncio.run(serve(int(port), a.delay_ms, a.port, a.max_seconds, int(a.max_buffer_mib * 2**20), ready))
    print(f"stopped after {time.time() - t0:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
