"""The link: the round trip, one stream's throughput probed, how many streams to run.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Optional

from specops.host.transfer import tuning


# -- the link --------------------------------------------------------------------------------

def measure_rtt(t, samples: int = 3) -> float:
    rtt = getattr(t, "rtt", None)
    return rtt(samples) if rtt is not None else 0.0


class _Probe:
    """One stream's throughput, measured in the background: up to PROBE_BYTES from the host's
    /dev/urandom over a connection of its own, timed from the end of the first window (past the
    connection's start and the first slow-start rounds). It stops early once the rate is clearly
    what the window allows (the common case on a long link)."""

    def __init__(self, argv: list[str], rtt: float, nbytes: int = tuning.PROBE_BYTES):
        self.nbytes, self.rtt = nbytes, rtt
        self.bound = tuning.WINDOW / max(rtt, 1e-6)
        self.rate: Optional[float] = None
        self.proc = subprocess.Popen(argv + [f"head -c {int(nbytes)} /dev/urandom"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        got, t_a, b_a = 0, None, 0
        buf = bytearray(256 << 10)
        f = self.proc.stdout
        while True:
            n = f.readinto(buf)
            if not n:
                break
            got += n
            now = time.perf_counter()
            if t_a is None:
                if got >= tuning.WINDOW:
                    t_a, b_a = now, got
            elif now - t_a >= 2 * self.rtt and (got - b_a) / (now - t_a) >= 0.5 * self.bound:
                self.rate = (got - b_a) / (now - t_a)  # clearly window-bound: enough said
                self.proc.kill()
                break
        end = time.perf_counter()
        self.proc.wait()
        if self.rate is None and got == self.nbytes and t_a is not None and got > b_a:
            self.rate = (got - b_a) / max(end - t_a, 1e-6)

    def result(self, timeout: float) -> Optional[float]:
        self.thread.join(timeout)
        return None if self.thread.is_alive() else self.rate

    def cancel(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Link:
    rtt: float
    one_stream: Optional[float]
    streams: int
    why: str


def choose_streams(rtt: float, one_stream: Optional[float], work_bytes: int, units: int,
                   forced: Optional[int] = None, max_streams: int = tuning.MAX_STREAMS) -> tuple[int, str]:
    """How many streams for work_bytes in `units` separable parts (pieces and file groups)."""
    cap = max(1, min(units, math.ceil(work_bytes / tuning.MIN_STREAM_BYTES)))
    ms = f"{rtt * 1000:.1f} ms"
    if forced:
        n = max(1, min(int(forced), tuning.STREAMS_LIMIT, cap))
        return n, f"{n} stream(s) (forced: {forced})" + ("" if n == forced else f"; {cap} part(s) to move")
    if rtt < tuning.LAN_RTT:
        return 1, f"1 stream (round trip {ms}: one stream is not window-bound)"
    bound = tuning.WINDOW / rtt
    if one_stream is not None and one_stream < tuning.LINK_BOUND * bound:
        return 1, (f"1 stream (one stream moves {tuning._mib(one_stream)}, well under the {tuning._mib(bound)} an SSH "
                   f"window allows at a {ms} round trip: the link, not the window, is the limit)")
    per = one_stream or bound
    n = min(max(2, math.ceil(tuning.AIM / per)), max_streams, cap)
    one = f"moves {tuning._mib(one_stream)}" if one_stream else f"is bounded near {tuning._mib(bound)} by its window"
    return n, f"{n} stream(s) (round trip {ms}; one stream {one})"
