"""Downloads: pieces of large files over several streams, small ones in rsync groups; resumable,
verified on arrival.
"""

from __future__ import annotations

import shlex
import hashlib
import json
import math
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

from specops.errors import SpecopsError
from specops.host.transfer import tuning
from specops.host.transfer.listings import Entry, _local_entry, _same, remote_has_rsync, remote_listing
from specops.host.transfer.streams import (Batch, LinkCheck, _Limiter, _Lost, _Meter, _Pool, _Refused, _Session, _Tail,
                                           _last_line, _pipe_size)


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
        self.part = final.parent / f"{tuning.PART_PREFIX}{name}"
        self.side = final.parent / f"{tuning.PART_PREFIX}{name}.json"
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
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdout: IO[bytes] = self.proc.stdout
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
            c = self.stdout.read(1)
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
                 streams: Optional[int] = None, bwlimit: int = 0, on_progress: Optional[tuning.Progress] = None,
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
            if tuning._skipped(rel) or (self.only is not None and rel not in self.only):
                continue
            lp = self.local / rel
            if e.kind == "d":
                lp.mkdir(parents=True, exist_ok=True)
                continue
            if not (self.force and self.only is not None) and _same(_local_entry(lp), e):
                continue
            (big if e.kind == "f" and e.size >= tuning.RANGE_MIN else small).append(e)
        forced = bool(self.force and self.only is not None)
        self.has_big = bool(big)
        self.ranged: dict[str, _Ranged] = {}
        for e in big:
            lp = self.local / e.rel
            lp.parent.mkdir(parents=True, exist_ok=True)
            piece = max(tuning.PIECE, math.ceil(e.size / 2048 / tuning.MIB) * tuning.MIB)
            self.ranged[e.rel] = _Ranged(lp, e, piece, fresh=forced)
        # A few small files (a run's logs and configs) ride the piece streams, one piece each: no
        # connection and rsync start of their own. Many of them (or no rsync): rsync groups.
        regular = [e for e in small if e.kind == "f"]
        if small and (not self.rsync or (len(regular) == len(small) and len(small) <= tuning.FEW_SMALL
                                         and sum(e.size for e in small) <= tuning.FEW_SMALL_BYTES)):
            for e in regular:
                lp = self.local / e.rel
                lp.parent.mkdir(parents=True, exist_ok=True)
                self.ranged[e.rel] = _Ranged(lp, e, max(tuning.MIB, math.ceil(e.size / tuning.MIB) * tuning.MIB),
                                             fresh=True)
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
            units = max(1, len(self.pieces) + (min(len(self.small), tuning.MAX_STREAMS) if self.small else 0))
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
                self.t.note(f"{self.what}: {self.work / tuning.MIB:.1f} MiB over {link.why}"
                            + (f"; {self.resumed / tuning.MIB:.1f} MiB already here from an interrupted transfer"
                               if self.resumed else ""))
            self.hq: "queue.Queue[Optional[_Ranged]]" = queue.Queue()
            hasher = threading.Thread(target=self._hasher, daemon=True)
            hasher.start()
            for r in self.ranged.values():  # resumed prefixes (and files whose pieces all landed)
                if r.prefix:
                    self.hq.put(r)
            batches = self._batches(n) if self.work else []
            self.pool = _Pool(len(batches),
                              self.t.host.name)  # (the batches are the streams: a small rsync group rides along)
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
                       "one_stream_mib_s": round(link.one_stream / tuning.MIB, 1) if link.one_stream else None,
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
            lines.append(f"dd if={shlex.quote(p.rel)} bs={tuning.MIB} skip={p.offset // tuning.MIB} "
                         f"count={max(1, math.ceil(p.length / tuning.MIB))} 2>/dev/null; printf '#%d\\n' {p.pid}")
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
        buf = bytearray(tuning.MIB)
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
                if not ready and rc == 255 and tuning._REFUSED.search(text):
                    raise _Refused(_last_line(text, rc))
                if rc == 255:  # (ssh's own failure: the link, not the host's shell)
                    raise SpecopsError(f"connection to {self.t.host.name} lost: a transfer stream could not start "
                                       f"({_last_line(text, rc)}): run it again, it resumes")
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
                if status == "eof0" and not got_any and rc == 255 and tuning._REFUSED.search(text):
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
        buf = 4 * tuning.MIB
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


def download(t, remote_dir: str, local_dir, **kw) -> dict:
    """Make local_dir hold remote_dir's files; the report (streams, bytes, hashed, changed)."""
    return Download(t, remote_dir, local_dir, **kw).run()
