"""Sharded extraction: each host of a group extracts its contiguous share of the rows
(--shard i/n) into its own workdir, in parallel; then shards.complete_data gives every host all."""

from __future__ import annotations

import json
from typing import Optional

from specops import paths
from specops.args import Refused, refusing
from specops.errors import SpecopsError
from specops.ops import data
from specops.group.fanout import Outcome, run_on
from specops.inventory import Host
from specops.host.transport import Transport


def extract_sharded(hosts: list[Host], *, dataset=None, verifier=None, backend="vllm", layers=None,
                    concurrency=32, max_model_len=None, vllm_arg: Optional[list] = None,
                    connect=None) -> list[Outcome]:
    n = len(hosts)
    index = {h.name: i for i, h in enumerate(hosts)}

    def one(t: Transport):
        args = data.Datagen.of(t, data=data.data_dir(t, dataset), verifier=data.verifier_path(t, verifier),
                               extract=True, backend=backend, layers=layers, shard=f"{index[t.host.name]}/{n}",
                               concurrency=concurrency, max_model_len=max_model_len, vllm_arg=vllm_arg or None)
        return data.run_datagen(t, args, kind="extract", quiet=True)

    return run_on(hosts, one, **({"connect": connect} if connect else {}))


def extract_group(hosts: list[Host], *, dataset=None, connect=None, **kw) -> dict:
    """Each host its share, then (if every share succeeded) every host every shard:
    {"outcomes": [one per host], "completion": how the shards moved, or None, "stopped": whether
    a dry run stopped before the shards (each host's plan in its outcome)}."""
    from specops.group import shards

    outs = extract_sharded(hosts, dataset=dataset, connect=connect, **kw)
    stopped = any(o.stopped for o in outs)
    done = all(o.ok for o in outs) and not stopped
    return {"outcomes": outs, "completion": shards.complete_data(hosts, dataset) if done else None,
            "stopped": stopped}


def extract_array(t: Transport, shards: int, *, dataset=None, verifier=None, backend="vllm", layers=None,
                  concurrency=32, max_model_len=None, vllm_arg: Optional[list] = None, detach=False,
                  timeout: float = 7 * 86400) -> dict:
    """A `scheduler: slurm` host: one Slurm job array of `shards` tasks, each extracting its
    contiguous share of the rows (datagen --shard i/n, i = $SLURM_ARRAY_TASK_ID) with its own vLLM
    server on its own allocation's GPUs (slurm.gpus_per_node), into the one data dir on the
    cluster's shared filesystem. Waits for every task (unless detach), then checks, as the group
    path does, that every row now has its file (datagen --plan: nothing left to write).
    {"run_id", "job_id", "outcomes": [one per task], "completion", "left"} (a dry run: said, up to the submission)."""
    from specops.group.fanout import Outcome
    from specops.ops import jobs
    from specops.slurm import script

    if not t.host.is_slurm:
        raise SpecopsError(f"--shards is for a `scheduler: slurm` host (a job array); {t.host.name} is one host: "
                           f"drop --shards, or give --shard i/n (a group splits the rows itself)")
    if shards < 1:
        raise SpecopsError(f"--shards {shards}: give 1 or more (the tasks of the job array)")
    common = dict(data=data.data_dir(t, dataset), verifier=data.verifier_path(t, verifier), extract=True,
                  backend=backend, layers=layers, concurrency=concurrency, max_model_len=max_model_len,
                  **({"vllm_arg": vllm_arg} if vllm_arg else {}))
    plan = data.plan_datagen(t, data.Datagen.of(t, shard=f"0/{shards}", **common), kind="extract")  # (n checked)
    t.would(f"each of the {shards} array tasks would start its own server and extraction; task 0's:")
    data.planned_commands(t, plan)
    dg = data.Datagen.of(t, shard=f"{script.ARRAY_TASK}/{shards}", **common)
    rid = jobs.new_run_id("extract")
    argv = [*paths.host_argv(t.expand(t.host.python), "data.datagen"),
            *dg.argv("--result", jobs.run_path(t, rid, f"result-{script.ARRAY_TASK}.json"))]
    jid = jobs.start(t, rid, argv, kind="extract", lock=data.datagen_lock(dg), array=shards).slurm_job_id
    t.note(f"extract submitted on {t.host.name}: run {rid} (Slurm job array {jid}, {shards} task(s)); "
           f"`{t.hint(f'status --run-id {rid}')}` shows each task")
    if detach:
        return {"run_id": rid, "job_id": jid, "outcomes": [], "completion": None, "left": None}
    try:
        j = jobs.wait_ended(t, rid, timeout)
    except KeyboardInterrupt:  # (as a single extraction does: Ctrl-C stops what it started)
        t.note(f"interrupted: stopping {rid} (every task of Slurm job array {jid}) ...", "warn")
        res = jobs.stop(t, rid, grace=60)
        raise SpecopsError(f"extract {rid} interrupted and stopped on {t.host.name} "
                           f"({res.state if res else '?'})") from None
    outs = []
    for task in j.subjobs:
        i = int(task.run_id[len("task"):])
        raw = t.read_bytes(jobs.run_path(t, rid, f"result-{i}.json"))
        res = json.loads(raw) if raw else None
        if task.state.value == "succeeded" and res and res.get("ok"):
            outs.append(Outcome(f"{task.run_id} ({task.slurm_job_id})", True, res))
        else:
            why = (res or {}).get("error") or task.error or task.last_line
            outs.append(Outcome(f"{task.run_id} ({task.slurm_job_id})", False,
                                error=f"{task.describe}" + (f": {why}" if why else "")))
    left = None
    if all(o.ok for o in outs):  # (the shards are one folder already: the workdir is shared, `inv check` proved it)
        left = data.plan_datagen(t, data.Datagen.of(t, **common), kind="extract", quiet=True).todo
    return {"run_id": rid, "job_id": jid, "outcomes": outs, "left": left,
            "completion": {"mode": "shared filesystem", "moved": 0, "notes": []} if left == 0 else None}


class ExtractedGroup(dict):
    """extract_hosts(): extract_group()'s {outcomes, completion, stopped}."""


class ExtractedArray(dict):
    """extract_one(shards=N): extract_array()'s {run_id, job_id, outcomes, completion, left}, and the dataset."""


def _group_flags(shard=None, rows=None, **_) -> None:
    data._extract_flags(**_)
    if shard or rows:
        raise Refused("with a group, specops splits the rows itself: drop --shard/--rows")


@refusing(_group_flags)
def extract_hosts(hosts: list[Host], *, connect=None, dataset=None, verifier=None, backend="vllm", layers=None,
                  concurrency=32, max_model_len=None, vllm_arg: Optional[list] = None, **_) -> ExtractedGroup:
    """`inv extract --host @group`: each host its share of the rows, then every host every shard."""
    return ExtractedGroup(extract_group(hosts, dataset=dataset, verifier=verifier, backend=backend, layers=layers,
                                        concurrency=concurrency, max_model_len=max_model_len, vllm_arg=vllm_arg,
                                        connect=connect))


def _one_flags(shards=None, shard=None, rows=None, overwrite=False, **kw) -> None:
    data._extract_flags(**kw)
    if shards is not None and (shard or rows or overwrite):
        raise Refused("--shards splits the rows itself (one share per array task): drop --shard/--rows/--overwrite")


@refusing(_one_flags)
def extract_one(t: Transport, *, shards: Optional[int] = None, **kw):
    """`inv extract` on one host: data.extract(), or with shards (a `scheduler: slurm` host) one
    Slurm job array of that many tasks (extract_array)."""
    if shards is None:
        return data.extract(t, **kw)
    keep = ("dataset", "verifier", "backend", "layers", "concurrency", "max_model_len", "vllm_arg", "detach")
    res = extract_array(t, shards, **{k: v for k, v in kw.items() if k in keep})
    return ExtractedArray(res, dataset=kw.get("dataset"))
