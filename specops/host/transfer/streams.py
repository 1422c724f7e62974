"""Shared plumbing of the streams: meters, limits, the pool of workers, rsync and ssh options,
the link check, a transfer session.
"""

from __future__ import annotations

import io
import queue
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, cast

from specops.errors import SpecopsError
from specops.host.transfer import tuning
from specops.host.transfer.link import Link, _Probe, choose_streams, measure_rtt


# -- shared plumbing -----------------------------------------------------------------------------

class _Meter:
    """Bytes done of total, reported to on_progress at most every 0.1 s (and at the end)."""

    def __init__(self, total: int, cb: Optional[tuning.Progress]):
        self.total, self.cb, self.done = total, cb, 0
        self.lock = threading.Lock()
        self.last = 0.0

    def add(self, n: int):
        with self.lock:
            self.done += n
            now = time.monotonic()
            if self.cb is None or now - self.last < 0.1:
                return
            self.last = now
            done, total = self.done, max(self.total, self.done)
        self.cb(done, total)

    def finish(self):
        if self.cb is not None:
            self.cb(self.done, max(self.total, self.done))


class _Limiter:
    """--bwlimit (KiB/s, like rsync's) across every stream together."""

    def __init__(self, kib_s: int):
        self.rate = kib_s * 1024.0 if kib_s else 0.0
        self.next = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n: int):
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            self.next = max(self.next, now) + n / self.rate
            wait = self.next - now
        if wait > 0.02:
            time.sleep(wait)


class _Refused(Exception):
    """The host closed the connection before the stream started."""


class _Lost(Exception):
    """The stream died mid-way; `rest` is the work still to do."""

    def __init__(self, rest, why: str):
        super().__init__(why)
        self.rest, self.why = rest, why


@dataclass
class Batch:
    kind: str                      # "pieces", "rsync", "ranges"
    items: list
    bytes: int = 0
    tries: int = 0


class _Pool:
    """Runs batches on `streams` threads; a refused stream hands its batch to the others."""

    def __init__(self, streams: int, host: str = "the host"):
        self.streams, self.host = streams, host
        self.q: "queue.Queue[Batch]" = queue.Queue()
        self.lock = threading.Lock()
        self.alive = 0
        self.refused = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.procs: set = set()

    def track(self, p):
        with self.lock:
            self.procs.add(p)

    def untrack(self, p):
        with self.lock:
            self.procs.discard(p)

    def kill_all(self):
        with self.lock:
            procs = list(self.procs)
        for p in procs:
            if p.poll() is None:
                p.kill()

    def _worker(self, fn):
        gone = False  # (a refused worker has already left the count)
        try:
            while not self.stop.is_set():
                try:
                    b = self.q.get_nowait()
                except queue.Empty:
                    return
                backoff = 0.25
                while True:
                    try:
                        fn(b)
                        break
                    except _Refused as e:
                        with self.lock:
                            if self.alive > 1:
                                self.alive -= 1
                                self.refused += 1
                                gone = True
                                self.q.put(b)
                                return
                        if backoff > 4:  # the last stream standing keeps being refused
                            raise SpecopsError(f"connection to {self.host} lost: it keeps refusing SSH connections "
                                               f"({e}): run it again, it resumes") from None
                        time.sleep(backoff)
                        backoff *= 2
                    except _Lost as e:
                        if e.rest is None:
                            break
                        e.rest.tries = b.tries + 1
                        if e.rest.tries > 3:
                            raise SpecopsError(f"connection to {self.host} lost: a transfer stream failed 3 times "
                                               f"({e.why}): run it again, it resumes") from None
                        self.q.put(e.rest)
                        break
        except BaseException as e:  # noqa: BLE001 - reported by run()
            with self.lock:
                self.errors.append(e)
            self.stop.set()
            self.kill_all()
        finally:
            if not gone:
                with self.lock:
                    self.alive -= 1

    def run(self, batches: list[Batch], fn) -> None:
        for b in batches:
            self.q.put(b)
        n = min(self.streams, len(batches))
        self.alive = n
        threads = [threading.Thread(target=self._worker, args=(fn,), daemon=True) for _ in range(n)]
        try:
            for th in threads:
                th.start()
            for th in threads:
                while th.is_alive():
                    th.join(0.2)
            while not self.q.empty() and not self.errors:  # work handed back after the others ended
                self.alive = 1
                self._worker(fn)
        except BaseException:
            self.stop.set()
            self.kill_all()
            raise
        if self.errors:
            raise self.errors[0]


def _pipe_size(f, size: int = tuning.MIB) -> None:
    try:
        import fcntl

        fcntl.fcntl(f.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (OSError, ImportError, AttributeError, ValueError):
        pass


class _Tail:
    """The last few KiB of a stream's stderr, read in the background."""

    def __init__(self, f):
        self.f, self.data = f, b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for chunk in iter(lambda: self.f.read(4096), b""):
            self.data = (self.data + chunk)[-8192:]

    def text(self) -> str:
        self.thread.join(2)
        return self.data.decode(errors="replace")


def _last_line(text: str, rc: int) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {rc}"


_RSYNC_HELP: Optional[str] = None


def _rsync_help() -> str:
    global _RSYNC_HELP
    if _RSYNC_HELP is None:
        _RSYNC_HELP = subprocess.run(["rsync", "--help"], capture_output=True, text=True).stdout
    return _RSYNC_HELP


def _rsync_base() -> list[str]:
    h = _rsync_help()
    return ["rsync", "-a", "--secluded-args" if "--secluded-args" in h else "--protect-args"]


_CIPHERS: Optional[list[str]] = None
PREFERRED_CIPHERS = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"


def _cipher_options() -> list[str]:
    """-o Ciphers=^AES-GCM (placed ahead of the default list; the rest still negotiates) when this
    OpenSSH accepts it (8.2+), else nothing."""
    global _CIPHERS
    if _CIPHERS is None:
        try:
            ok = subprocess.run(["ssh", "-G", "-o", f"Ciphers={PREFERRED_CIPHERS}", "specops-cipher-check"],
                                capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        _CIPHERS = ["-o", f"Ciphers={PREFERRED_CIPHERS}"] if ok else []
    return _CIPHERS


def stream_ssh(t) -> list[str]:
    """The ssh argv prefix of one stream: the host's options (strict known_hosts, key, port,
    ProxyCommand), one connection per stream (never a user's ControlMaster), no compression, and
    AES-GCM first where this ssh knows the syntax (hardware AES: about twice chacha20's rate)."""
    return list(t.ssh_command()) + ["-T", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                                    "-o", "Compression=no", *_cipher_options()]


class LinkCheck:
    """The link, measured once per transfer: the round trip now (one keepalive) and, when one
    stream may be window-bound, one stream's throughput in the background. Start it early (the
    probe runs while other work goes on), hand it to Download/Upload (link=...), close() it."""

    def __init__(self, t, streams: Optional[int] = None):
        self.t, self.forced = t, streams
        self.ssh = stream_ssh(t)
        self.target = f"{t.host.user}@{t.host.address}"  # (ssh takes an IPv6 address bare; -p has the port)
        self.rtt = 0.0
        self.one: Optional[float] = None
        self.measured = False
        self.probe: Optional[_Probe] = None
        self.pinger: Optional[threading.Thread] = None
        if not streams:
            self.rtt = measure_rtt(t, 1)
            if self.rtt >= tuning.LAN_RTT:
                self.probe = _Probe(self.ssh + [self.target], self.rtt)
                # two more round trips in the background (keepalives: no session, beside any command)
                self.samples = [self.rtt]
                self.pinger = threading.Thread(target=lambda: self.samples.append(measure_rtt(t, 2)), daemon=True)
                self.pinger.start()

    def _pings(self) -> None:
        if self.pinger is not None:
            self.pinger.join(10)
            self.rtt = min(self.samples)
            self.pinger = None

    def model(self, work: int, units: int) -> int:
        """The stream count from the round trip alone (before the probe has answered), so that
        streams can connect meanwhile (decide() may then keep fewer, or start more)."""
        self._pings()
        return choose_streams(self.rtt, None, work, units, self.forced)[0]

    def decide(self, work: int, units: int, until: Optional[Callable[[], bool]] = None) -> Link:
        """The stream count; the probe is waited for (a second at most), or only until `until()`
        says the work can start (the streams are connected): then the round trip decides."""
        if not self.forced and not self.measured:
            self._pings()
            if self.probe is not None and work >= 4 * tuning.MIN_STREAM_BYTES:
                deadline = time.monotonic() + max(1.0, 15 * self.rtt)
                while True:
                    if not self.probe.thread.is_alive():
                        self.one = self.probe.rate
                        break
                    if time.monotonic() >= deadline or (until is not None and until()):
                        break
                    self.probe.thread.join(0.02)
            self.measured = True
            self.close()
        n, why = choose_streams(self.rtt, self.one, work, units, self.forced)
        return Link(self.rtt, self.one, n, why)

    def close(self):
        if self.probe is not None:
            self.probe.cancel()


class _Session:
    """What every transfer shares: the ssh argv, the link, the pool, progress and notes."""

    def __init__(self, t, *, streams: Optional[int], on_progress: Optional[tuning.Progress], what: str,
                 link: Optional[LinkCheck] = None):
        self.t = t
        self.what = what
        self.on_progress = on_progress
        self.check = link or LinkCheck(t, streams)
        self.own_check = link is None
        self.ssh, self.target = self.check.ssh, self.check.target
        self.rsync = False  # (known with the listing)
        self.link: Optional[Link] = None
        self.pool: _Pool  # (set by the transfer that runs: Upload, Download)

    def argv(self, cmd: str) -> list[str]:
        return self.ssh + [self.target, cmd]

    def decide(self, work: int, units: int, until: Optional[Callable[[], bool]] = None) -> Link:
        if self.link is None:
            self.link = self.check.decide(work, units, until)
        return self.link

    def close(self):
        if self.own_check:
            self.check.close()

    def note_refused(self, pool: _Pool, n: int) -> None:
        if pool.refused:
            left = n - pool.refused
            self.t.note(f"{self.what}: the host refused {pool.refused} of {n} SSH connections opened at once "
                        f"(sshd MaxStartups/MaxSessions or a connection limit): went on with {left} stream(s)", "warn")

    # -- rsync groups (both directions) --------------------------------------------------------
    def run_rsync(self, batch: Batch, src: str, dst: str, meter: _Meter, *, force: bool = False,
                  bwlimit: int = 0) -> None:
        argv = _rsync_base() + ["--partial", "--files-from=-", "--from0", "-e", shlex.join(self.ssh)]
        if force:
            argv.append("--ignore-times")
        if bwlimit:
            argv.append(f"--bwlimit={max(1, int(bwlimit))}")
        progress = meter.cb is not None and "--info" in _rsync_help()
        if progress:
            argv += ["--info=progress2", "--no-inc-recursive"]
        argv += [src, dst]
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdin is not None and p.stdout is not None
        self.pool.track(p)
        err = _Tail(p.stderr)
        try:
            p.stdin.write(b"\0".join(e.rel.encode() for e in batch.items) + b"\0")
            p.stdin.close()
        except BrokenPipeError:
            pass
        seen = 0
        buf = b""
        out = cast(io.BufferedReader, p.stdout)
        for chunk in iter(lambda: out.read1(65536), b""):
            if not progress:
                continue
            buf += chunk
            *lines, buf = re.split(rb"[\r\n]", buf)
            for ln in lines:
                parts = ln.split()
                if len(parts) >= 2 and parts[1].endswith(b"%"):
                    try:
                        now = int(parts[0].replace(b",", b"").replace(b".", b""))
                    except ValueError:
                        continue
                    if now > seen:
                        meter.add(now - seen)
                        seen = now
        rc = p.wait()
        self.pool.untrack(p)
        text = err.text()
        if rc != 0:
            if self.pool.stop.is_set():
                raise SpecopsError("stopped")
            if tuning._REFUSED.search(text) and ("0 bytes received so far" in text or "kex_exchange" in text
                                          or "closed by" in text):
                raise _Refused(_last_line(text, rc))
            raise SpecopsError(f"rsync {src} -> {dst} failed for {self.t.host.name}: {_last_line(text, rc)}")
        if batch.bytes > seen:
            meter.add(batch.bytes - seen)
