"""Prove a multi-node launch: every rank joins the rendezvous and all-reduces over gloo.

Launch (what `inv dist-check --host @group` starts on each host, through remote/train.py):
    <venv>/bin/python3 -m torch.distributed.run --nnodes 2 --node-rank I --rdzv-backend c10d \
        --rdzv-endpoint HOST0:29500 --rdzv-id RUN --nproc-per-node 1 remote/dist_check.py

Each rank contributes rank + 1; every rank must see world * (world + 1) / 2. Rank 0's line
`DIST-CHECK {...}` is what specops reads.
"""

import datetime
import json
import os
import socket
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
                                      "node_rank": int(os.environ.get("GROUP_RANK", -1))})
    line = {"rank": rank, "world": world, "sum": t.item(), "want": want, "ok": t.item() == want, "ranks": gathered}
    print("DIST-CHECK " + json.dumps(line), flush=True)
    dist.destroy_process_group()
    return 0 if t.item() == want else 1


if __name__ == "__main__":
    import contract

    contract.main(main)
