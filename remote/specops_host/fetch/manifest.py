"""sha256 manifest of a directory on this host (for verified fetches).

Launch (what `inv fetch` sends, from the host workdir):
    <venv>/bin/python3 -m specops_host.fetch.manifest runs/RUN_ID

Hashes are cached in DIR/.specops-hashes.json keyed by (size, mtime_ns, ctime_ns), so an unchanged
directory is answered without reading its files again. One payload: {"files": {rel: {...}}}.
"""

import hashlib
import json
import os
import re
import sys
from pathlib import Path

from specops_host.contract import Refused, emit, write_json

CACHE = ".specops-hashes.json"
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def valid_entry(c):
    """A cache entry as manifest() writes it (anything else is ignored: the file is hashed again)."""
    return (isinstance(c, dict) and all(type(c.get(k)) is int for k in ("size", "mtime_ns", "ctime_ns"))
            and isinstance(c.get("sha256"), str) and bool(SHA256.match(c["sha256"])))


KEY = ("size", "mtime_ns", "ctime_ns")


def entry(st, digest=None):
    """A cache entry's key fields from os.stat (ctime moves on every write and cannot be set back,
    unlike mtime: part of the key)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "sha256": digest}


def read_cache(path):
    """A hash cache as a dict; a missing or corrupt one is empty (it only costs hashing again)."""
    try:
        cache = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return cache if isinstance(cache, dict) else {}


def write_cache(path, cache):
    """Write the cache whole (temp + rename); a read-only folder keeps its old one."""
    try:
        write_json(path, cache, indent=None)
    except OSError:
        pass


def sha256(path, bufsize=4 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                return h.hexdigest()
            h.update(b)


def manifest(root, cache_name=CACHE, workers=4):
    """{rel: {"size", "mtime_ns", "ctime_ns", "sha256"}} for every regular file under root
    (cache excluded); files not in the cache are hashed by a thread pool."""
    from concurrent.futures import ThreadPoolExecutor

    root = Path(root)
    cache_path = root / cache_name
    cache = read_cache(cache_path)
    out, todo = {}, []
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".rsync")]
        for name in files:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if rel == cache_name or name.startswith(".specops-") or not p.is_file():
                continue
            st = p.stat()
            c, e = cache.get(rel), entry(st)
            if valid_entry(c) and all(c[k] == e[k] for k in KEY):
                out[rel] = c
            else:
                out[rel] = e
                todo.append((rel, p))
    with ThreadPoolExecutor(max(1, workers)) as pool:  # hashlib releases the GIL
        for (rel, _), digest in zip(todo, pool.map(lambda rp: sha256(rp[1]), todo)):
            out[rel]["sha256"] = digest
    write_cache(cache_path, out)
    return out


def seed(root, hashed, cache_name=CACHE):
    """Record digests computed elsewhere (on arrival of a fetched file) in root's cache, keyed
    like manifest()'s entries by the files' size, mtime and ctime now: a later change to a file
    makes it hashed again."""
    root = Path(root)
    cache = read_cache(root / cache_name)
    for rel, digest in hashed.items():
        try:
            cache[rel] = entry((root / rel).stat(), digest)
        except OSError:
            continue
    write_cache(root / cache_name, cache)


def main():
    if len(sys.argv) != 2 or not sys.argv[1]:
        raise Refused(f"manifest.py takes one argument, the directory to hash (got {len(sys.argv) - 1})")
    d = sys.argv[1]
    if not os.path.isdir(d):
        emit({"ok": False, "error": f"no directory {d} on this host"})
        return 1
    emit({"ok": True, "root": os.path.abspath(d), "files": manifest(d)})
    return 0


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
