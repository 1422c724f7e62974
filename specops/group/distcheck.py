"""dist-check: prove a multi-node launch before training: one torchrun per host (remote/specops_host/check/dist.py
--spec, its own launcher), c10d rendezvous on the first host, a gloo all-reduce across the nodes.
A `scheduler: slurm` host: one batch job over --nodes nodes, one torchrun per node (specops/slurm)."""

from __future__ import annotations

import json
from typing import Optional

from specops.ops import jobs, train
from specops.slurm import cluster, script
from specops.errors import SpecopsError
from specops.group.fanout import Group
from specops.group.train import DEFAULT_PORT, launch, node_extra, wait_ended
from specops.inventory import Host
from specops.payloads import TrainSpec


def rank_lines(log: bytes) -> list[dict]:
    """The ranks' `DIST-CHECK {...}` lines of a log."""
    text = (log or b"").decode(errors="replace")
    return [json.loads(ln.split("DIST-CHECK ", 1)[1]) for ln in text.splitlines() if "DIST-CHECK " in ln]


def slurm_dist_check(host: Host, *, nodes: Optional[int], nproc: int, port: int, timeout: float, connect) -> dict:
    """One batch job: remote/specops_host/check/dist.py on every node of the allocation, the rendezvous on its first."""
    from specops.host.connection import connect as _connect

    rid = jobs.new_run_id("distcheck")
    with (connect or _connect)(host) as t:
        assert host.slurm is not None  # (a slurm host: inventory gives it its slurm: section)
        req = script.Request.of(host.slurm, nodes=nodes)
        cluster.judge_request(t, req, "dist-check")
        cluster.refuse_unshared(t, "dist-check")
        spec = TrainSpec(run_dir=jobs.run_path(t, rid), kind=host.profile, nproc=nproc, nnodes=req.nodes,
                         scheduler="slurm", rdzv_port=port)
        path = train.put_spec(t, spec)
        jobs.start(t, rid, train.launch_argv(t, path, "check.dist"), kind="dist-check", nodes=req.nodes)
        j = jobs.wait_ended(t, rid, timeout)
        if not j.ended:
            jobs.stop(t, rid, grace=10)
            raise SpecopsError(f"dist-check {rid} on {host.name}: not finished after {timeout}s ({j.describe}); "
                               f"stopped")
        lines = rank_lines(t.read_bytes(jobs.run_path(t, rid, "output.log")))
        if j.state != jobs.JobState.SUCCEEDED or not lines or not all(x["ok"] for x in lines):
            raise SpecopsError(f"dist-check {rid} on {host.name} failed: {j.describe}", detail=jobs.tail(t, rid, 12))
        return {"run_id": rid, "ranks": sorted(lines, key=lambda x: x["rank"]), "states": {host.name: j.describe}}


def dist_check(hosts: list[Host], *, nproc: int = 1, rdzv_host=None, port=DEFAULT_PORT,
               timeout: float = 300, connect=None, nodes: Optional[int] = None) -> dict:
    if len(hosts) == 1 and hosts[0].is_slurm:
        return slurm_dist_check(hosts[0], nodes=nodes, nproc=nproc, port=port, timeout=timeout, connect=connect)
    if nodes is not None:
        raise SpecopsError("--nodes is for one `scheduler: slurm` host; a group runs one torchrun per host")
    rid = jobs.new_run_id("distcheck")
    group = Group.open(hosts, **({"connect": connect} if connect else {}))
    ts = group.transports
    try:
        launch(ts, rid, lambda t, i: TrainSpec.of({"run_dir": jobs.run_path(t, rid), "kind": t.host.profile,
                                                   **node_extra(hosts, i, nproc, rdzv_host, port)}),
               kind="dist-check", lock=None, script="check.dist")
        ended = wait_ended(ts, rid, timeout)
        states = {n: j.describe for n, j in ended.items()}
        if not all(j.ended for j in ended.values()):
            for t in ts:
                jobs.stop(t, rid, grace=10)
            raise SpecopsError(f"dist-check {rid}: not finished after {timeout}s ({states}); stopped")
        lines = []
        for t in ts:
            lines += rank_lines(t.read_bytes(jobs.run_path(t, rid, "output.log")) or b"")
        bad = [n for n, j in ended.items() if j.state != jobs.JobState.SUCCEEDED]
        if bad or not lines or not all(x["ok"] for x in lines):
            tail = "\n".join(f"--- {t.host.name}\n{jobs.tail(t, rid, 8)}" for t in ts)
            raise SpecopsError(f"dist-check {rid} failed: states {states}", detail=tail)
        return {"run_id": rid, "ranks": lines, "states": states}
    finally:
        group.close()


class DistCheck(dict):
    """check_hosts(): {run_id, ranks: [each rank's all-reduce], states}."""


def check_hosts(hosts: list[Host], *, nproc: int = 1, rdzv_host=None, rdzv_port: int = DEFAULT_PORT,
                nodes: Optional[int] = None, connect=None) -> DistCheck:
    """`inv dist-check`: dist_check() on the hosts (a group, or one `scheduler: slurm` host)."""
    return DistCheck(dist_check(hosts, nproc=nproc, rdzv_host=rdzv_host, port=rdzv_port, connect=connect, nodes=nodes))
