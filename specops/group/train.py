"""One training run over a group of hosts: one torchrun per host (multi-node).

Node ranks follow the group's order; the c10d rendezvous runs on the first host (its
hosts.yaml address, unless --rdzv-host). Every node's job has the same run id; a node that
fails to start stops the nodes already started. Before a run resumes, every node gets rank 0's
latest epoch checkpoint.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from specops.ops import jobs, train, watch
from specops.args import Refused, refusing
from specops.errors import SpecopsError
from specops.group.fanout import Group, Outcomes, run_on
from specops.inventory import Host
from specops.host.transport import Transport
from specops.payloads import TrainSpec

DEFAULT_PORT = 29500


def node_extra(hosts: list[Host], i: int, nproc: Optional[int], rdzv_host: Optional[str], port: int) -> dict:
    """Node i's torchrun fields of the spec (the host side builds the argv: remote/specops_host/jobs/launch.py)."""
    addr = rdzv_host or hosts[0].address
    if not addr:
        raise SpecopsError(f"node 0 ({hosts[0].name}) has no address for the rendezvous: give --rdzv-host")
    local = (rdzv_host if i == 0 and rdzv_host else hosts[i].address)
    return {"nnodes": len(hosts), "node_rank": i, "rdzv_endpoint": f"{addr}:{port}", "local_addr": local,
            "nproc": nproc or hosts[i].gpus or 1, "nodes": [h.name for h in hosts]}


def launch(ts: list[Transport], rid: str, spec_for: Callable[[Transport, int], TrainSpec], *, kind: str,
           lock: Optional[str], script: str = "train.run", before_start: Optional[Callable[[list], object]] = None
           ) -> list[TrainSpec]:
    """Build every node's spec first (all checks before anything starts), then before_start(specs),
    then start them all; if one fails to start, stop the ones already running."""
    specs = [spec_for(t, i) for i, t in enumerate(ts)]
    if before_start:
        before_start(specs)
    started: list[Transport] = []
    try:
        for t, spec in zip(ts, specs):
            path = train.put_spec(t, spec)
            jobs.start(t, rid, train.launch_argv(t, path, script), kind=kind, lock=lock, term="child",
                       fail_on="nonfinite-loss" if kind == "train" else None)
            started.append(t)
    except SpecopsError as e:
        for t in started:
            try:
                jobs.stop(t, rid, grace=30)
            except SpecopsError:
                pass
        names = ", ".join(t.host.name for t in started) or "none"
        raise SpecopsError(f"{kind} {rid}: a node failed to start ({e}); stopped the nodes already started "
                           f"({names})") from None
    ts[0].note(f"{kind} {rid} {ts[0].either('started', 'would start')} on {len(ts)} nodes: "
               + ", ".join(f"{t.host.name} (rank {i})" for i, t in enumerate(ts)))
    return specs


def checkpoint_epochs(t: Transport, rid: str) -> list[int]:
    """The epoch checkpoints (numeric dirs, not symlinks) of a run on one node, ascending."""
    d = jobs.run_path(t, rid, "checkpoints")
    r = t.fact(f"cd {shlex.quote(d)} 2>/dev/null && for e in [0-9]*; do [ -d \"$e\" ] && [ ! -L \"$e\" ] "
               f"&& echo \"$e\"; done; true")
    return sorted(int(x) for x in r.stdout.split() if x.isdigit())


def align_checkpoints(ts: list[Transport], rid: str) -> dict:
    """Before a group run starts: every node must hold rank 0's latest epoch checkpoint.
    speculators decides whether to resume from each rank's own --save-path (a node's run dir
    here) and loads the optimizer state on every rank; nodes that disagree would issue different
    collectives and hang. Rank 0's checkpoints are the truth: its latest epoch is copied (through
    the laptop, rsync both ways, only what differs) to the nodes whose copy differs."""
    from specops.ops.fetch import remote_manifest

    with ThreadPoolExecutor(len(ts)) as pool:
        epochs = list(pool.map(lambda t: checkpoint_epochs(t, rid), ts))
    head = epochs[0][-1] if epochs[0] else None
    for t, e in zip(ts[1:], epochs[1:]):
        newer = [x for x in e if head is None or x > head]
        if newer:
            raise SpecopsError(
                f"train {rid}: {t.host.name} holds checkpoint(s) {newer} in {jobs.run_path(t, rid, 'checkpoints')} "
                f"that rank 0 ({ts[0].host.name}) lacks (its latest: {head}): the nodes would disagree on where to "
                f"resume; move them away there or use a new --run-id (nothing was started)")
    if head is None:
        return {"resume": None, "copied_to": []}
    rel = f"checkpoints/{head}"
    want = {k: v["sha256"] for k, v in remote_manifest(ts[0], jobs.run_path(ts[0], rid, rel)).items()}
    stale = []
    for t, e in zip(ts[1:], epochs[1:]):
        have = ({k: v["sha256"] for k, v in remote_manifest(t, jobs.run_path(t, rid, rel)).items()}
                if head in e else {})
        if any(have.get(k) != v for k, v in want.items()):
            stale.append(t)
    todo = [t for t in stale if t.planned_change("", f"the copy of {rel}", said=f"would copy {rel} of run {rid} "
                                                 f"from {ts[0].host.name} (rank 0)") is None]  # (a dry run: said)
    if todo:
        with tempfile.TemporaryDirectory(prefix="specops-ckpt-") as stage:
            ts[0].sync_down(jobs.run_path(ts[0], rid, rel), stage, partial=True)
            for t in todo:
                t.sync_up(stage, jobs.run_path(t, rid, rel))
    names = [t.host.name for t in stale]
    ts[0].note(f"train {rid}: resuming from rank 0's epoch {head} checkpoint"
               + (f"; {ts[0].either('copied', 'would copy')} it to {', '.join(names)}" if names
                  else "; every node holds it"))
    return {"resume": head, "copied_to": names}


def wait_ended(ts: list[Transport], rid: str, timeout: float) -> dict:
    """Every node's job once all have ended (or `timeout` seconds have passed): {host: Job}."""
    t0 = time.time()
    while True:
        got = {t.host.name: jobs.status(t, rid)[0] for t in ts}
        if all(j.ended for j in got.values()) or time.time() - t0 > timeout:
            return got
        time.sleep(1)


def train_nodes(hosts: list[Host], *, config=None, run_id=None, dataset=None, verifier=None, nproc=None,
                overrides=None, rdzv_host=None, port=DEFAULT_PORT, follow=False,
                connect=None, serve_check=True, continue_on_new_data=False, draft=None) -> dict:
    """Start the run on every node; with follow, rank 0's log, then every node's end state (an
    error unless all succeeded). serve_check: the draft-serves preflight on the first node only
    (every node trains the same draft), after every node's inputs are checked, before any starts.
    continue_on_new_data: a node whose run.json says this run id trained on another dataset or
    settings refuses the start unless given (train.refuse_new_data, as on one host); each node's
    run.json appends the start either way. A dry run says every node's start (each node's plan:
    the connections' own)."""
    rid = jobs.validate_run_id(run_id or jobs.new_run_id("train"))
    group = Group.open(hosts, **({"connect": connect} if connect else {}))
    ts = group.transports

    def spec_for(t: Transport, i: int) -> TrainSpec:
        spec = train.make_spec(t, config=config, rid=rid, dataset=dataset, verifier=verifier, nproc=nproc,
                               overrides=overrides, extra=node_extra(hosts, i, nproc, rdzv_host, port), draft=draft)
        train.refuse_new_data(t, rid, spec, continue_on_new_data)
        return spec

    try:
        launch(ts, rid, spec_for, kind="train", lock="train",
            before_start=lambda specs: (train.preflight_serve(ts[0], specs[0], train.refuse_running(ts[0], rid),
                                                              vllm_arg=None, enabled=serve_check),
                                        align_checkpoints(ts, rid)))
        if not follow:
            return {"run_id": rid, "exit_code": None}
        code = jobs.run_following(ts[0], rid)  # rank 0's log
        if code is None:  # Ctrl-C: detached, every node keeps running
            return {"run_id": rid, "exit_code": None}
        ended = wait_ended(ts, rid, timeout=120)
        states = {n: j.describe for n, j in ended.items()}
        bad = {n: j for n, j in ended.items() if j.state != jobs.JobState.SUCCEEDED}
        if code or bad:
            first = next((f"; {n}: {j.error}" for n, j in bad.items() if j.error), "")
            tails = "\n".join(f"--- {t.host.name} (rank {i})\n{jobs.tail(t, rid, 8)}"
                              for i, t in enumerate(ts) if t.host.name in bad)
            raise SpecopsError(f"train {rid}: not every node succeeded ({states}){first}", detail=tails)
        return {"run_id": rid, "exit_code": code, "states": states}
    finally:
        group.close()


def _group_flags(hidden_states: str = "auto", server_gpus=None, train_gpus=None, layers=None, disk_budget=None,
                 **kw) -> None:
    train.check_draft(**{k: v for k, v in kw.items() if k == "draft"})
    watch.group_flags(**kw)
    if hidden_states == "online" or server_gpus or train_gpus or layers or disk_budget is not None:
        raise Refused("--hidden-states online trains on one host (its own vLLM server); a group trains on "
                      "extracted files: `inv extract` for the group first")


@refusing(_group_flags)
def train_group(hosts: list[Host], *, connect=None, epochs=None, max_steps=None, rdzv_host=None, rdzv_port=DEFAULT_PORT,
                config=None, run_id=None, dataset=None, verifier=None, nproc=None, follow=False, serve_check=True,
                continue_on_new_data=False, draft_vocab_size=None, draft=None, **_) -> train.Trained:
    """`inv train --host @group`: train_nodes() (one torchrun per host, c10d on the first)."""
    res = train_nodes(hosts, config=config, run_id=run_id, dataset=dataset, verifier=verifier, nproc=nproc,
                      overrides={"epochs": epochs, "max-steps": max_steps, "draft-vocab-size": draft_vocab_size},
                      rdzv_host=rdzv_host, port=rdzv_port,
                      follow=follow, connect=connect, serve_check=serve_check,
                      continue_on_new_data=continue_on_new_data, draft=draft)
    return train.Trained(res, nodes=True)


def _fetch_flags(run_id=None, checkpoint=None, **_) -> None:
    if not run_id:
        raise Refused("fetch from a group needs --run-id")
    if checkpoint:
        raise Refused("fetch --checkpoint takes one host (the one the run was evaluated on), not a group")


@refusing(_fetch_flags)
def fetch_nodes(hosts: list[Host], *, connect=None, run_id: str, dest: str = "runs", bwlimit: int = 0,
                streams=None, incomplete: bool = False, **_) -> Outcomes:
    """`inv fetch --host @group`: each node's copy of the run into dest/<run id>/nodes/<host>/, in parallel."""
    from specops.ops.fetch import fetch

    def one(t: Transport):
        return fetch(t, run_id, dest, bwlimit=bwlimit, node=True, streams=streams, incomplete=incomplete)

    out = Outcomes(run_on(hosts, one, **({"connect": connect} if connect else {})))
    out.title = f"fetch {run_id}"
    return out
