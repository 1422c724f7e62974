"""train: `speculators train` on the extracted data, as a detached job (remote/train.py)."""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from typing import Optional

from . import jobs
from .check import refuse_failed_settings
from .config import load_config, revision
from .data import data_dir
from .errors import SpecopsError
from .inspect import inspect
from .transport import Transport


def make_spec(t: Transport, *, config: Optional[str], rid: str, dataset: Optional[str], verifier: Optional[str],
              nproc: Optional[int], overrides: Optional[dict], extra: Optional[dict] = None) -> dict:
    """Check the data (refusing before anything starts) and build the run's train spec."""
    h = t.host
    procs, nodes = nproc or h.gpus or 1, (extra or {}).get("nnodes", 1)
    if h.profile == "cpu" and procs * nodes > 1:
        raise SpecopsError(
            f"train on {h.name}: a cpu host trains in one process ({nodes} node(s) x {procs} process(es) asked); "
            f"speculators' distributed training needs an accelerator ('No accelerator found'): train on one cpu "
            f"host without --nproc, or on GPU hosts (nothing was started)")
    cfg = load_config(config, h.profile, overrides or {})
    refuse_failed_settings(t, cfg["flags"])  # settings that failed `inv check --deep` here never start
    data = data_dir(t, dataset)
    summary = inspect(t, data, sample=2, verifier=verifier or h.verifier)
    if summary.get("format") is None or not summary.get("files"):
        raise SpecopsError(f"no extracted data at {data} on {h.name}: run `{t.hint('prepare-data --data F')}` and "
                           f"`{t.hint('extract')}` first (nothing was started)")
    if not summary["ok"]:
        v = summary["violations"][0]
        raise SpecopsError(f"data at {data} fails inspect-data ({v['file']}: {v['what']}): fix it before training "
                           f"(nothing was started)")
    rec = summary.get("record") or {}
    layer_ids = rec.get("layer_ids")
    if not layer_ids:
        raise SpecopsError(f"{data} has no extraction record (layer ids): re-run `{t.hint('extract')}` for it")
    ver = verifier or rec.get("verifier") or h.verifier
    return {
        "run_dir": jobs.run_path(t, rid), "kind": h.profile, "nproc": procs, "verifier": t.expand(ver),
        "data": data, "target_layer_ids": layer_ids[:-1], "flags": cfg["flags"], **(extra or {}),
        "record": {"run_id": rid, "specops_revision": revision(), "host_name": h.name, "config_file": cfg["path"],
                   "config": cfg["flags"], **({"nodes": extra} if extra else {}),
                   "data_summary": {k: summary.get(k) for k in (
                       "path", "format", "rows", "files", "bytes", "tokens", "hidden_size", "stored_layers", "record")}},
    }


def put_spec(t: Transport, spec: dict, name: str = "train-spec.json") -> str:
    run_dir = spec["run_dir"]
    t.check(f"mkdir -p {shlex.quote(run_dir)}", "mkdir run dir")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f, indent=1)
    try:
        t.put(f.name, f"{run_dir}/{name}")
    finally:
        os.unlink(f.name)
    return f"{run_dir}/{name}"


def launch_argv(t: Transport, spec_path: str, script: str = "train") -> list[str]:
    return [t.expand(t.host.python), f"remote/{script}.py", "--spec", spec_path]


def refuse_running(t: Transport, rid: str) -> None:
    """A run id that is running is refused before anything is written for it (its spec stays)."""
    for j in jobs.status(t):
        if j.run_id == rid and not j.ended:
            raise SpecopsError(f"train {rid} is already running on {t.host.name} (pid {j.pid}): "
                               f"`{t.hint(f'logs -f --run-id {rid}')}` follows it (nothing was changed)")


def train(t: Transport, *, config: Optional[str] = None, run_id: Optional[str] = None,
          dataset: Optional[str] = None, verifier: Optional[str] = None, nproc: Optional[int] = None,
          overrides: Optional[dict] = None, follow: bool = False) -> Optional[dict]:
    """Start (or resume) a run; with follow, wait for its end. Returns run id, exit code (None
    while it runs), run dir; None under --dry-run."""
    rid = jobs.validate_run_id(run_id or jobs.new_run_id("train"))
    spec = make_spec(t, config=config, rid=rid, dataset=dataset, verifier=verifier, nproc=nproc, overrides=overrides)
    refuse_running(t, rid)
    fresh = not t.exists(spec["run_dir"], "-d")
    path = put_spec(t, spec)
    try:
        code = jobs.run_attached(t, rid, launch_argv(t, path), kind="train", lock="train", detach=not follow,
                                 stop_on_interrupt=False, term="child")
    except SpecopsError:
        if fresh and not t.exists(f"{spec['run_dir']}/job.json", "-f"):  # a refused start leaves no run folder
            t.run(f"rm -rf {shlex.quote(spec['run_dir'])}")
        raise
    if follow and code not in (None, 0):
        raise jobs.failure(t, rid, "train")
    return None if t.dry_run else {"run_id": rid, "exit_code": code, "run_dir": spec["run_dir"]}
