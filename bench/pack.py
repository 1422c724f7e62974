"""Pack a run's raw output (logs, JSON, records) into one compressed file, or list/read one.

    python3 bench/pack.py DIR ARCHIVE.tar.xz            # DIR's files under DIR's own name
    python3 bench/pack.py --files ARCHIVE.tar.xz F...   # loose files, each by its name
    python3 bench/pack.py --list ARCHIVE.tar.xz
    python3 bench/pack.py --cat ARCHIVE.tar.xz MEMBER   # one member to stdout

Raw output stays out of the tracked tree: write it under bench/out/ (ignored by git), then pack it
into bench/results/raw/ and cite `ARCHIVE: MEMBER` from the results table. The
archive's members are sorted, owned by 0, and all carry one mtime (--mtime, else the newest file's):
with --mtime fixed, packing the same files again gives the same bytes. Standard library only
(tarfile + lzma).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))  # bench/inspect.py would shadow the stdlib's
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import io  # noqa: E402
import tarfile  # noqa: E402
from pathlib import Path  # noqa: E402


def _info(path: Path, name: str, mtime: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size = path.stat().st_size
    ti.mtime = mtime
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def pack(members: dict, archive: Path, mtime: int | None = None) -> int:
    """members: {member name: file}; writes archive (xz, preset 9); returns the member count."""
    if mtime is None:
        mtime = int(max((p.stat().st_mtime for p in members.values()), default=0))
    archive.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9, format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            with open(members[name], "rb") as f:
                tar.addfile(_info(members[name], name, mtime), f)
    archive.write_bytes(buf.getvalue())
    return len(members)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list ARCHIVE's members")
    ap.add_argument("--cat", action="store_true", help="print one member of ARCHIVE")
    ap.add_argument("--files", action="store_true", help="pack loose files, each under its own name")
    ap.add_argument("--mtime", type=int, default=None, help="every member's mtime (epoch seconds)")
    ap.add_argument("args", nargs="+")
    a = ap.parse_args()
    if a.list or a.cat:
        with tarfile.open(a.args[0]) as tar:
            if a.list:
                for m in tar.getmembers():
                    print(f"{m.size:>10}  {m.name}")
                return 0
            sys.stdout.buffer.write(tar.extractfile(a.args[1]).read())
            return 0
    if a.files:
        archive, files = Path(a.args[0]), [Path(f) for f in a.args[1:]]
        members = {f.name: f for f in files}
    else:
        src, archive = Path(a.args[0]), Path(a.args[1])
        members = {str(Path(src.name) / p.relative_to(src)): p for p in src.rglob("*") if p.is_file()}
    n = pack(members, archive, a.mtime)
    print(f"{archive}: {n} files, {archive.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
