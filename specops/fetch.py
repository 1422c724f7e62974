"""fetch: pull a run directory back, incremental, resumable and verified.

Over SSH the bytes move through specops.transfer: several streams when one stream is
window-bound (a long round trip), split by files (rsync groups) and, for large files, by byte
ranges; a killed fetch resumes its pieces; the stream count follows the measured link or
``streams=N``. The host computes a sha256 manifest meanwhile (remote/manifest.py, cached by
size+mtime+ctime) and every local file is checked against it (a file that arrived as pieces was
hashed on arrival: its digest seeds the local cache, so it is not read again); a mismatch (say,
a checkpoint still being written) is fetched again, up to ``tries`` times. The `local` host
copies with rsync, then verifies the same way.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
import json
import os
import sys
from pathlib import Path
from typing import Callable, Optional

from . import paths, transfer
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


LOCAL_CACHE = ".specops-local-hashes.json"


def local_manifest(root: Path) -> dict:
    """The same manifest, on the laptop side (own cache file)."""
    return _manifest_module().manifest(root, cache_name=LOCAL_CACHE)


def seed_local_cache(root: Path, hashed: dict[str, str]) -> None:
    """Record digests computed on arrival in the local manifest's cache (keyed like its entries,
    by size, mtime and ctime now: a later change to a file makes it hashed again)."""
    if not hashed:
        return
    path = root / LOCAL_CACHE
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        cache = {}
    if not isinstance(cache, dict):
        cache = {}
    for rel, digest in hashed.items():
        try:
            st = (root / rel).stat()
        except OSError:
            continue
        cache[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "sha256": digest}
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, path)
    except OSError:
        pass


def remote_manifest(t: Transport, remote_dir: str) -> dict:
    res = run_script(t, "manifest", [remote_dir], changes=False)
    if not res.get("ok"):
        err = str(res.get("error"))
        raise (transfer.NoDirectory if err.startswith("no directory") else SpecopsError)(f"fetch: {err}")
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
              progress: bool = False, streams: Optional[int] = None,
              on_progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Transfer, then verify every file against the host's sha256 manifest. The host hashes while
    the streams run (its cache makes an unchanged file free); an unchanged re-fetch compares the
    two cached manifests and sends nothing. on_progress(done_bytes, total_bytes) follows the
    transfer (from worker threads); without one, progress=True draws a bar."""
    check_writable(dest)
    if not hasattr(t, "ssh_command"):  # the local host
        t.ensure_pushed()
        had_files = any(p.is_file() for p in dest.rglob("*") if not p.name.startswith(".specops"))
        return _fetch_copy(t, remote_dir, dest, tries=tries, bwlimit=bwlimit, progress=progress, had_files=had_files)
    had_files = any(p.is_file() for p in dest.rglob("*") if not p.name.startswith(".specops"))
    # a first fetch measures the link first: its probe (a connection of its own) runs while the
    # push check and the listing go on
    link = None if had_files else transfer.LinkCheck(t, streams)
    pool = ThreadPoolExecutor(1)
    bad: list[str] = []
    try:
        t.ensure_pushed()  # (before the manifest thread, which shares this connection)
        remote: Optional[dict] = None
        if had_files:  # an unchanged re-fetch: two cached manifests, nothing sent, no stream opened
            remote = remote_manifest(t, remote_dir)
            if not diff(remote, local_manifest(dest)):
                return _done(dest, remote, 0)
            link = transfer.LinkCheck(t, streams)
        for attempt in range(1, tries + 1):
            # listing first (this connection), then the host hashes while the streams run
            dl = transfer.Download(t, remote_dir, dest, only=set(bad) if attempt > 1 else None, force=attempt > 1,
                                   streams=streams, bwlimit=bwlimit, what="fetch", link=link)
            pending = pool.submit(remote_manifest, t, remote_dir) if remote is None else None
            with _bar(t, progress and on_progress is None and attempt == 1, dest.name) as sink:
                dl.on_progress = on_progress or sink
                rep = dl.run()
            seed_local_cache(dest, rep["hashed"])
            local = local_manifest(dest)
            if pending is not None:
                remote = pending.result()
            bad = diff(remote, local)
            if bad:  # the host may have changed files since it hashed them: hash again, then judge
                remote = remote_manifest(t, remote_dir)
                bad = diff(remote, local)
            if not bad:
                return _done(dest, remote, attempt, rep)
            t.note(f"fetch: {len(bad)} file(s) differ from the host's checksums (still being written?): "
                   f"{', '.join(bad[:3])}; fetching again", "warn")
            remote = None
    finally:
        if link is not None:
            link.close()
        pool.shutdown(wait=True)
    raise SpecopsError(f"fetch: {len(bad)} file(s) still differ after {tries} attempts ({', '.join(bad[:3])}): "
                       f"is the run still writing them? retry when it has stopped")


def _bar(t: Transport, show: bool, label: str):
    from contextlib import nullcontext

    if not show:
        return nullcontext(None)
    from .ssh import _progress_sink

    return _progress_sink(True, f"{t.host.name}: {label}")


def _fetch_copy(t: Transport, remote_dir: str, dest: Path, *, tries: int, bwlimit: int, progress: bool,
                had_files: bool) -> dict:
    """The local host: a copy (rsync), verified the same way."""
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
            if bad:
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


def _done(dest: Path, remote: dict, attempts: int, rep: Optional[dict] = None) -> dict:
    (dest / "fetch-manifest.json").write_text(json.dumps(
        {rel: f["sha256"] for rel, f in sorted(remote.items()) if not rel.startswith(".specops")}, indent=1))
    out = {"files": len(remote), "bytes": sum(f["size"] for f in remote.values()), "attempts": attempts,
           "dest": str(dest)}
    if rep is not None:  # how the last transfer went (streams, link, bytes moved, resumed)
        out["transfer"] = {k: v for k, v in rep.items() if k not in ("hashed", "changed")}
    return out


def fetch(t: Transport, run_id: Optional[str], dest: str = "runs", *, bwlimit: int = 0, node: bool = False,
          progress: bool = False, streams: Optional[int] = None,
          on_progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """`inv fetch`: a run (default: the newest) into dest/<run id>/ (a group's node: into
    dest/<run id>/nodes/<host>/), verified; then metrics.jsonl/png from it (not for a node).
    streams=N forces the number of streams (default: from the measured link);
    on_progress(done_bytes, total_bytes) follows the transfer."""
    from . import jobs, metrics

    rid = run_id or jobs.get(t, None).run_id
    into = Path(dest) / rid / "nodes" / t.host.name if node else None
    res = fetch_run(t, rid, dest, bwlimit=bwlimit, into=into, progress=progress and not node, streams=streams,
                    on_progress=on_progress)
    return {**res, "run_id": rid, "metrics": None if node else metrics.write(Path(res["dest"]))}


def fetch_run(t: Transport, run_id: str, dest: str = "runs", *, tries: int = 3, bwlimit: int = 0,
              into: Optional[Path] = None, progress: bool = False, streams: Optional[int] = None,
              on_progress: Optional[Callable[[int, int], None]] = None) -> dict:
    validate_run_id(run_id)
    remote = run_path(t, run_id)

    def unknown() -> SpecopsError:
        return SpecopsError(f"fetch: unknown run id {run_id!r} on {t.host.name} (no {remote}): "
                            f"`{t.hint('status')}` lists the runs")

    if not hasattr(t, "ssh_command") and not t.exists(remote, "-d"):
        raise unknown()
    target = into or Path(dest) / run_id
    existed = target.exists()
    try:  # (over SSH the listing or the manifest says when the run is not there: one round trip less)
        return fetch_dir(t, remote, target, tries=tries, bwlimit=bwlimit, progress=progress,
                         streams=streams, on_progress=on_progress)
    except transfer.NoDirectory:
        if not existed:
            try:
                target.rmdir()  # (made empty by the writability check)
            except OSError:
                pass
        raise unknown() from None
