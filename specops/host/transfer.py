"""Bulk transfers to and from a host over SSH: several streams at once, split by files and by
byte ranges, resumable, verified. Behind ``SSHTransport.sync_down``/``_sync_up``/``put`` (upload
and wheelhouse pushes, shard and checkpoint moves) and ``fetch``.

Why: one SSH channel may have at most its window (2 MiB in OpenSSH) in flight, so one stream
moves at most window / round trip (40 MiB/s at 50 ms) whatever the link. Several at once
multiply that.

- The link (LinkCheck): the round trip is measured on the open connection (SSH keepalive
  requests: no session); when one stream could be window-bound (a round trip over LAN_RTT), one
  stream's throughput is probed in the background (up to 8 MiB over a connection of its own,
  while the push check and the listing go on). One stream on a LAN, or when one stream moves
  well under what its window allows (the link is the limit); otherwise enough streams for AIM,
  at most MAX_STREAMS (8: under sshd's default MaxStartups of 10 unauthenticated connections).
  ``streams=N`` forces N.
- The work: files of RANGE_MIN and more move as pieces (PIECE bytes, aligned to 1 MiB) striped
  over the streams; a few small files ride the same streams, one piece each; many small files
  (or symlinks) go in rsync groups (``--files-from``: rsync's quick check, delta and --partial).
  A piece stream is one ``ssh HOST sh -s`` started while the link is judged (its connection is
  up when the work starts); it runs ``dd`` per piece (every argument quoted) and prints a marker
  after each piece, which the laptop checks: a file that shrinks or grows under the transfer
  cannot shift the bytes of the next piece. Every stream carries the host's SSH options
  (``SSHTransport.ssh_command()``: strict known_hosts, key, port, ProxyCommand for a jump host),
  its own connection (never a ControlMaster), and prefers AES-GCM (hardware AES).
- Arrival: pieces are written at their offsets into DIR/.specops-part.NAME, with the list of the
  pieces done next to it (.json): a killed transfer resumes its pieces (a re-run skips files whose
  size and mtime match, like rsync). The file's sha256 follows its contiguous prefix as it fills
  (done when the last piece lands); then the file gets the host's mtime and mode and is renamed
  into place. fetch checks every file against the host's sha256 manifest (remote/manifest.py);
  the digests computed on arrival spare it reading the files again.
- Uploads (Upload, upload_file): the same the other way; ranges (UP_RANGE) go to
  DIR/.specops-up.KEY.I on the host (``head -c N >>``: a killed upload resumes each range), are
  joined there, and the joined file's sha256 (sha256sum on the host) must equal the laptop's
  before it is moved into place.
- A host that closes extra connections before they start (sshd MaxStartups, a connection
  limit): the refused streams' work goes to the streams that did connect (the last one retries
  with a backoff); one note says how many went on.

Names starting with ``.specops-`` (hash caches, partial files) are never transferred.
``on_progress(done_bytes, total_bytes)`` is called from worker threads, at most about ten times
a second, and once at the end.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import re
import shlex
import shutil
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from specops.errors import SpecopsError

MIB = 1 << 20
#: OpenSSH's channel window (CHAN_SES_WINDOW_DEFAULT): what one stream may have in flight
WINDOW = 2 * MIB
#: below this round trip one stream is not window-bound (2 MiB / 2 ms = 1 GiB/s)
LAN_RTT = 0.002
#: the aggregate rate worth opening streams for (more streams than this needs are not opened)
AIM = 320 * MIB
MAX_STREAMS = 8
#: a forced streams=N is capped here
STREAMS_LIMIT = 32
#: files at least this big move as pieces; smaller ones in rsync groups
RANGE_MIN = 8 * MIB
PIECE = 16 * MIB
#: up to this many small files (and bytes) ride the piece streams instead of an rsync group
FEW_SMALL = 64
FEW_SMALL_BYTES = 64 * MIB
#: an upload range (fixed, so that a killed upload resumes whatever the stream count)
UP_RANGE = 32 * MIB
#: one stream's throughput probe
PROBE_BYTES = 8 * MIB
#: one stream under this share of what its window allows: the link, not the window, is the limit
LINK_BOUND = 0.2
#: less work than this: no probe (the round trip decides), and no more streams than work / this
MIN_STREAM_BYTES = 8 * MIB
SKIP_PREFIX = ".specops-"
PART_PREFIX = ".specops-part."
UP_PREFIX = ".specops-up."
#: what OpenSSH says when the host closes a connection before it starts (MaxStartups, limits)
_REFUSED = re.compile(r"kex_exchange_identification|ssh_exchange_identification|Connection closed by|"
                      r"Connection reset by|Session open refused|open failed|banner exchange|"
                      r"Connection refused|0 bytes received so far", re.I)

Progress = Callable[[int, int], None]


def _mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB/s" if n >= 10 * MIB else f"{n / MIB:.1f} MiB/s"


def _skipped(rel: str) -> bool:
    return any(part.startswith(SKIP_PREFIX) for part in rel.split("/"))


# -- listings -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    """A file under a transfer root: kind f (regular), l (symlink), o (other), d (empty dir)."""

    rel: str
    size: int
    mtime_ns: int
    mode: int = 0o644
    kind: str = "f"


_FIND = ("cd {root} 2>/dev/null || exit 3; "
         "{{ command -v rsync >/dev/null 2>&1 && printf 'rsync\\0' || printf 'none\\0'; }}; "
         "find . -mindepth 1 \\( -type d -empty -printf 'd 0 0 755 %P\\0' \\) "
         "-o \\( ! -type d -printf '%y %s %T@ %m %P\\0' \\)")


class NoDirectory(SpecopsError):
    """The directory to transfer from is not on the host."""


def _ns(stamp: str) -> int:
    sec, _, frac = stamp.partition(".")
    return int(sec) * 10**9 + int((frac + "000000000")[:9])


def remote_listing(t, root: str, *, missing_ok: bool = False, mkdir: bool = False) -> dict[str, Entry]:
    """Every entry under root on the host, in one command (GNU find; SFTP where find has no
    -printf). Whether the host has rsync comes with it (remote_has_rsync(t))."""
    q = shlex.quote(root)
    cmd = (f"mkdir -p {q} && " if mkdir else "") + _FIND.format(root=q)
    r = t.run(cmd, changes=False)
    if r.exited == 3:
        if missing_ok:
            return {}
        raise NoDirectory(f"no directory {root} on {t.host.name}")
    recs = r.stdout.split("\0")
    if recs and recs[0] in ("rsync", "none"):
        if hasattr(t, "_rsync_remote"):  # (SSHTransport.rsync_ok()'s answer, without a round trip of its own)
            t._rsync_remote = recs[0] == "rsync"
        recs = recs[1:]
    if not r.ok:
        return _sftp_listing(t, root)
    out: dict[str, Entry] = {}
    for rec in recs:
        if not rec:
            continue
        kind, size, stamp, mode, rel = rec.split(" ", 4)
        out[rel] = Entry(rel, int(size), _ns(stamp), int(mode, 8), kind if kind in "fld" else "o")
    return out


def remote_has_rsync(t) -> bool:
    """rsync on both sides (the host's answer came with its listing)."""
    return shutil.which("rsync") is not None and hasattr(t, "rsync_ok") and t.rsync_ok()


def _sftp_listing(t, root: str) -> dict[str, Entry]:
    sftp = t.conn.sftp()
    out: dict[str, Entry] = {}

    def walk(rdir: str, prefix: str):
        items = sftp.listdir_attr(rdir)
        if not items and prefix:
            out[prefix[:-1]] = Entry(prefix[:-1], 0, 0, 0o755, "d")
        for a in items:
            rel = prefix + a.filename
            if stat.S_ISDIR(a.st_mode):
                walk(f"{rdir}/{a.filename}", rel + "/")
            else:
                kind = "f" if stat.S_ISREG(a.st_mode) else "l" if stat.S_ISLNK(a.st_mode) else "o"
                out[rel] = Entry(rel, a.st_size or 0, int(a.st_mtime or 0) * 10**9, (a.st_mode or 0) & 0o7777, kind)

    try:
        walk(root.rstrip("/") or "/", "")
    except FileNotFoundError:
        raise NoDirectory(f"no directory {root} on {t.host.name}") from None
    return out


def local_listing(root: Path) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    for dirpath, dirnames, files in os.walk(root):
        d = Path(dirpath)
        for name in dirnames + files:
            p = d / name
            st = p.lstat()
            rel = p.relative_to(root).as_posix()
            if stat.S_ISDIR(st.st_mode):
                if not any(p.iterdir()):
                    out[rel] = Entry(rel, 0, st.st_mtime_ns, st.st_mode & 0o7777, "d")
                continue
            kind = "f" if stat.S_ISREG(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "o"
            out[rel] = Entry(rel, st.st_size, st.st_mtime_ns, st.st_mode & 0o7777, kind)
    return out


def _same(a: Optional[Entry], b: Entry) -> bool:
    """rsync's quick check: same kind, size and mtime (whole seconds)."""
    return (a is not None and a.kind == b.kind and a.size == b.size
            and a.mtime_ns // 10**9 == b.mtime_ns // 10**9)


# -- the link --------------------------------------------------------------------------------

def measure_rtt(t, samples: int = 3) -> float:
    rtt = getattr(t, "rtt", None)
    return rtt(samples) if rtt is not None else 0.0


class _Probe:
    """One stream's throughput, measured in the background: up to PROBE_BYTES from the host's
    /dev/urandom over a connection of its own, timed from the end of the first window (past the
    connection's start and the first slow-start rounds). It stops early once the rate is clearly
    what the window allows (the common case on a long link)."""

    def __init__(self, argv: list[str], rtt: float, nbytes: int = PROBE_BYTES):
        self.nbytes, self.rtt = nbytes, rtt
        self.bound = WINDOW / max(rtt, 1e-6)
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
                if got >= WINDOW:
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
                   forced: Optional[int] = None, max_streams: int = MAX_STREAMS) -> tuple[int, str]:
    """How many streams for work_bytes in `units` separable parts (pieces and file groups)."""
    cap = max(1, min(units, math.ceil(work_bytes / MIN_STREAM_BYTES)))
    ms = f"{rtt * 1000:.1f} ms"
    if forced:
        n = max(1, min(int(forced), STREAMS_LIMIT, cap))
        return n, f"{n} stream(s) (forced: {forced})" + ("" if n == forced else f"; {cap} part(s) to move")
    if rtt < LAN_RTT:
        return 1, f"1 stream (round trip {ms}: one stream is not window-bound)"
    bound = WINDOW / rtt
    if one_stream is not None and one_stream < LINK_BOUND * bound:
        return 1, (f"1 stream (one stream moves {_mib(one_stream)}, well under the {_mib(bound)} an SSH window "
                   f"allows at a {ms} round trip: the link, not the window, is the limit)")
    per = one_stream or bound
    n = min(max(2, math.ceil(AIM / per)), max_streams, cap)
    return n, (f"{n} stream(s) (round trip {ms}; one stream " +
               (f"moves {_mib(one_stream)}" if one_stream else f"is bounded near {_mib(bound)} by its window") + ")")


# -- shared plumbing -----------------------------------------------------------------------------

class _Meter:
    """Bytes done of total, reported to on_progress at most every 0.1 s (and at the end)."""

    def __init__(self, total: int, cb: Optional[Progress]):
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

    def __init__(self, streams: int):
        self.streams = streams
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
                            raise SpecopsError(f"the host keeps refusing SSH connections: {e}") from None
                        time.sleep(backoff)
                        backoff *= 2
                    except _Lost as e:
                        if e.rest is None:
                            break
                        e.rest.tries = b.tries + 1
                        if e.rest.tries > 3:
                            raise SpecopsError(f"a transfer stream failed 3 times: {e.why}") from None
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


def _pipe_size(f, size: int = MIB) -> None:
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
            if self.rtt >= LAN_RTT:
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
            if self.probe is not None and work >= 4 * MIN_STREAM_BYTES:
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

    def __init__(self, t, *, streams: Optional[int], on_progress: Optional[Progress], what: str,
                 link: Optional[LinkCheck] = None):
        self.t = t
        self.what = what
        self.on_progress = on_progress
        self.check = link or LinkCheck(t, streams)
        self.own_check = link is None
        self.ssh, self.target = self.check.ssh, self.check.target
        self.rsync = False  # (known with the listing)
        self.link: Optional[Link] = None

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
        self.pool.track(p)
        err = _Tail(p.stderr)
        try:
            p.stdin.write(b"\0".join(e.rel.encode() for e in batch.items) + b"\0")
            p.stdin.close()
        except BrokenPipeError:
            pass
        seen = 0
        buf = b""
        for chunk in iter(lambda: p.stdout.read1(65536), b""):
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
            if _REFUSED.search(text) and ("0 bytes received so far" in text or "kex_exchange" in text
                                          or "closed by" in text):
                raise _Refused(_last_line(text, rc))
            raise SpecopsError(f"rsync {src} -> {dst} failed for {self.t.host.name}: {_last_line(text, rc)}")
        if batch.bytes > seen:
            meter.add(batch.bytes - seen)


# -- downloads --------------------------------------------------------------------------------------

@dataclass
class Piece:
    rel: str
    index: int
    offset: int
    length: int
    pid: int = 0


class _Ranged:
    """One file arriving as pieces: DIR/.specops-part.NAME, its record of pieces done, its sha256."""

    def __init__(self, final: Path, e: Entry, piece: int, fresh: bool):
        self.final, self.entry = final, e
        name = final.name if len(final.name) < 200 else hashlib.sha1(final.name.encode()).hexdigest()
        self.part = final.parent / f"{PART_PREFIX}{name}"
        self.side = final.parent / f"{PART_PREFIX}{name}.json"
        self.piece = piece
        self.done: set[int] = set()
        if not fresh:
            self._load()
        if fresh or not self.done:
            for p in (self.part, self.side):
                p.unlink(missing_ok=True)
        self.npieces = max(1, math.ceil(e.size / self.piece))
        self.done = {i for i in self.done if 0 <= i < self.npieces}
        self.lock = threading.Lock()
        self.prefix = 0            # pieces 0..prefix-1 are all done
        self.hashed = 0
        self.sha = hashlib.sha256()
        self.failed: Optional[str] = None
        self.finished = False
        self.resumed_bytes = sum(self.length(i) for i in self.done)
        self._advance()

    def _load(self):
        try:
            rec = json.loads(self.side.read_text())
            if (rec.get("size"), rec.get("mtime_ns")) == (self.entry.size, self.entry.mtime_ns) and \
                    self.part.exists() and isinstance(rec.get("piece"), int) and rec["piece"] > 0:
                self.piece = rec["piece"]
                self.done = {int(i) for i in rec.get("done", [])}
        except (OSError, ValueError, TypeError):
            self.done = set()

    def length(self, i: int) -> int:
        return max(0, min(self.piece, self.entry.size - i * self.piece))

    def pieces(self) -> list[Piece]:
        return [Piece(self.entry.rel, i, i * self.piece, self.length(i)) for i in range(self.npieces)
                if i not in self.done]

    def _advance(self):
        while self.prefix in self.done:
            self.prefix += 1

    def mark(self, i: int) -> bool:
        """Piece i landed: record it; True if the contiguous prefix grew."""
        with self.lock:
            self.done.add(i)
            tmp = self.side.with_name(self.side.name + ".tmp")
            tmp.write_text(json.dumps({"size": self.entry.size, "mtime_ns": self.entry.mtime_ns,
                                       "piece": self.piece, "done": sorted(self.done)}))
            os.replace(tmp, self.side)
            before = self.prefix
            self._advance()
            return self.prefix != before

    def ready_bytes(self) -> int:
        with self.lock:
            return min(self.entry.size, self.prefix * self.piece)

    def discard(self, why: str):
        with self.lock:
            self.failed = why
        for p in (self.part, self.side):
            p.unlink(missing_ok=True)


def _read_exact(f, n: int) -> bytes:
    """n bytes from a pipe (fewer only at its end)."""
    got = b""
    while len(got) < n:
        c = f.read(n - len(got))
        if not c:
            break
        got += c
    return got


class _Stream:
    """One `ssh HOST sh -s` piece stream, started ahead of its work (its connection comes up while
    the link is still being judged); it says specops-ready once it runs on the host."""

    READY = b"specops-ready\n"

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     bufsize=0)
        _pipe_size(self.proc.stdout)
        self.err = _Tail(self.proc.stderr)
        try:
            self.proc.stdin.write(b"echo specops-ready\n")
        except OSError:
            pass
        self.said = b""
        self.ready = threading.Event()
        threading.Thread(target=self._wait_ready, daemon=True).start()

    def _wait_ready(self) -> None:
        """Up to the ready line (what a login shell prints before it is skipped over); `said` is
        that line, or what came instead (empty: the connection closed at once)."""
        line, seen = b"", 0
        while seen < 65536:
            c = self.proc.stdout.read(1)
            if not c:
                break
            seen += 1
            line += c
            if c == b"\n":
                self.said, line = line, b""
                if self.said == self.READY:
                    break
        if self.said != self.READY and line:
            self.said = line
        self.ready.set()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Download(_Session):
    """remote_dir on the host -> local_dir here. Prepare (list, measure, plan) then run()."""

    def __init__(self, t, remote_dir: str, local_dir, *, only: Optional[set] = None, force: bool = False,
                 streams: Optional[int] = None, bwlimit: int = 0, on_progress: Optional[Progress] = None,
                 what: str = "transfer", link: Optional[LinkCheck] = None):
        super().__init__(t, streams=streams, on_progress=on_progress, what=what, link=link)
        self.remote = t.expand(remote_dir).rstrip("/") or "/"
        self.local = Path(local_dir)
        self.only, self.force, self.bwlimit = only, force, bwlimit
        self.hashed: dict[str, str] = {}
        self.changed: list[str] = []
        self.report: dict = {}
        try:
            self.listing = remote_listing(t, self.remote)
            self.rsync = remote_has_rsync(t)
            self._plan()
        except BaseException:
            self.close()
            raise

    def _plan(self) -> None:
        self.local.mkdir(parents=True, exist_ok=True)
        small: list[Entry] = []
        big: list[Entry] = []
        for rel, e in sorted(self.listing.items()):
            if _skipped(rel) or (self.only is not None and rel not in self.only):
                continue
            lp = self.local / rel
            if e.kind == "d":
                lp.mkdir(parents=True, exist_ok=True)
                continue
            if not (self.force and self.only is not None) and _same(_local_entry(lp), e):
                continue
            (big if e.kind == "f" and e.size >= RANGE_MIN else small).append(e)
        forced = bool(self.force and self.only is not None)
        self.has_big = bool(big)
        self.ranged: dict[str, _Ranged] = {}
        for e in big:
            lp = self.local / e.rel
            lp.parent.mkdir(parents=True, exist_ok=True)
            piece = max(PIECE, math.ceil(e.size / 2048 / MIB) * MIB)
            self.ranged[e.rel] = _Ranged(lp, e, piece, fresh=forced)
        # A few small files (a run's logs and configs) ride the piece streams, one piece each: no
        # connection and rsync start of their own. Many of them (or no rsync): rsync groups.
        regular = [e for e in small if e.kind == "f"]
        if small and (not self.rsync or (len(regular) == len(small) and len(small) <= FEW_SMALL
                                         and sum(e.size for e in small) <= FEW_SMALL_BYTES)):
            for e in regular:
                lp = self.local / e.rel
                lp.parent.mkdir(parents=True, exist_ok=True)
                self.ranged[e.rel] = _Ranged(lp, e, max(MIB, math.ceil(e.size / MIB) * MIB), fresh=True)
            small = [] if not self.rsync else [e for e in small if e.kind != "f"]
        self.small = small
        self.pieces = [p for r in self.ranged.values() for p in r.pieces()]
        for i, p in enumerate(self.pieces):
            p.pid = i
        self.resumed = sum(r.resumed_bytes for r in self.ranged.values())
        self.work = sum(p.length for p in self.pieces) + sum(e.size for e in small)

    def _stripes(self, n: int) -> int:
        """How many of n streams carry pieces (the others: rsync groups of small files)."""
        if not self.pieces:
            return 0
        per = max(self.work / n, 1)
        return min(len(self.pieces), max(1, n - round(sum(e.size for e in self.small) / per)))

    def _batches(self, n: int) -> list[Batch]:
        per = max(self.work / n, 1)
        small_bytes = sum(e.size for e in self.small)
        g = 0
        if self.small:
            g = max(1, min(n, round(small_bytes / per))) if self.pieces else n
        groups = [Batch("rsync", []) for _ in range(min(g, len(self.small)))]
        for e in sorted(self.small, key=lambda e: -e.size):
            b = min(groups, key=lambda b: b.bytes)
            b.items.append(e)
            b.bytes += e.size
        stripes = [Batch("pieces", []) for _ in range(self._stripes(n))]
        for i, pc in enumerate(self.pieces):
            b = stripes[i % len(stripes)]
            b.items.append(pc)
            b.bytes += pc.length
        return groups + stripes  # (the groups first: they start with the others, not after)

    def run(self) -> dict:
        t0 = time.perf_counter()
        self.spares: list[_Stream] = []
        self.spares_lock = threading.Lock()
        try:
            units = max(1, len(self.pieces) + (min(len(self.small), MAX_STREAMS) if self.small else 0))
            if self.pieces:  # the piece streams connect while the probe finishes
                self.spares = [_Stream(self.argv("exec sh -s"))
                               for _ in range(self._stripes(self.check.model(self.work, units)))]
            spares = list(self.spares)
            link = self.decide(self.work, units, until=(lambda: all(s.ready.is_set() for s in spares))
                               if spares else None)
            n = link.streams
            for s in self.spares[self._stripes(n):]:  # (the probe said fewer)
                s.kill()
            del self.spares[self._stripes(n):]
            self.meter = _Meter(self.work, self.on_progress)
            self.limiter = _Limiter(self.bwlimit)
            if self.work:
                self.t.note(f"{self.what}: {self.work / MIB:.1f} MiB over {link.why}"
                            + (f"; {self.resumed / MIB:.1f} MiB already here from an interrupted transfer"
                               if self.resumed else ""))
            self.hq: "queue.Queue[Optional[_Ranged]]" = queue.Queue()
            hasher = threading.Thread(target=self._hasher, daemon=True)
            hasher.start()
            for r in self.ranged.values():  # resumed prefixes (and files whose pieces all landed)
                if r.prefix:
                    self.hq.put(r)
            batches = self._batches(n) if self.work else []
            self.pool = _Pool(len(batches))  # (the batches are the streams: a small rsync group rides along)
            self.aborted = False
            try:
                self.pool.run(batches, self._run_batch)
            except BaseException:
                self.aborted = True  # (the hasher stops at once; the pieces done stay recorded)
                raise
            finally:
                self.hq.put(None)
                hasher.join()
            self.note_refused(self.pool, len(batches))
            self.meter.finish()
        finally:
            self.close()
            for s in self.spares:
                s.kill()
        for r in self.ranged.values():
            if r.failed and r.entry.rel not in self.changed:
                self.changed.append(r.entry.rel)
            elif not r.finished and not r.failed:
                self.changed.append(r.entry.rel)
        dt = time.perf_counter() - t0
        self.report = {"streams": link.streams, "why": link.why, "rtt_ms": round(link.rtt * 1000, 2),
                       "one_stream_mib_s": round(link.one_stream / MIB, 1) if link.one_stream else None,
                       "bytes": self.work, "resumed_bytes": self.resumed, "seconds": round(dt, 3),
                       "refused": self.pool.refused if self.work else 0, "hashed": self.hashed,
                       "changed": sorted(self.changed)}
        return self.report

    # -- workers ------------------------------------------------------------------------------
    def _run_batch(self, b: Batch) -> None:
        if b.kind == "rsync":
            self.run_rsync(b, self.t.remote_spec(self.remote.rstrip("/") + "/"), str(self.local) + "/",
                           self.meter, force=self.force, bwlimit=self.bwlimit)
        else:
            self._run_pieces(b)

    def _script(self, pieces: list[Piece]) -> bytes:
        lines = [f"cd {shlex.quote(self.remote)} || exit 3"]
        for p in pieces:
            lines.append(f"dd if={shlex.quote(p.rel)} bs={MIB} skip={p.offset // MIB} "
                         f"count={max(1, math.ceil(p.length / MIB))} 2>/dev/null; printf '#%d\\n' {p.pid}")
        return ("\n".join(lines) + "\nexit 0\n").encode()

    def _run_pieces(self, b: Batch) -> None:
        pieces = [p for p in b.items if not self.ranged[p.rel].failed]
        if not pieces:
            return
        with self.spares_lock:
            stream = self.spares.pop(0) if self.spares else None
        stream = stream or _Stream(self.argv("exec sh -s"))
        proc, err = stream.proc, stream.err
        self.pool.track(proc)
        script = self._script(pieces)

        def feed():
            try:
                proc.stdin.write(script)
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass

        threading.Thread(target=feed, daemon=True).start()
        out = proc.stdout
        buf = bytearray(MIB)
        view = memoryview(buf)
        got_any = False
        k = 0
        try:
            stream.ready.wait()
            ready = stream.said
            if ready != _Stream.READY:  # the connection did not come up (or the shell is not sh-like)
                rc = proc.wait()
                text = err.text()
                if self.pool.stop.is_set():
                    raise SpecopsError("stopped")
                if not ready and rc == 255 and _REFUSED.search(text):
                    raise _Refused(_last_line(text, rc))
                raise SpecopsError(f"a transfer stream to {self.t.host.name} failed to start: "
                                   f"{_last_line(text, rc) if rc else repr(ready[:40])}")
            got_any = True  # (it came up: whatever happens now is not a refusal)
            while k < len(pieces):
                p = pieces[k]
                r = self.ranged[p.rel]
                if r.failed:  # another stream saw this file change: skip its bytes
                    status = self._recv(out, p, None, view)
                else:
                    fd = os.open(r.part, os.O_RDWR | os.O_CREAT, 0o600)
                    try:
                        status = self._recv(out, p, fd, view)
                    finally:
                        os.close(fd)
                got_any = got_any or status != "eof0"
                if status == "ok":
                    if not r.failed and r.mark(p.index):
                        self.hq.put(r)
                    k += 1
                    continue
                # the stream ended or lost its framing
                if status == "desync":
                    proc.kill()
                rc = proc.wait()
                text = err.text()
                if self.pool.stop.is_set():
                    raise SpecopsError("stopped")
                if status == "eof0" and not got_any and rc == 255 and _REFUSED.search(text):
                    raise _Refused(_last_line(text, rc))
                if status == "desync" or (rc == 0 and status.startswith("eof")):
                    r.discard(f"changed on {self.t.host.name} during the transfer")
                    rest = [q for q in pieces[k + 1:] if q.rel != p.rel]
                    raise _Lost(Batch("pieces", rest, sum(q.length for q in rest)) if rest else None,
                                f"{p.rel} changed on the host during the transfer")
                if rc == 3:
                    raise SpecopsError(f"no directory {self.remote} on {self.t.host.name}")
                rest = pieces[k:]
                raise _Lost(Batch("pieces", rest, sum(q.length for q in rest)),
                            f"stream to {self.t.host.name} lost ({_last_line(text, rc)})")
            rc = proc.wait()
            if rc not in (0,) and not self.pool.stop.is_set():
                raise _Lost(None, _last_line(err.text(), rc))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self.pool.untrack(proc)

    def _recv(self, out, p: Piece, fd: Optional[int], view: memoryview) -> str:
        """Read one piece (and its marker) from the stream: ok, eof0 (nothing at all), eof, desync."""
        left, off = p.length, p.offset
        first = True
        while left:
            n = out.readinto(view[:min(left, len(view))])
            if not n:
                return "eof0" if first and left == p.length else "eof"
            first = False
            if fd is not None:
                os.pwrite(fd, view[:n], off)
            off += n
            left -= n
            self.meter.add(n)
            self.limiter.take(n)
        want = b"#%d\n" % p.pid
        got = _read_exact(out, len(want))
        if len(got) < len(want):
            return "eof" if p.length or got else "eof0"
        return "ok" if got == want else "desync"

    def _hasher(self) -> None:
        """Follows each file's contiguous prefix; finalizes a file when its last piece is hashed."""
        buf = 4 * MIB
        while True:
            r = self.hq.get()
            if r is None:
                if self.aborted:
                    return
                # the pool is done: hash whatever is left of every file whose pieces all landed
                for rr in self.ranged.values():
                    if not rr.finished and not rr.failed and len(rr.done) == rr.npieces:
                        self._hash_to(rr, rr.entry.size, buf)
                return
            if r.finished or r.failed:
                continue
            self._hash_to(r, r.ready_bytes(), buf)

    def _hash_to(self, r: _Ranged, upto: int, buf: int) -> None:
        try:
            if r.hashed < upto:
                with open(r.part, "rb") as f:
                    f.seek(r.hashed)
                    while r.hashed < upto:
                        chunk = f.read(min(buf, upto - r.hashed))
                        if not chunk:
                            break
                        r.sha.update(chunk)
                        r.hashed += len(chunk)
            if r.hashed == r.entry.size and len(r.done) == r.npieces and not r.failed:
                self._finalize(r)
        except OSError as e:
            r.discard(f"cannot read back {r.part}: {e.strerror}")

    def _finalize(self, r: _Ranged) -> None:
        e = r.entry
        os.truncate(r.part, e.size)  # (a piece never writes past the end; this makes sure)
        os.chmod(r.part, e.mode & 0o777 or 0o644)
        os.utime(r.part, ns=(e.mtime_ns, e.mtime_ns))
        os.replace(r.part, r.final)
        r.side.unlink(missing_ok=True)
        r.finished = True
        self.hashed[e.rel] = r.sha.hexdigest()


def _local_entry(p: Path) -> Optional[Entry]:
    try:
        st = p.lstat()
    except OSError:
        return None
    kind = "f" if stat.S_ISREG(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "o"
    return Entry("", st.st_size, st.st_mtime_ns, st.st_mode & 0o7777, kind)


def download(t, remote_dir: str, local_dir, **kw) -> dict:
    """Make local_dir hold remote_dir's files; the report (streams, bytes, hashed, changed)."""
    return Download(t, remote_dir, local_dir, **kw).run()


# -- uploads ----------------------------------------------------------------------------------------

@dataclass
class Range:
    rel: str          # the target, relative to the remote root
    index: int
    offset: int       # where the bytes still to send start, in the local file
    length: int       # bytes still to send
    part: str         # the host's part file, relative to the remote root


class Upload(_Session):
    """local files -> the host: a tree (local_dir -> remote_dir) or one file (put)."""

    def __init__(self, t, local_dir, remote_dir: str, *, files: Optional[dict[str, Path]] = None,
                 delete: bool = False, force: bool = False, streams: Optional[int] = None, bwlimit: int = 0,
                 on_progress: Optional[Progress] = None, what: str = "upload", link: Optional[LinkCheck] = None):
        super().__init__(t, streams=streams, on_progress=on_progress, what=what, link=link)
        self.bwlimit = bwlimit
        self.local = Path(local_dir) if local_dir is not None else None
        self.remote = t.expand(remote_dir).rstrip("/") or "/"
        self.delete, self.force = delete, force
        try:
            if files is not None:  # put(): given files, always sent
                self.sources = files
                mine = {rel: _local_entry(p) for rel, p in files.items()}
                mine = {rel: Entry(rel, e.size, e.mtime_ns, e.mode, e.kind) for rel, e in mine.items() if e}
            else:
                mine = local_listing(self.local)
                self.sources = {rel: self.local / rel for rel in mine}
            self.mine = mine
            self.theirs = remote_listing(t, self.remote, missing_ok=True, mkdir=True)
            self.rsync = remote_has_rsync(t)
            self._plan()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def key(e: Entry) -> str:
        return hashlib.sha1(f"{e.rel}\0{e.size}\0{e.mtime_ns}\0{UP_RANGE}".encode()).hexdigest()[:16]

    def _plan(self) -> None:
        small, big = [], []
        for rel, e in sorted(self.mine.items()):
            if _skipped(rel):
                continue
            if e.kind == "d":  # an empty directory: rsync makes it
                if rel not in self.theirs and self.local is not None:
                    small.append(e)
                continue
            if not self.force and _same(self.theirs.get(rel), e):
                continue
            (big if e.kind == "f" and e.size >= RANGE_MIN else small).append(e)
        if not self.rsync or self.local is None:  # no rsync, or put(): every regular file as ranges
            big += [e for e in small if e.kind == "f"]
            small = []
        self.small, self.big = small, big
        self.ranges: list[Range] = []
        self.resumed = 0
        self.stale: list[str] = []
        self.oversized: list[str] = []  # (a part longer than its range: an interrupted join; sent again)
        wanted: set[str] = set()
        for e in big:
            d = e.rel.rpartition("/")[0]
            k = self.key(e)
            for i in range(max(1, math.ceil(e.size / UP_RANGE))):
                start = i * UP_RANGE
                length = max(0, min(UP_RANGE, e.size - start))
                part = (f"{d}/" if d else "") + f"{UP_PREFIX}{k}.{i}"
                wanted.add(part)
                have = self.theirs.get(part)
                done = have.size if have is not None and have.kind == "f" and have.size <= length else 0
                if have is not None and have.size > length:
                    self.oversized.append(part)
                self.resumed += done
                if length - done or (e.size == 0):
                    self.ranges.append(Range(e.rel, i, start + done, length - done, part))
        # parts of other versions (or of files no longer sent): removed when the upload ends
        self.stale += [rel for rel in self.theirs if rel.rpartition("/")[2].startswith(UP_PREFIX)
                       and rel not in wanted]
        self.work = sum(r.length for r in self.ranges) + sum(e.size for e in small)

    def _batches(self, n: int) -> list[Batch]:
        per = max(self.work / n, 1)
        small_bytes = sum(e.size for e in self.small)
        gslots = round(small_bytes / per) if self.ranges else n
        groups = [Batch("rsync", []) for _ in range(min(max(1, gslots), len(self.small)))] if self.small else []
        for e in sorted(self.small, key=lambda e: -e.size):
            b = min(groups, key=lambda b: b.bytes)
            b.items.append(e)
            b.bytes += e.size
        p = max(1, n - gslots) if self.ranges else 0
        stripes = [Batch("ranges", []) for _ in range(min(p, len(self.ranges)))]
        for i, r in enumerate(self.ranges):
            b = stripes[i % len(stripes)]
            b.items.append(r)
            b.bytes += r.length
        return groups + stripes

    def run(self) -> dict:
        t0 = time.perf_counter()
        link = None
        try:
            units = len(self.ranges) + (min(len(self.small), MAX_STREAMS) if self.small else 0)
            link = self.decide(self.work, max(1, units))
            n = link.streams
            self.meter = _Meter(self.work, self.on_progress)
            self.limiter = _Limiter(self.bwlimit)
            if self.work:
                self.t.note(f"{self.what}: {self.work / MIB:.1f} MiB over {link.why}"
                            + (f"; {self.resumed / MIB:.1f} MiB already on the host from an interrupted upload"
                               if self.resumed else ""))
            if self.oversized:
                self.t.check(f"cd {shlex.quote(self.remote)} && rm -f " + " ".join(map(shlex.quote, self.oversized)),
                             "removing parts of an interrupted join")
            digests: dict[str, str] = {}
            hasher = threading.Thread(target=lambda: digests.update(
                {e.rel: _sha256(self.sources[e.rel]) for e in self.big}), daemon=True)
            hasher.start()
            batches = self._batches(n) if self.work else []
            self.pool = _Pool(len(batches))
            self.pool.run(batches, self._run_batch)
            hasher.join()
            self.note_refused(self.pool, len(batches))
            self._join(digests)
            self.meter.finish()
        finally:
            self.close()
        return {"streams": link.streams, "why": link.why, "rtt_ms": round(link.rtt * 1000, 2),
                "bytes": self.work, "resumed_bytes": self.resumed, "seconds": round(time.perf_counter() - t0, 3),
                "refused": self.pool.refused if self.work else 0}

    def _run_batch(self, b: Batch) -> None:
        if b.kind == "rsync":
            self.run_rsync(b, str(self.local) + "/", self.t.remote_spec(self.remote.rstrip("/") + "/"),
                           self.meter, force=self.force, bwlimit=self.bwlimit)
        else:
            self._run_ranges(b)

    def _run_ranges(self, b: Batch) -> None:
        lines = [f"cd {shlex.quote(self.remote)} || exit 3"]
        dirs = sorted({r.part.rpartition("/")[0] for r in b.items} - {""})
        if dirs:
            lines.append("mkdir -p " + " ".join(shlex.quote(d) for d in dirs) + " || exit 4")
        # head -c reads exactly N bytes of a pipe (coreutils, busybox): each range appends to its part
        lines += [f"head -c {r.length} >> {shlex.quote(r.part)} || exit 5" for r in b.items]
        lines.append("echo specops-upload-ok")
        proc = subprocess.Popen(self.argv(f"sh -c {shlex.quote(chr(10).join(lines))}"), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        self.pool.track(proc)
        err = _Tail(proc.stderr)
        sent_any = False
        k = 0
        try:
            for k, r in enumerate(b.items):
                with open(self.sources[r.rel], "rb") as f:
                    f.seek(r.offset)
                    left = r.length
                    while left:
                        chunk = f.read(min(MIB, left))
                        if not chunk:
                            raise SpecopsError(f"{self.sources[r.rel]} shrank during the upload: run it again")
                        proc.stdin.write(chunk)
                        sent_any = True
                        left -= len(chunk)
                        self.meter.add(len(chunk))
                        self.limiter.take(len(chunk))
            proc.stdin.close()
            out = proc.stdout.read()
            rc = proc.wait()
        except (BrokenPipeError, OSError):
            rc = proc.wait()
            out = b""
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self.pool.untrack(proc)
        if rc == 0 and b"specops-upload-ok" in out:
            return
        text = err.text()
        if self.pool.stop.is_set():
            raise SpecopsError("stopped")
        if rc == 255 and _REFUSED.search(text) and (not sent_any or "kex_exchange" in text):
            raise _Refused(_last_line(text, rc))
        if rc in (3, 4, 5):
            raise SpecopsError(f"upload to {self.t.host.name}:{self.remote} failed: {_last_line(text, rc)}")
        raise _Lost(Batch("ranges", self._rest(b.items[k:])),
                    f"stream to {self.t.host.name} lost ({_last_line(text, rc)})")

    def _rest(self, items: list[Range]) -> list[Range]:
        """What the host holds of these ranges now (it may have some of them): the rest to send."""
        parts = remote_listing(self.t, self.remote, missing_ok=True)
        out = []
        for r in items:
            have = parts.get(r.part)
            start = r.index * UP_RANGE
            full = max(0, min(UP_RANGE, self.mine[r.rel].size - start))
            got = have.size if have is not None and have.size <= full else 0
            if have is not None and have.size > full:
                self.t.run(f"rm -f {shlex.quote(self.remote + '/' + r.part)}")
            if full - got:
                out.append(Range(r.rel, r.index, start + got, full - got, r.part))
        return out

    def _join(self, digests: dict[str, str]) -> None:
        """Join each big file's parts on the host, check its sha256 there, move it into place."""
        blocks, bad = [], []
        for e in self.big:
            d = e.rel.rpartition("/")[0]
            k = self.key(e)
            parts = [(f"{d}/" if d else "") + f"{UP_PREFIX}{k}.{i}" for i in range(max(1, math.ceil(e.size / UP_RANGE)))]
            first, rest = parts[0], parts[1:]
            q = shlex.quote
            stamp = time.strftime("%Y%m%d%H%M.%S", time.gmtime(e.mtime_ns // 10**9))
            blocks.append(
                f"touch {q(first)} && " + (f"cat {' '.join(q(p) for p in rest)} >> {q(first)} && rm -f "
                                            f"{' '.join(q(p) for p in rest)} && " if rest else "")
                + f"h=$( {{ sha256sum || shasum -a 256; }} < {q(first)} 2>/dev/null | cut -c1-64) && "
                f"if [ \"$h\" = {digests[e.rel]} ]; then chmod {oct(e.mode & 0o777 or 0o644)[2:]} {q(first)} && "
                f"TZ=UTC0 touch -m -t {stamp} {q(first)} && mv -f {q(first)} {q(e.rel)} && echo \"ok\"; "
                f"else rm -f {q(first)}; echo \"bad $h\"; fi || echo failed")
        for i in range(0, len(blocks), 64):
            chunk = blocks[i:i + 64]
            r = self.t.run(f"cd {shlex.quote(self.remote)} || exit 3\n" + "\n".join(chunk))
            said = [w.strip() for w in r.stdout.splitlines() if w.strip()]
            for e, ln in zip(self.big[i:i + 64], said + ["failed"] * (len(chunk) - len(said))):
                if ln != "ok":
                    bad.append(f"{e.rel} ({ln})")
        if self.stale:
            self.t.run(f"cd {shlex.quote(self.remote)} && rm -f " + " ".join(shlex.quote(p) for p in self.stale))
        if bad:
            raise SpecopsError(f"upload to {self.t.host.name}: {len(bad)} file(s) differ from the laptop's sha256 "
                               f"after joining their parts ({', '.join(bad[:3])}): run it again")


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(4 * MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def upload(t, local_dir, remote_dir: str, **kw) -> dict:
    return Upload(t, local_dir, remote_dir, **kw).run()


def upload_file(t, local: str, remote: str, **kw) -> dict:
    """One file to an exact host path (put), always sent."""
    remote = t.expand(remote)
    d, _, name = remote.rpartition("/")
    return Upload(t, None, d or "/", files={name: Path(local)}, force=True, **kw).run()
