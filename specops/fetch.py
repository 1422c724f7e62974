"""fetch: pull a run directory back, incremental, resumable and verified.

Bulk transfer rides OpenSSH rsync with the host's SSH parameters (``--partial``: an
interrupted transfer continues where it stopped); SFTP where rsync is missing. Afterwards the
host computes a sha256 manifest (remote/manifest.py, cached by size+mtime) and every local
file is checked against it; a mismatch (say, a checkpoint still being written) is fetched
again, up to ``tries`` times.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
import json
import sys
from pathlib import Path
from typing import Optional

from . import paths
from .errors import SpecopsError
from .jobs import run_path, validate_run_id
from .remote_exec import run_script
from .transport import Transport


def _manifest_module():
    sys.path.insert(0, str(paths.REMOTE_DIR))
    try:
        spec = importlib.util.spec_from_file_location("specops_remote_manifest", paths.REMOTE_DIR / "manifest.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(paths.REMOTE_DIR))


def local_manifest(root: Path) -> dict:
    """The same manifest, on the laptop side (own cache file)."""
    return _manifest_module().manifest(root, cache_name=".specops-local-hashes.json")


def remote_manifest(t: Transport, remote_dir: str) -> dict:
    res = run_script(t, "manifest", [remote_dir], changes=False)
    if not res.get("ok"):
        raise SpecopsError(f"fetch: {res.get('error')}")
    return res["files"]


def diff(remote: dict, local: dict) -> list[str]:
    return sorted(rel for rel, r in remote.items()
                  if not rel.startswith(".specops") and rel != "fetch-manifest.json"
                  and (rel not in local or local[rel]["sha256"] != r["sha256"]))


def check_writable(dest: Path) -> None:
    """Create dest and write a probe file there, or say in one line why not."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
        probe = dest / ".specops-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise SpecopsError(f"fetch: local destination {dest} is not writable ({e.strerror}): "
                           f"choose another --dest or fix its permissions") from None


def fetch_dir(t: Transport, remote_dir: str, dest: Path, *, tries: int = 3, bwlimit: int = 0,
              progress: bool = False) -> dict:
    """rsync, then verify every file against the host's sha256 manifest. The host hashes while
    rsync transfers (its cache makes an unchanged file free); an unchanged re-fetch compares the
    two cached manifests and sends nothing."""
    check_writable(dest)
    t.ensure_pushed()  # (before the manifest thread, which shares this connection)
    had_files = any(p.is_file() for p in dest.rglob("*") if not p.name.startswith(".specops"))
    pool = ThreadPoolExecutor(1)
    try:
        pending = pool.submit(remote_manifest, t, remote_dir)
        if had_files and not diff(pending.result(), local_manifest(dest)):
            return _done(dest, pending.result(), 0)
        bad: list[str] = []
        for attempt in range(1, tries + 1):
            t.sync_down(remote_dir, str(dest), partial=True, progress=progress and attempt == 1,
                        checksum=attempt > 1, bwlimit=bwlimit)
            local = local_manifest(dest)
            remote = pending.result()
            bad = diff(remote, local)
            if bad:  # the host may have changed files since it hashed them: hash again, then judge
                remote = remote_manifest(t, remote_dir)
                bad = diff(remote, local)
            if not bad:
                return _done(dest, remote, attempt)
            t.note(f"fetch: {len(bad)} file(s) differ from the host's checksums (still being written?): "
                   f"{', '.join(bad[:3])}; fetching again", "warn")
            pending = pool.submit(remote_manifest, t, remote_dir)
    finally:
        pool.shutdown(wait=True)
    raise SpecopsError(f"fetch: {len(bad)} file(s) still differ after {tries} attempts ({', '.join(bad[:3])}): "
                       f"is the run still writing them? retry when it has stopped")


def _done(dest: Path, remote: dict, attempts: int) -> dict:
    (dest / "fetch-manifest.json").write_text(json.dumps(
        {rel: f["sha256"] for rel, f in sorted(remote.items()) if not rel.startswith(".specops")}, indent=1))
    return {"files": len(remote), "bytes": sum(f["size"] for f in remote.values()), "attempts": attempts,
            "dest": str(dest)}


def fetch(t: Transport, run_id: Optional[str], dest: str = "runs", *, bwlimit: int = 0, node: bool = False,
          progress: bool = False) -> dict:
    """`inv fetch`: a run (default: the newest) into dest/<run id>/ (a group's node: into
    dest/<run id>/nodes/<host>/), verified; then metrics.jsonl/png from it (not for a node)."""
    from . import jobs, metrics

    rid = run_id or jobs.get(t, None).run_id
    into = Path(dest) / rid / "nodes" / t.host.name if node else None
    res = fetch_run(t, rid, dest, bwlimit=bwlimit, into=into, progress=progress and not node)
    return {**res, "run_id": rid, "metrics": None if node else metrics.write(Path(res["dest"]))}


def fetch_run(t: Transport, run_id: str, dest: str = "runs", *, tries: int = 3, bwlimit: int = 0,
              into: Optional[Path] = None, progress: bool = False) -> dict:
    validate_run_id(run_id)
    remote = run_path(t, run_id)
    if not t.exists(remote, "-d"):
        raise SpecopsError(f"fetch: unknown run id {run_id!r} on {t.host.name} (no {remote}): "
                           f"`{t.hint('status')}` lists the runs")
    return fetch_dir(t, remote, into or Path(dest) / run_id, tries=tries, bwlimit=bwlimit, progress=progress)
