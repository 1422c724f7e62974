"""Several hosts, one run: sharded extraction, data completion, and torchrun across nodes.

Node ranks follow the group's order; the c10d rendezvous runs on the first host (its
hosts.yaml address, unless --rdzv-host). Every node's job has the same run id; a node that
fails to start stops the nodes already started.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from . import data, jobs, train
from .errors import SpecopsError
from .fanout import Outcome
from .inventory import Host
from .transport import Transport, connect
from .ui import console

DEFAULT_PORT = 29500


def connect_all(hosts: list[Host]) -> list[Transport]:
    with ThreadPoolExecutor(len(hosts)) as pool:
        futs = [pool.submit(connect, h) for h in hosts]
    out, errs = [], []
    for h, f in zip(hosts, futs):
        try:
            out.append(f.result())
        except SpecopsError as e:
            errs.append(f"{h.name}: {e}")
    if errs:
        for t in out:
            t.close()
        raise SpecopsError(f"cannot reach every node: {'; '.join(errs)}")
    return out


def node_extra(hosts: list[Host], i: int, nproc: Optional[int], rdzv_host: Optional[str], port: int) -> dict:
    addr = rdzv_host or hosts[0].address
    if not addr:
        raise SpecopsError(f"node 0 ({hosts[0].name}) has no address for the rendezvous: give --rdzv-host")
    local = (rdzv_host if i == 0 and rdzv_host else hosts[i].address)
    return {"nnodes": len(hosts), "node_rank": i, "rdzv_endpoint": f"{addr}:{port}", "local_addr": local,
            "nproc": nproc or hosts[i].gpus or 1, "nodes": [h.name for h in hosts]}


def launch(ts: list[Transport], rid: str, spec_for: Callable[[Transport, int], dict], *, kind: str,
           lock: Optional[str]) -> list[dict]:
    """Build every node's spec first (all checks before anything starts), then start them all;
    if one fails to start, stop the ones already running."""
    specs = [spec_for(t, i) for i, t in enumerate(ts)]
    started: list[Transport] = []
    try:
        for t, spec in zip(ts, specs):
            path = train.put_spec(t, spec)
            jobs.start(t, rid, train.launch_argv(t, path), kind=kind, lock=lock, term="child")
            started.append(t)
    except SpecopsError as e:
        for t in started:
            try:
                jobs.stop(t, rid, grace=30)
            except SpecopsError:
                pass
        names = ", ".join(t.host.name for t in started) or "none"
        raise SpecopsError(f"{kind} {rid}: a node failed to start ({e}); stopped the nodes already started ({names})")
    console.print(f"{kind} {rid} started on {len(ts)} nodes: " + ", ".join(
        f"{t.host.name} (rank {i})" for i, t in enumerate(ts)))
    return specs


def train_nodes(hosts: list[Host], *, config=None, run_id=None, dataset=None, verifier=None, nproc=None,
                overrides=None, rdzv_host=None, port=DEFAULT_PORT, follow=False) -> dict:
    rid = jobs.validate_run_id(run_id or jobs.new_run_id("train"))
    ts = connect_all(hosts)
    try:
        launch(ts, rid, lambda t, i: train.make_spec(
            t, config=config, rid=rid, dataset=dataset, verifier=verifier, nproc=nproc, overrides=overrides,
            extra=node_extra(hosts, i, nproc, rdzv_host, port)), kind="train", lock="train")
        code = follow_rank0(ts, rid) if follow else None
    finally:
        for t in ts:
            t.close()
    return {"run_id": rid, "exit_code": code}


def dist_check(hosts: list[Host], *, nproc: int = 1, rdzv_host=None, port=DEFAULT_PORT,
               timeout: float = 300) -> dict:
    """A two-(or more-)node torchrun of remote/dist_check.py: gloo all-reduce across the nodes."""
    import json
    import time

    rid = jobs.new_run_id("distcheck")
    ts = connect_all(hosts)
    try:
        launch(ts, rid, lambda t, i: {"program": "dist_check", "run_dir": jobs.run_path(t, rid), "kind": t.host.profile,
                                      **node_extra(hosts, i, nproc, rdzv_host, port)}, kind="dist-check", lock=None)
        t0 = time.time()
        states = {}
        while time.time() - t0 < timeout:
            states = {t.host.name: jobs.status(t, rid)[0]["state"] for t in ts}
            if all(jobs.ended(s) for s in states.values()):
                break
            time.sleep(1)
        else:
            for t in ts:
                jobs.stop(t, rid, grace=10)
            raise SpecopsError(f"dist-check {rid}: not finished after {timeout}s ({states}); stopped")
        lines = []
        for t in ts:
            log = (t.read_bytes(jobs.run_path(t, rid, "output.log")) or b"").decode(errors="replace")
            lines += [json.loads(ln.split("DIST-CHECK ", 1)[1]) for ln in log.splitlines() if "DIST-CHECK " in ln]
        bad = {n: s for n, s in states.items() if s != "succeeded"}
        if bad or not lines or not all(x["ok"] for x in lines):
            tail = "\n".join(f"--- {t.host.name}\n{jobs.tail(t, rid, 8)}" for t in ts)
            raise SpecopsError(f"dist-check {rid} failed: states {states}", detail=tail)
        return {"run_id": rid, "ranks": lines, "states": states}
    finally:
        for t in ts:
            t.close()


def follow_rank0(ts: list[Transport], rid: str) -> Optional[int]:
    code = jobs.run_attached_follow(ts[0], rid)
    return code


def extract_sharded(hosts: list[Host], *, dataset=None, verifier=None, backend="vllm", layers=None,
                    concurrency=32, max_model_len=None) -> list[Outcome]:
    """Each host extracts its contiguous share (--shard i/n) into its own workdir, in parallel."""
    from .fanout import run_on

    n = len(hosts)
    index = {h.name: i for i, h in enumerate(hosts)}

    def one(t: Transport):
        args = data.datagen_args(t, data=data.data_dir(t, dataset), verifier=data.verifier_path(t, verifier),
                                 extract=True, backend=backend, layers=layers, shard=f"{index[t.host.name]}/{n}",
                                 concurrency=concurrency, max_model_len=max_model_len)
        return data.run_datagen(t, args, kind="extract", quiet=True)

    return run_on(hosts, one)


def complete_data(hosts: list[Host], dataset: Optional[str]) -> dict:
    """Give every host every shard's hidden-states files. Hosts declaring `shared_data` already
    see them; otherwise the files travel through the laptop (rsync both ways, only what is
    missing): hosts cannot be assumed to hold credentials for each other."""
    if all(h.shared_data for h in hosts):
        return {"mode": "shared filesystem", "moved": 0}
    ts = connect_all(hosts)
    try:
        with tempfile.TemporaryDirectory(prefix="specops-shards-") as stage:
            for t in ts:
                t.sync_down(f"{data.data_dir(t, dataset)}/hidden_states", stage, partial=True)
            files = len(list(Path(stage).glob("hs_*.safetensors")))
            for t in ts:
                t.sync_up(stage, f"{data.data_dir(t, dataset)}/hidden_states")
        return {"mode": "through the laptop", "files": files}
    finally:
        for t in ts:
            t.close()
