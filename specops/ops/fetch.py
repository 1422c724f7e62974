"""fetch: pull a run directory back, incremental, resumable and verified.

Over SSH the bytes move through specops.host.transfer: several streams when one stream is
window-bound (a long round trip), split by files (rsync groups) and, for large files, by byte
ranges; a killed fetch resumes its pieces; the stream count follows the measured link or
``streams=N``. The host computes a sha256 manifest meanwhile (remote/specops_host/fetch/manifest.py, cached by
size+mtime+ctime) and every local file is checked against it (a file that arrived as pieces was
hashed on arrival: its digest seeds the local cache, so it is not read again); a mismatch (say,
a checkpoint still being written) is fetched again, up to ``tries`` times. The `local` host
copies with rsync, then verifies the same way.

``checkpoint=NAME`` (or ``best-served``: the one `inv evaluate --checkpoints ... --pick` recorded
in the run's record, runs/R/run.json) brings that checkpoint and everything of the run that is
not a checkpoint (logs, records, evaluations): the other checkpoint directories and their
aliases (checkpoint_best, epochN_end: symlinks) stay on the host; the files it brings are
verified the same way.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
import contextlib
import json
import os
import shlex
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from specops.host import transfer
from specops.args import Refused, refusing
from specops.errors import SpecopsError
from specops.ops.jobs import run_path, validate_run_id
from specops.host.remote_exec import run_script
from specops.host.transport import Transport
from specops_host.fetch import manifest as host_manifest
from specops.ops import checkpoints


LOCAL_CACHE = ".specops-local-hashes.json"


def local_manifest(root: Path) -> dict:
    """The same manifest, on the laptop side (own cache file)."""
    return host_manifest.manifest(root, cache_name=LOCAL_CACHE)


def seed_local_cache(root: Path, hashed: dict[str, str]) -> None:
    """Record digests computed on arrival in the local manifest's cache (remote/specops_host/fetch/manifest.py's
    seed)."""
    if hashed:
        host_manifest.seed(root, hashed, cache_name=LOCAL_CACHE)


def remote_manifest(t: Transport, remote_dir: str) -> dict:
    from specops.payloads import Manifest

    res = run_script(t, "fetch.manifest", [remote_dir], changes=False, model=Manifest)
    if not res.ok:
        err = str(res.error)
        raise (transfer.NoDirectory if err.startswith("no directory") else SpecopsError)(f"fetch: {err}")
    return res.files


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


def _kept(remote: dict, only: Optional[set]) -> dict:
    """The manifest's entries a partial fetch brings (all of them without `only`)."""
    return remote if only is None else {rel: f for rel, f in remote.items() if rel in only}


def fetch_dir(t: Transport, remote_dir: str, dest: Path, *, tries: int = 3, bwlimit: int = 0,
              progress: bool = False, streams: Optional[int] = None,
              on_progress: Optional[Callable[[int, int], None]] = None, only: Optional[set] = None) -> dict:
    """Transfer, then verify every file against the host's sha256 manifest. The host hashes while
    the streams run (its cache makes an unchanged file free); an unchanged re-fetch compares the
    two cached manifests and sends nothing. on_progress(done_bytes, total_bytes) follows the
    transfer (from worker threads); without one, progress=True draws a bar. `only`: the relative
    paths to bring (and verify); the rest of remote_dir stays on the host."""
    check_writable(dest)
    if not hasattr(t, "ssh_command"):  # the local host
        t.ensure_pushed()
        had_files = any(p.is_file() for p in dest.rglob("*") if not p.name.startswith(".specops"))
        return _fetch_copy(t, remote_dir, dest, tries=tries, bwlimit=bwlimit, progress=progress, had_files=had_files,
                           only=only)
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
            remote = _kept(remote_manifest(t, remote_dir), only)
            if not diff(remote, local_manifest(dest)):
                return _done(dest, remote, 0)
            link = transfer.LinkCheck(t, streams)
        for attempt in range(1, tries + 1):
            # listing first (this connection), then the host hashes while the streams run
            dl = transfer.Download(t, remote_dir, dest, only=set(bad) if attempt > 1 else only, force=attempt > 1,
                                   streams=streams, bwlimit=bwlimit, what="fetch", link=link)
            pending = pool.submit(remote_manifest, t, remote_dir) if remote is None else None
            dl.on_progress = on_progress  # (the views' bar, from the CLI: an operation draws nothing itself)
            rep = dl.run()
            seed_local_cache(dest, rep["hashed"])
            local = local_manifest(dest)
            if pending is not None:
                remote = _kept(pending.result(), only)
            assert remote is not None  # (read before the loop on a re-fetch, else by the pending thread)
            bad = diff(remote, local)
            if bad:  # the host may have changed files since it hashed them: hash again, then judge
                remote = _kept(remote_manifest(t, remote_dir), only)
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


def _copy_only(t: Transport, remote_dir: str, dest: Path, rels: set, force: bool) -> None:
    """The local host, a partial fetch: copy these files (those whose size or mtime differ, or all
    of them when forced)."""
    root = Path(t.expand(remote_dir))
    for rel in sorted(rels):
        src, dst = root / rel, dest / rel
        try:
            a = src.stat()
        except OSError:
            continue  # (gone since the listing: the manifest no longer has it either)
        if not force and dst.is_file():
            b = dst.stat()
            if (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns):
                continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        t.get(str(src), str(dst))


def _fetch_copy(t: Transport, remote_dir: str, dest: Path, *, tries: int, bwlimit: int, progress: bool,
                had_files: bool, only: Optional[set] = None) -> dict:
    """The local host: a copy (rsync; with `only`, of those files), verified the same way."""
    pool = ThreadPoolExecutor(1)
    try:
        pending = pool.submit(remote_manifest, t, remote_dir)
        if had_files and not diff(_kept(pending.result(), only), local_manifest(dest)):
            return _done(dest, _kept(pending.result(), only), 0)
        bad: list[str] = []
        for attempt in range(1, tries + 1):
            if only is not None:
                _copy_only(t, remote_dir, dest, set(bad) if attempt > 1 else only, force=attempt > 1)
            else:
                t.sync_down(remote_dir, str(dest), partial=True, progress=progress and attempt == 1,
                            checksum=attempt > 1, bwlimit=bwlimit)
            local = local_manifest(dest)
            remote = _kept(pending.result(), only)
            bad = diff(remote, local)
            if bad:
                remote = _kept(remote_manifest(t, remote_dir), only)
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


def _fetch_flags(checkpoint: Optional[str] = None, run_id: Optional[str] = None, incomplete: bool = False,
                 **_) -> None:
    if checkpoint is not None:
        checkpoints.spelling("--checkpoint", checkpoint, run_id, words=(BEST_SERVED,))
        if incomplete:
            raise Refused("--incomplete brings a whole run's incomplete checkpoints too; --checkpoint brings one "
                          "complete checkpoint: drop one of them")


@refusing(_fetch_flags)
def fetch(t: Transport, run_id: Optional[str], dest: str = "runs", *, bwlimit: int = 0, node: bool = False,
          progress: bool = False, streams: Optional[int] = None,
          on_progress: Optional[Callable[[int, int], None]] = None, checkpoint: Optional[str] = None,
          incomplete: bool = False) -> dict:
    """`inv fetch`: a run (default: the newest) into dest/<run id>/ (a group's node: into
    dest/<run id>/nodes/<host>/), verified; then metrics.jsonl/png from it (not for a node).
    Its complete checkpoints only (an incomplete one, a save that did not finish, stays on the host,
    named in a note) unless incomplete=True. streams=N forces the number of streams (default: from
    the measured link); on_progress(done_bytes, total_bytes) follows the transfer.
    checkpoint=NAME or `best-served`: that checkpoint only, with the rest of the run (see
    select_checkpoint)."""
    from specops.ops import jobs
    from specops import metrics

    if run_id:
        rid, j = run_id, None
    else:  # the newest *training* run (not an extraction's or evaluation's), named
        j = jobs.get(t, None, kind="train")
        rid = j.run_id
        t.note(f"fetch: no --run-id given: the newest training run on {t.host.name}, {rid}")
    if j is None:
        try:
            j = jobs.status(t, rid)[0]
        except SpecopsError:  # (an unknown run id: fetch_run says so in its own words)
            pass
    if j is not None:
        jobs.own_run(t, j, "fetch")
    if j is not None and not j.ended:
        t.note(f"fetch: {rid} is still {j.state}: this is a snapshot of it now (fetch again once it has ended)",
               "warn")
    into = Path(dest) / rid / "nodes" / t.host.name if node else None
    sel = select_checkpoint(t, rid, checkpoint) if checkpoint else None
    only, left = (sel["only"], {}) if sel else incomplete_checkpoints(t, rid, incomplete)
    try:
        res = fetch_run(t, rid, dest, bwlimit=bwlimit, into=into, progress=progress and not node, streams=streams,
                        on_progress=on_progress, only=only)
    except KeyboardInterrupt:  # (Ctrl-C, SIGTERM: the streams' rsync/ssh processes are ended by now)
        raise SpecopsError(interrupted_line(t, rid, into or Path(dest) / rid)) from None
    out = {**res, "run_id": rid, "metrics": None if node else metrics.write(Path(res["dest"]))}
    if sel:
        out.update({k: v for k, v in sel.items() if k != "only"})
    if left:
        out["incomplete_left" if not incomplete else "incomplete_brought"] = left
    return FetchedCheckpoint(out) if sel else Fetched(out)


def incomplete_checkpoints(t: Transport, run_id: str, bring: bool) -> tuple[Optional[set], dict]:
    """A whole run's fetch: (the relative paths to bring, None: all of it; {incomplete checkpoint:
    why}). The incomplete ones stay on the host (their folders and the aliases that name them), said
    in one line, unless bring (--incomplete): then they come too, said as well."""
    try:
        cp = checkpoints.of(t, run_id, (), "fetch")
    except checkpoints.NoRun:  # (fetch_run says so in its own words)
        return None, {}
    if not cp.incomplete:
        return None, {}
    left = dict(cp.incomplete)
    named = "; ".join(f"{n} ({why})" for n, why in left.items())
    if bring:
        t.note(f"fetch: bringing the incomplete checkpoint(s) of {run_id} too, as asked (--incomplete): {named}",
               "warn")
        return None, left
    t.note(f"fetch: left the incomplete checkpoint(s) of {run_id} on {t.host.name}: {named}; "
           f"`{t.hint(f'fetch --run-id {run_id} --incomplete')}` brings them too", "warn")
    links = {a for a, target in cp.aliases.items() if target in left}
    listing = transfer.remote_listing(t, run_path(t, run_id))

    def wanted(rel: str) -> bool:
        parts = rel.split("/")
        return not (parts[0] == "checkpoints" and len(parts) > 1 and (parts[1] in left or parts[1] in links))

    return {rel for rel, e in listing.items() if e.kind in ("f", "l") and wanted(rel)}, left


class Fetched(dict):
    """fetch(): a whole run, fetched and verified."""


class FetchedCheckpoint(dict):
    """fetch(checkpoint=...): one checkpoint with the run's logs and records."""


def interrupted_line(t: Transport, rid: str, target: Path) -> str:
    """What an interrupted fetch leaves, and how to go on: one line."""
    done = [p for p in target.rglob("*") if p.is_file()] if target.is_dir() else []
    parts = [p for p in done if p.name.startswith(".")]
    size = sum(p.stat().st_size for p in done if p.exists())
    return (f"fetch {rid} interrupted: {len(done) - len(parts)} file(s) and {len(parts)} partial piece(s) "
            f"({size / 2**20:.1f} MiB) in place in {target}, no transfer left running; "
            f"`{t.hint(f'fetch --run-id {rid}')}` resumes (files already there are not sent again)")


#: the run's record on the host (remote/specops_host/train/run.py writes it and keeps its other fields on a resume)
RUN_RECORD = "run.json"
#: its field for the checkpoint `inv evaluate --checkpoints ... --pick` chose by served acceptance
PICK = "best_served"
BEST_SERVED = "best-served"


def _unknown(t: Transport, run_id: str) -> SpecopsError:
    return SpecopsError(f"fetch: unknown run id {run_id!r} on {t.host.name} (no {run_path(t, run_id)}): "
                        f"`{t.hint('status')}` lists the runs")


def run_checkpoints(t: Transport, run_id: str, what: str = "evaluate") -> list[str]:
    """The run's complete checkpoints on the host (the host's rule: ops/checkpoints.py); empty when it
    has none. The incomplete ones are said in a note (`what` skipped them)."""
    cp = checkpoints.of(t, run_id, (), what)
    checkpoints.skipped_note(t, run_id, cp, what)
    return list(cp.complete)


def read_pick(t: Transport, run_id: str) -> Optional[dict]:
    """The served pick recorded in the run's record on the host, or None."""
    raw = t.read_bytes(run_path(t, run_id, RUN_RECORD))
    try:
        rec = json.loads(raw) if raw else {}
    except ValueError:
        rec = {}
    pick = rec.get(PICK) if isinstance(rec, dict) else None
    return pick if isinstance(pick, dict) and isinstance(pick.get("checkpoint"), str) else None


def select_checkpoint(t: Transport, run_id: str, which: str) -> dict:
    """What `fetch --checkpoint WHICH` brings: {"checkpoint": name, "picked": the served pick or
    None, "left": the other checkpoints, "only": relative paths}: the checkpoint's directory and
    every file of the run outside checkpoints/ plus the plain files directly in it (run.yaml, ...).
    WHICH is a checkpoint's name or `best-served`, resolved by the host (ops/checkpoints.py: inside
    the run's checkpoints/, complete). One line when it cannot be."""
    validate_run_id(run_id)
    try:
        listing = transfer.remote_listing(t, run_path(t, run_id))
    except transfer.NoDirectory:
        raise _unknown(t, run_id) from None
    pick = None
    asked = which
    if which == BEST_SERVED:
        pick = read_pick(t, run_id)
        if pick is None:
            raise SpecopsError(f"fetch --checkpoint best-served: run {run_id} on {t.host.name} has no served pick "
                               f"recorded: run "
                               f"`{t.hint(f'evaluate --run-id {run_id} --checkpoints all --pick')}` first")
        asked = pick["checkpoint"]
    cp = checkpoints.of(t, run_id, [asked], "fetch")
    r = cp.resolved[0] if cp.resolved else {"asked": asked, "reason": "unknown"}
    listed = ", ".join(cp.complete) or "none"
    if r.get("reason") and pick is not None:
        gone = "is incomplete" if r["reason"] == "incomplete" else "is no longer"
        raise SpecopsError(f"fetch --checkpoint best-served: the pick of run {run_id}, checkpoint {asked!r}, {gone} on "
                           f"{t.host.name} (have: {listed}): run `"
                           f"{t.hint(f'evaluate --run-id {run_id} --checkpoints all --pick')}` again")
    if r.get("reason"):
        line = checkpoints.refusal("fetch", run_id, t.host.name, r, cp.complete)
        raise SpecopsError(line + ("; `--checkpoint best-served` brings the one `inv evaluate --checkpoints all "
                                   "--pick` chose" if r["reason"] == "unknown" else ""))
    checkpoints.skipped_note(t, run_id, cp, "fetch")
    name = r["name"]

    def wanted(rel: str, kind: str) -> bool:
        parts = rel.split("/")
        if parts[0] != "checkpoints" or len(parts) == 1:
            return True
        if len(parts) == 2:  # run.yaml, train_command.txt; not the aliases (symlinks to checkpoint dirs)
            return kind == "f"
        return parts[1] == name

    only = {rel for rel, e in listing.items() if e.kind in ("f", "l") and wanted(rel, e.kind)}
    return {"checkpoint": name, "picked": pick, "left": [n for n in cp.complete if n != name], "only": only,
            "skipped": list(cp.incomplete)}


def fetch_run(t: Transport, run_id: str, dest: str = "runs", *, tries: int = 3, bwlimit: int = 0,
              into: Optional[Path] = None, progress: bool = False, streams: Optional[int] = None,
              on_progress: Optional[Callable[[int, int], None]] = None, only: Optional[set] = None) -> dict:
    validate_run_id(run_id)
    remote = run_path(t, run_id)
    if not hasattr(t, "ssh_command") and not t.exists(remote, "-d"):
        raise _unknown(t, run_id)
    target = into or Path(dest) / run_id
    existed = target.exists()
    try:  # (over SSH the listing or the manifest says when the run is not there: one round trip less)
        with lease(t, run_id):
            return fetch_dir(t, remote, target, tries=tries, bwlimit=bwlimit, progress=progress,
                             streams=streams, on_progress=on_progress, only=only)
    except transfer.NoDirectory:
        if not existed:
            try:
                target.rmdir()  # (made empty by the writability check)
            except OSError:
                pass
        raise _unknown(t, run_id) from None


#: how long a fetch's lease holds at most: a laptop that dies mid-fetch does not pin the run for longer
LEASE_S = 6 * 3600


@contextlib.contextmanager
def lease(t: Transport, run_id: str) -> Iterator[Optional[str]]:
    """While a fetch copies run_id: a tiny job of kind `fetch` (a `sleep` of LEASE_S, the host's own
    job, a login node's on Slurm) that uses run_id, so `inv clean` keeps the run and says so. Its
    id, R.fetch-HHMMSS-xxxx, is yielded; at the end it is stopped and its folder removed (status
    does not list it after). Under --dry-run nothing is started (a "would" line)."""
    from specops.ops import jobs

    lid = f"{run_id}.fetch-{time.strftime('%H%M%S')}-{os.urandom(2).hex()}"
    if t.dry_run:
        t.would(f"hold a lease on {run_id} while it is fetched (a job {lid}: `inv clean` keeps the run)")
        yield None
        return
    jobs.start(t, lid, ["sleep", str(LEASE_S)], kind="fetch", uses=[run_id], here=True)
    try:
        yield lid
    finally:
        path = run_path(t, lid)
        try:
            jobs.stop(t, lid, grace=5)
            t.check(f"rm -rf -- {shlex.quote(path)} {shlex.quote(path + '.env')}", f"removing the fetch's lease {lid}")
        except (SpecopsError, OSError) as e:  # (the connection lost: the fetch's own error is the one to say)
            t.note(f"fetch: its lease {lid} on {t.host.name} is left ({str(e).splitlines()[0] if str(e) else e!r}); "
                   f"it ends itself within {LEASE_S // 3600}h, or `{t.hint(f'stop --run-id {lid}')}` ends it now",
                   "warn")
