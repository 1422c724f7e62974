"""Sharded extraction: each host of a group extracts its contiguous share of the rows
(--shard i/n) into its own workdir, in parallel; then shards.complete_data gives every host all."""

from __future__ import annotations

from typing import Optional

from specops.ops import data
from specops.group.fanout import Outcome, run_on
from specops.inventory import Host
from specops.host.transport import Transport


def extract_sharded(hosts: list[Host], *, dataset=None, verifier=None, backend="vllm", layers=None,
                    concurrency=32, max_model_len=None, vllm_args: Optional[list] = None, dry_run=False,
                    connect=None) -> list[Outcome]:
    n = len(hosts)
    index = {h.name: i for i, h in enumerate(hosts)}

    def one(t: Transport):
        args = data.Datagen.of(t, data=data.data_dir(t, dataset), verifier=data.verifier_path(t, verifier),
                               extract=True, backend=backend, layers=layers, shard=f"{index[t.host.name]}/{n}",
                               concurrency=concurrency, max_model_len=max_model_len,
                               **({"vllm_args": vllm_args} if vllm_args else {}))
        return data.run_datagen(t, args, kind="extract", quiet=True)

    return run_on(hosts, one, dry_run=dry_run, **({"connect": connect} if connect else {}))


def extract_group(hosts: list[Host], *, dataset=None, dry_run=False, connect=None, **kw) -> dict:
    """Each host its share, then (if every share succeeded) every host every shard:
    {"outcomes": [one per host], "completion": how the shards moved, or None}."""
    from specops.group import shards

    outs = extract_sharded(hosts, dataset=dataset, dry_run=dry_run, connect=connect, **kw)
    done = all(o.ok for o in outs) and not dry_run
    return {"outcomes": outs, "completion": shards.complete_data(hosts, dataset) if done else None}
