"""Several hosts, one run: sharded extraction, data completion, and torchrun across nodes.

Node ranks follow the group's order; the c10d rendezvous runs on the first host (its
hosts.yaml address, unless --rdzv-host). Every node's job has the same run id; a node that
fails to start stops the nodes already started.
"""

from __future__ import annotations

import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from . import data, jobs, runs_view, train
from .errors import SpecopsError
from .fanout import Outcome
from .inventory import Host
from .transport import Transport, connect
from .ui import console

DEFAULT_PORT = 29500


def connect_all(hosts: list[Host], dry_run: bool = False) -> list[Transport]:
    with ThreadPoolExecutor(len(hosts)) as pool:
        futs = [pool.submit(connect, h) for h in hosts]
    out, errs = [], []
    for h, f in zip(hosts, futs):
        try:
            out.append(f.result())
            out[-1].dry_run = dry_run
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
           lock: Optional[str], before_start: Optional[Callable[[], object]] = None) -> list[dict]:
    """Build every node's spec first (all checks before anything starts), then start them all;
    if one fails to start, stop the ones already running."""
    specs = [spec_for(t, i) for i, t in enumerate(ts)]
    if before_start:
        before_start()
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
    console.print(f"{kind} {rid} {'would start' if ts[0].dry_run else 'started'} on {len(ts)} nodes: " + ", ".join(
        f"{t.host.name} (rank {i})" for i, t in enumerate(ts)))
    return specs


def checkpoint_epochs(t: Transport, rid: str) -> list[int]:
    """The epoch checkpoints (numeric dirs, not symlinks) of a run on one node, ascending."""
    import shlex

    d = jobs.run_path(t, rid, "checkpoints")
    r = t.run(f"cd {shlex.quote(d)} 2>/dev/null && for e in [0-9]*; do [ -d \"$e\" ] && [ ! -L \"$e\" ] "
              f"&& echo \"$e\"; done; true", changes=False)
    return sorted(int(x) for x in r.stdout.split() if x.isdigit())


def align_checkpoints(ts: list[Transport], rid: str) -> dict:
    """Before a group run starts: every node must hold rank 0's latest epoch checkpoint.
    speculators decides whether to resume from each rank's own --save-path (a node's run dir
    here) and loads the optimizer state on every rank; nodes that disagree would issue different
    collectives and hang. Rank 0's checkpoints are the truth: its latest epoch is copied (through
    the laptop, rsync both ways, only what differs) to the nodes whose copy differs."""
    from .fetch import remote_manifest

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
    if stale and not ts[0].dry_run:
        with tempfile.TemporaryDirectory(prefix="specops-ckpt-") as stage:
            ts[0].sync_down(jobs.run_path(ts[0], rid, rel), stage, partial=True)
            for t in stale:
                t.sync_up(stage, jobs.run_path(t, rid, rel))
    names = [t.host.name for t in stale]
    console.print(f"train {rid}: resuming from rank 0's epoch {head} checkpoint"
                  + (f"; {'would copy' if ts[0].dry_run else 'copied'} it to {', '.join(names)}" if names
                     else "; every node holds it"))
    return {"resume": head, "copied_to": names}


def train_nodes(hosts: list[Host], *, config=None, run_id=None, dataset=None, verifier=None, nproc=None,
                overrides=None, rdzv_host=None, port=DEFAULT_PORT, follow=False, dry_run=False) -> dict:
    rid = jobs.validate_run_id(run_id or jobs.new_run_id("train"))
    ts = connect_all(hosts, dry_run)
    try:
        launch(ts, rid, lambda t, i: train.make_spec(
            t, config=config, rid=rid, dataset=dataset, verifier=verifier, nproc=nproc, overrides=overrides,
            extra=node_extra(hosts, i, nproc, rdzv_host, port)), kind="train", lock="train",
            before_start=lambda: align_checkpoints(ts, rid))
        if dry_run:
            for t in ts:
                print(f"DRY-RUN {t.host.name}: nothing was changed")
            return {"run_id": rid, "exit_code": None, "dry_run": True}
        if not follow:
            return {"run_id": rid, "exit_code": None}
        code = runs_view.follow(ts[0], rid)  # rank 0's log
        if code is None:  # Ctrl-C: detached, every node keeps running
            return {"run_id": rid, "exit_code": None}
        states = wait_ended(ts, rid, timeout=120)
        bad = {n: s for n, s in states.items() if s != "succeeded"}
        if code or bad:
            errors = {t.host.name: jobs.status(t, rid)[0].get("error") for t in ts if t.host.name in bad}
            first = next((f"; {n}: {e}" for n, e in errors.items() if e), "")
            tails = "\n".join(f"--- {t.host.name} (rank {i})\n{jobs.tail(t, rid, 8)}"
                              for i, t in enumerate(ts) if t.host.name in bad)
            raise SpecopsError(f"train {rid}: not every node succeeded ({states}){first}", detail=tails)
        return {"run_id": rid, "exit_code": code, "states": states}
    finally:
        for t in ts:
            t.close()


def wait_ended(ts: list[Transport], rid: str, timeout: float) -> dict:
    """Every node's state once all have ended (or `timeout` seconds have passed)."""
    import time

    t0 = time.time()
    while True:
        states = {t.host.name: jobs.status(t, rid)[0]["state"] for t in ts}
        if all(jobs.ended(s) for s in states.values()) or time.time() - t0 > timeout:
            return states
        time.sleep(1)


def dist_check(hosts: list[Host], *, nproc: int = 1, rdzv_host=None, port=DEFAULT_PORT,
               timeout: float = 300) -> dict:
    """A two-(or more-)node torchrun of remote/dist_check.py: gloo all-reduce across the nodes."""
    import json

    rid = jobs.new_run_id("distcheck")
    ts = connect_all(hosts)
    try:
        launch(ts, rid, lambda t, i: {"program": "dist_check", "run_dir": jobs.run_path(t, rid), "kind": t.host.profile,
                                      **node_extra(hosts, i, nproc, rdzv_host, port)}, kind="dist-check", lock=None)
        states = wait_ended(ts, rid, timeout)
        if not all(jobs.ended(s) for s in states.values()):
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


def extract_sharded(hosts: list[Host], *, dataset=None, verifier=None, backend="vllm", layers=None,
                    concurrency=32, max_model_len=None, dry_run=False) -> list[Outcome]:
    """Each host extracts its contiguous share (--shard i/n) into its own workdir, in parallel."""
    from .fanout import run_on

    n = len(hosts)
    index = {h.name: i for i, h in enumerate(hosts)}

    def one(t: Transport):
        args = data.datagen_args(t, data=data.data_dir(t, dataset), verifier=data.verifier_path(t, verifier),
                                 extract=True, backend=backend, layers=layers, shard=f"{index[t.host.name]}/{n}",
                                 concurrency=concurrency, max_model_len=max_model_len)
        return data.run_datagen(t, args, kind="extract", quiet=True)

    return run_on(hosts, one, dry_run=dry_run)


def complete_data(hosts: list[Host], dataset: Optional[str]) -> dict:
    """Give every host every shard's hidden-states files. Hosts declaring `shared_data` already
    see them; otherwise the files travel through the laptop (rsync both ways, only what is
    missing): hosts cannot be assumed to hold credentials for each other."""
    if all(h.shared_data for h in hosts):
        return {"mode": "shared filesystem", "moved": 0}
    if all(h.reach_peers and h.transport == "ssh" for h in hosts):
        if os.environ.get("SSH_AUTH_SOCK"):
            return peer_sync(hosts, dataset)
        console.print("[yellow]reach_peers: no ssh-agent here (SSH_AUTH_SOCK): the shards go through the "
                      "laptop instead (ssh-add the hosts' key to move them host to host)[/]")
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


def peer_known_hosts(hosts: list[Host]) -> str:
    """The laptop's known_hosts lines for these hosts (strict checking on the hosts too)."""
    import paramiko

    lines = []
    for h in hosts:
        keys = paramiko.HostKeys()
        path = Path(h.known_hosts).expanduser()
        if path.is_file():
            keys.load(str(path))
        name = h.address if h.port == 22 else f"[{h.address}]:{h.port}"
        entry = keys.lookup(name)
        if not entry:
            raise SpecopsError(f"no known host key for {name} ({h.name}) in {path}: connect to it once from here")
        lines += [f"{name} {k.get_name()} {k.get_base64()}" for k in entry.values()]
    return "\n".join(lines) + "\n"


def peer_sync(hosts: list[Host], dataset: Optional[str]) -> dict:
    """Each host pushes the shard files it has to every other host with its own rsync over SSH,
    authenticated by the laptop's forwarded ssh-agent, against known_hosts lines sent from here."""
    import shlex

    from .ssh import SSHTransport

    kh = peer_known_hosts(hosts)
    moved = 0
    for src in hosts:
        t = SSHTransport(src, src.connect_timeout, forward_agent=True)
        t.open()
        try:
            wd = t.expand(src.workdir_path)
            khf = f"{wd}/.specops/peers_known_hosts"
            with tempfile.NamedTemporaryFile("w", delete=False) as f:
                f.write(kh)
            try:
                t.check(f"mkdir -p {shlex.quote(wd)}/.specops", "mkdir")
                t.put(f.name, khf)
            finally:
                os.unlink(f.name)
            src_dir = f"{data.data_dir(t, dataset)}/hidden_states/"
            for dst in hosts:
                if dst.name == src.name:
                    continue
                with connect(dst) as td:
                    dst_dir = f"{data.data_dir(td, dataset)}/hidden_states/"
                    td.check(f"mkdir -p {shlex.quote(dst_dir)}", "mkdir hidden_states")
                ssh = shlex.join(["ssh", "-p", str(dst.port), "-o", "BatchMode=yes", "-o",
                                  f"UserKnownHostsFile={khf}", "-o", "StrictHostKeyChecking=yes"])
                addr = f"[{dst.address}]" if ":" in dst.address else dst.address
                r = t.check(f"rsync -a --ignore-existing --stats -e {shlex.quote(ssh)} --include 'hs_*.safetensors' "
                            f"--exclude '*' {shlex.quote(src_dir)} {shlex.quote(f'{dst.user}@{addr}:{dst_dir}')}",
                            f"rsync {src.name} -> {dst.name}", hint="can this host reach the other over SSH?")
                m = re.search(r"Number of regular files transferred: ([\d,]+)", r.stdout)
                moved += int(m.group(1).replace(",", "")) if m else 0
        finally:
            t.close()
    return {"mode": "host to host", "files": moved}
