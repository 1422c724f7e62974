"""Prove a multi-node launch: every rank joins the rendezvous and all-reduces over gloo.

Launch (what `inv dist-check --host @group` starts on each host, as a detached job; the spec is
written by the laptop, the same fields as a train spec: nnodes, node_rank, rdzv_endpoint,
local_addr, nproc, run_dir, kind):
    <venv>/bin/python3 -m specops_host.check.dist --spec runs/R/train-spec.json
which replaces itself (exec) with torchrun (jobs/launch.py) running this module on every rank:
    <venv>/bin/python3 -m torch.distributed.run --nnodes 2 --node-rank I --rdzv-backend c10d \
        --rdzv-endpoint HOST0:29500 --rdzv-id RUN --nproc-per-node 1 -m specops_host.check.dist

Each rank contributes rank + 1; every rank must see world * (world + 1) / 2. Rank 0's line
`DIST-CHECK {...}` is what specops reads.
"""

import argparse
import datetime
import json
import os
import socket
import sys
from pathlib import Path

PROGRAM = ["-m", "specops_host.check.dist"]  # (every rank runs this module)


def start(spec_path):
    """--spec: exec torchrun with this file as every rank's program."""
    from specops_host import hostenv
    from specops_host.jobs import launch as _launch
    from specops_host.train import spec as trainspec

    spec = trainspec.read(spec_path)
    if spec.get("scheduler") == "slurm":  # (one spec for every node of the job: this node's rank from Slurm)
        spec = _launch.slurm_node(spec)
    argv = _launch.torchrun(spec) + PROGRAM
    print(f"[specops] dist-check {Path(spec['run_dir']).name}: $ {' '.join(argv)}", flush=True)
    hostenv.apply(os.getcwd(), spec.get("kind") or "cpu")
    os.execve(argv[0], argv, {**os.environ, "PYTHONUNBUFFERED": "1"})


def rank():
    """One torchrun rank: the all-reduce."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    r, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": r, "host": socket.gethostname(), "pid": os.getpid(),
                                      "node_rank": int(os.environ.get("GROUP_RANK", -1))})
    line = {"rank": r, "world": world, "sum": t.item(), "want": want, "ok": t.item() == want, "ranks": gathered}
    # one write per line: the ranks of a node share its log, and print()'s two writes interleave
    sys.stdout.write("DIST-CHECK " + json.dumps(line) + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    return 0 if t.item() == want else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", help="launch mode: exec torchrun(spec) with this file as the program")
    ap.add_argument("--print", action="store_true", help="with --spec: print the command and exit")
    a = ap.parse_args()
    if a.spec:
        if a.print:
            from specops_host.jobs import launch as _launch

            print(json.dumps(_launch.torchrun(json.loads(Path(a.spec).read_text())) + PROGRAM))
            return 0
        return start(a.spec)
    return rank()


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
