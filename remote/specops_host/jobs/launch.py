"""torchrun's own arguments for a job spec (stdlib; shared by train/run.py and check/dist.py).

The spec fields read: nnodes, node_rank, rdzv_endpoint, local_addr, nproc, run_dir.
- one node:     <python> -m torch.distributed.run --nproc-per-node N --standalone
- several:      ... --nnodes N --node-rank I --rdzv-backend c10d --rdzv-endpoint HOST0:PORT
                    --rdzv-id <run id> --rdzv-conf is_host=0|1 [--local-addr ADDR]
The program and its arguments follow (a script path, or `-m module ...`).
A Slurm job's spec (scheduler: slurm) is the same on every node: slurm_node() fills in this
node's fields from Slurm's environment (SLURM_NNODES, SLURM_NODEID) and the batch shell's
SPECOPS_RDZV_ADDR (the allocation's first node), before torchrun() builds the command.
"""

import os
import sys
from pathlib import Path


def slurm_node(spec, env=None):
    """spec with this node's torchrun fields, from the Slurm task's environment."""
    env = os.environ if env is None else env
    nodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
    rank = int(env.get("SLURM_NODEID") or 0)
    addr = env.get("SPECOPS_RDZV_ADDR") or "127.0.0.1"
    return {**spec, "nnodes": nodes, "node_rank": rank, "rdzv_endpoint": f"{addr}:{spec.get('rdzv_port') or 29500}",
            "slurm_job_id": env.get("SLURM_JOB_ID")}


def torchrun(spec, python=None):
    """torchrun's own arguments: standalone on one node, c10d rendezvous on the first host for
    several (the same run id everywhere)."""
    nodes = spec.get("nnodes") or 1
    argv = [python or sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(spec.get("nproc") or 1)]
    if nodes == 1:
        return argv + ["--standalone"]
    # is_host: node 0 hosts the c10d store. torchrun guesses it by matching the endpoint against
    # this machine's hostname, which fails when hosts.yaml names it by another address.
    return argv + ["--nnodes", str(nodes), "--node-rank", str(spec["node_rank"]), "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", spec["rdzv_endpoint"], "--rdzv-id", Path(spec["run_dir"]).name,
                   "--rdzv-conf", f"is_host={1 if spec['node_rank'] == 0 else 0}"] + (
        # the address the other nodes reach this one by (else torchrun advertises the hostname)
        ["--local-addr", spec["local_addr"]] if spec.get("local_addr") else [])
