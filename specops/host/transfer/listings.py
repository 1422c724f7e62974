"""What is where: the host's and the laptop's file listings (size, mtime, mode), compared.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from specops.errors import SpecopsError


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
    r = t.fact(cmd)
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


def _local_entry(p: Path) -> Optional[Entry]:
    try:
        st = p.lstat()
    except OSError:
        return None
    kind = "f" if stat.S_ISREG(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "o"
    return Entry("", st.st_size, st.st_mtime_ns, st.st_mode & 0o7777, kind)
