"""dist-check: prove a multi-node launch before training: one torchrun per host (remote/dist_check.py
--spec, its own launcher), c10d rendezvous on the first host, a gloo all-reduce across the nodes."""

from __future__ import annotations

import json

from specops.ops import jobs
from specops.errors import SpecopsError
from specops.group.fanout import connect_all
from specops.group.train import DEFAULT_PORT, launch, node_extra, wait_ended
from specops.inventory import Host


def dist_check(hosts: list[Host], *, nproc: int = 1, rdzv_host=None, port=DEFAULT_PORT,
               timeout: float = 300, connect=None) -> dict:
    rid = jobs.new_run_id("distcheck")
    ts = connect_all(hosts, **({"connect": connect} if connect else {}))
    try:
        launch(ts, rid, lambda t, i: {"run_dir": jobs.run_path(t, rid), "kind": t.host.profile,
                                      **node_extra(hosts, i, nproc, rdzv_host, port)},
               kind="dist-check", lock=None, script="dist_check")
        ended = wait_ended(ts, rid, timeout)
        states = {n: j.describe for n, j in ended.items()}
        if not all(j.ended for j in ended.values()):
            for t in ts:
                jobs.stop(t, rid, grace=10)
            raise SpecopsError(f"dist-check {rid}: not finished after {timeout}s ({states}); stopped")
        lines = []
        for t in ts:
            log = (t.read_bytes(jobs.run_path(t, rid, "output.log")) or b"").decode(errors="replace")
            lines += [json.loads(ln.split("DIST-CHECK ", 1)[1]) for ln in log.splitlines() if "DIST-CHECK " in ln]
        bad = [n for n, j in ended.items() if j.state != jobs.JobState.SUCCEEDED]
        if bad or not lines or not all(x["ok"] for x in lines):
            tail = "\n".join(f"--- {t.host.name}\n{jobs.tail(t, rid, 8)}" for t in ts)
            raise SpecopsError(f"dist-check {rid} failed: states {states}", detail=tail)
        return {"run_id": rid, "ranks": lines, "states": states}
    finally:
        for t in ts:
            t.close()
