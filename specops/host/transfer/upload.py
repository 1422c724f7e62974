"""Uploads: the same the other way; ranges joined on the host, its sha256 checked before the
file moves into place.
"""

from __future__ import annotations

import hashlib
import math
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specops.errors import SpecopsError
from specops.host.transfer import tuning
from specops.host.transfer.listings import Entry, _local_entry, _same, local_listing, remote_has_rsync, remote_listing
from specops.host.transfer.streams import (Batch, LinkCheck, _Limiter, _Lost, _Meter, _Pool, _Refused, _Session, _Tail,
                                           _last_line)


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
                 on_progress: Optional[tuning.Progress] = None, what: str = "upload", link: Optional[LinkCheck] = None):
        super().__init__(t, streams=streams, on_progress=on_progress, what=what, link=link)
        self.bwlimit = bwlimit
        self.local = Path(local_dir) if local_dir is not None else None
        self.remote = t.expand(remote_dir).rstrip("/") or "/"
        self.delete, self.force = delete, force
        try:
            mine: dict[str, Entry]
            if files is not None:  # put(): given files, always sent
                self.sources = files
                found = {rel: _local_entry(p) for rel, p in files.items()}
                mine = {rel: Entry(rel, e.size, e.mtime_ns, e.mode, e.kind) for rel, e in found.items() if e}
            else:
                local = Path(local_dir)
                mine = local_listing(local)
                self.sources = {rel: local / rel for rel in mine}
            self.mine = mine
            self.theirs = remote_listing(t, self.remote, missing_ok=True, mkdir=True)
            self.rsync = remote_has_rsync(t)
            self._plan()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def key(e: Entry) -> str:
        return hashlib.sha1(f"{e.rel}\0{e.size}\0{e.mtime_ns}\0{tuning.UP_RANGE}".encode()).hexdigest()[:16]

    def _plan(self) -> None:
        small: list[Entry] = []
        big: list[Entry] = []
        for rel, e in sorted(self.mine.items()):
            if tuning._skipped(rel):
                continue
            if e.kind == "d":  # an empty directory: rsync makes it
                if rel not in self.theirs and self.local is not None:
                    small.append(e)
                continue
            if not self.force and _same(self.theirs.get(rel), e):
                continue
            (big if e.kind == "f" and e.size >= tuning.RANGE_MIN else small).append(e)
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
            for i in range(max(1, math.ceil(e.size / tuning.UP_RANGE))):
                start = i * tuning.UP_RANGE
                length = max(0, min(tuning.UP_RANGE, e.size - start))
                part = (f"{d}/" if d else "") + f"{tuning.UP_PREFIX}{k}.{i}"
                wanted.add(part)
                have = self.theirs.get(part)
                done = have.size if have is not None and have.kind == "f" and have.size <= length else 0
                if have is not None and have.size > length:
                    self.oversized.append(part)
                self.resumed += done
                if length - done or (e.size == 0):
                    self.ranges.append(Range(e.rel, i, start + done, length - done, part))
        # parts of other versions (or of files no longer sent): removed when the upload ends
        self.stale += [rel for rel in self.theirs if rel.rpartition("/")[2].startswith(tuning.UP_PREFIX)
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
            units = len(self.ranges) + (min(len(self.small), tuning.MAX_STREAMS) if self.small else 0)
            link = self.decide(self.work, max(1, units))
            n = link.streams
            self.meter = _Meter(self.work, self.on_progress)
            self.limiter = _Limiter(self.bwlimit)
            if self.work:
                self.t.note(f"{self.what}: {self.work / tuning.MIB:.1f} MiB over {link.why}"
                            + (f"; {self.resumed / tuning.MIB:.1f} MiB already on the host from an interrupted upload"
                               if self.resumed else ""))
            if self.oversized:
                self.t.check(f"cd {shlex.quote(self.remote)} && rm -f " + " ".join(map(shlex.quote, self.oversized)),
                             "removing parts of an interrupted join")
            digests: dict[str, str] = {}
            hasher = threading.Thread(target=lambda: digests.update(
                {e.rel: _sha256(self.sources[e.rel]) for e in self.big}), daemon=True)
            hasher.start()
            batches = self._batches(n) if self.work else []
            self.pool = _Pool(len(batches), self.t.host.name)
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
        assert proc.stdin is not None and proc.stdout is not None
        self.pool.track(proc)
        err = _Tail(proc.stderr)
        sent_any = False
        k = 0
        try:
            for k, r in enumerate(b.items):  # noqa: B007  (k: where a lost stream resumes, after the loop)
                with open(self.sources[r.rel], "rb") as f:
                    f.seek(r.offset)
                    left = r.length
                    while left:
                        chunk = f.read(min(tuning.MIB, left))
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
        if rc == 255 and tuning._REFUSED.search(text) and (not sent_any or "kex_exchange" in text):
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
            start = r.index * tuning.UP_RANGE
            full = max(0, min(tuning.UP_RANGE, self.mine[r.rel].size - start))
            got = have.size if have is not None and have.size <= full else 0
            if have is not None and have.size > full:
                self.t.change(f"rm -f {shlex.quote(self.remote + '/' + r.part)}")
            if full - got:
                out.append(Range(r.rel, r.index, start + got, full - got, r.part))
        return out

    def _join(self, digests: dict[str, str]) -> None:
        """Join each big file's parts on the host, check its sha256 there, move it into place."""
        blocks, bad = [], []
        for e in self.big:
            d = e.rel.rpartition("/")[0]
            k = self.key(e)
            n_parts = max(1, math.ceil(e.size / tuning.UP_RANGE))
            parts = [(f"{d}/" if d else "") + f"{tuning.UP_PREFIX}{k}.{i}" for i in range(n_parts)]
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
            r = self.t.change(f"cd {shlex.quote(self.remote)} || exit 3\n" + "\n".join(chunk))
            said = [w.strip() for w in r.stdout.splitlines() if w.strip()]
            for e, ln in zip(self.big[i:i + 64], said + ["failed"] * (len(chunk) - len(said))):
                if ln != "ok":
                    bad.append(f"{e.rel} ({ln})")
        if self.stale:
            self.t.change(f"cd {shlex.quote(self.remote)} && rm -f " + " ".join(shlex.quote(p) for p in self.stale))
        if bad:
            raise SpecopsError(f"upload to {self.t.host.name}: {len(bad)} file(s) differ from the laptop's sha256 "
                               f"after joining their parts ({', '.join(bad[:3])}): run it again")


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(4 * tuning.MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def upload(t, local_dir, remote_dir: str, **kw) -> dict:
    return Upload(t, local_dir, remote_dir, **kw).run()


def upload_file(t, local: str, remote: str, **kw) -> dict:
    """One file to an exact host path (put), always sent."""
    remote = t.expand(remote)
    d, _, name = remote.rpartition("/")
    return Upload(t, None, d or "/", files={name: Path(local)}, force=True, **kw).run()
