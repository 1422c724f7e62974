"""specops tasks. `inv --list` for all, `inv --help TASK` for one.

--host defaults to $SPECOPS_HOST, then invoke.yaml's `specops.host`, then the built-in `local`.
--hosts defaults to $SPECOPS_HOSTS, then ./hosts.yaml.
"""

from pathlib import Path

from invoke import Collection, Exit, task
from rich.table import Table

from specops import bootstrap as _bootstrap
from specops import check as _check
from specops import inspect as _inspect
from specops import inventory
from specops import multinode as _multi
from specops.cli import errors, fan, hosts_file, is_multi, session, targets
from specops.errors import SpecopsError
from specops import data as _data
from specops import evaluate as _evaluate
from specops import fetch as _fetch
from specops import jobs as _jobs
from specops import metrics as _metrics
from specops import pipeline as _pipeline
from specops import runs_view
from specops import train as _train
from specops.push import push as _push
from specops.ui import console

HOST = "host name from hosts.yaml (or `local`); default $SPECOPS_HOST / invoke.yaml / local"
HOSTS = "inventory file; default $SPECOPS_HOSTS, then ./hosts.yaml"
DRY_RUN = "print the commands and transfers that would change the host; change nothing"


@task(help={"hosts": HOSTS})
def hosts(c, hosts=None):
    """Table of the hosts in hosts.yaml, plus the built-in `local`."""
    with errors():
        inv = inventory.load(hosts_file(c, hosts))
    tab = Table(title=f"hosts ({inv.where})")
    for col in ("name", "target", "profile", "gpus", "venv", "workdir", "verifier"):
        tab.add_column(col)
    for name in inv.names():
        h = inv.hosts[name]
        tab.add_row(name, h.target, h.profile, "" if h.gpus is None else str(h.gpus),
                    h.venv_path, h.workdir_path, h.verifier or "")
    console.print(tab)
    for g, members in sorted(inv.groups.items()):
        console.print(f"group @{g}: {', '.join(members)}")


@task(help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS,
            "profile": "profile in bootstrap/profiles/ (default: the host's `profile`)",
            "force": "reinstall the profile even if the venv's stamp matches",
            "wheelhouse": "a folder from `inv wheelhouse`: pushed, then installed with --no-index (air-gapped hosts)"})
def bootstrap(c, host=None, hosts=None, profile=None, force=False, dry_run=False, wheelhouse=None):
    """Create or refresh the host venv from a pinned profile and push remote/ (idempotent).

    A `venv_existing` host's venv is only topped up with what it lacks, never upgraded."""
    if is_multi(c, host, hosts):
        fan(c, host, hosts, "bootstrap", lambda t: _bootstrap.bootstrap(t, profile=profile, force=force,
                                                                        wheelhouse=wheelhouse),
            describe=lambda o: f"venv {'created' if o.venv_created else 'present'}, {len(o.pushed)} file(s) "
                               f"pushed, profile {o.install.get('action')}", dry_run=dry_run)
        return
    with session(c, host, hosts, dry_run) as t:
        _bootstrap.bootstrap(t, profile=profile, force=force, wheelhouse=wheelhouse)


@task(help={"host": HOST, "hosts": HOSTS, "json": "print the raw result as JSON",
            "min_free_gb": "free disk the workdir must have (GiB, default 5)",
            "deep": "also train real steps on a tiny fixture with the config's settings, then fallbacks; "
                    "the verdict stays on the host for `inv train`", "config": "with --deep: training config "
                    "(default configs/eagle3.yaml)", "all": "with --deep: try every fallback too",
            "steps": "with --deep: training steps per attempt (default 2)",
            "timeout": "with --deep: seconds per attempt (default 300)"})
def check(c, host=None, hosts=None, json=False, min_free_gb=5.0, deep=False, config=None, all=False, steps=2,
          timeout=300.0):
    """Preflight, run by the host venv's interpreter: versions, imports, devices, disk (--deep: training steps)."""
    if is_multi(c, host, hosts) and not deep:
        def one(t):
            res = _check.check(t, min_free_gb=float(min_free_gb))
            _check.verdict(t.host.name, res)
            return res

        fan(c, host, hosts, "check", one, describe=lambda r: "all hard checks pass; " + ", ".join(
            f"{x['name']}: {x['value']}" for x in r["rows"] if x["name"] in ("version torch", "version speculators")))
        return
    with session(c, host, hosts) as t:
        res = _check.check(t, min_free_gb=float(min_free_gb))
        _check.render(t.host.name, res, as_json=json)
        _check.verdict(t.host.name, res)
        if deep:
            out = _check.deep(t, config=config, try_all=all, steps=int(steps), timeout=float(timeout))
            if json:
                import json as _json

                print(_json.dumps(out, indent=1))
            else:
                _check.render_deep(t.host.name, out)
            _check.deep_verdict(t.host.name, out)


@task(help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS})
def push(c, host=None, hosts=None, dry_run=False):
    """Push remote/ (and the profiles) to the host's workdir; only changed files travel."""
    with session(c, host, hosts, dry_run) as t:
        sent = _push(t)
        if not t.dry_run:
            console.print(f"push {t.host.name}: " + (f"{len(sent)} file(s) sent" if sent else "already in sync"))


@task(help={"host": HOST, "hosts": HOSTS, "run_id": "one run (default: all)", "json": "print JSON"})
def status(c, host=None, hosts=None, run_id=None, json=False):
    """Runs on the host: state, age, GPU memory, last log line."""
    import json as _json

    if is_multi(c, host, hosts):
        outs = fan(c, host, hosts, "status", lambda t: _jobs.status(t, run_id),
                   describe=lambda rows: f"{len(rows)} run(s), running: "
                   + (", ".join(j["run_id"] for j in rows if j["state"] == "running") or "none"))
        for o in outs:
            console.print(runs_view.status_table(o.host, o.value))
        return
    with session(c, host, hosts) as t:
        rows = _jobs.status(t, run_id)
        if json:
            print(_json.dumps(rows, indent=1))
        else:
            console.print(runs_view.status_table(t.host.name, rows))


@task(help={"host": HOST, "hosts": HOSTS, "run_id": "run (default: the newest)",
            "follow": "follow until the job ends; Ctrl-C detaches only",
            "rank": "with a group: which node's log (default 0, the first host)"})
def logs(c, host=None, hosts=None, run_id=None, follow=False, rank=0):
    """Show a run's log; with -f, follow it (reconnecting if the connection drops)."""
    if is_multi(c, host, hosts):
        hs = targets(c, host, hosts)
        if not 0 <= int(rank) < len(hs):
            raise Exit(f"specops: --rank {rank}: the group has ranks 0..{len(hs) - 1}")
        host = hs[int(rank)].name
    with session(c, host, hosts) as t:
        j = _jobs.get(t, run_id)
        if follow:
            code = runs_view.follow(t, j["run_id"])
            if code:
                raise SpecopsError(f"run {j['run_id']} ended: {_jobs.status(t, j['run_id'])[0]['state']}")
        else:
            data = t.read_bytes(_jobs.run_path(t, j["run_id"], "output.log"), max(j["log_bytes"] - (1 << 20), 0))
            print((data or b"").decode(errors="replace"), end="")


@task(help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS, "run_id": "run to stop",
            "grace": "seconds between SIGTERM and SIGKILL (default 120)"})
def stop(c, host=None, hosts=None, run_id=None, grace=120.0, dry_run=False):
    """SIGTERM the run's process group, wait for it (checkpoint), SIGKILL after the grace period."""
    if not run_id:
        raise Exit("specops: stop needs --run-id (`inv status` lists the runs)")
    if is_multi(c, host, hosts):
        fan(c, host, hosts, f"stop {run_id}", lambda t: _jobs.stop(t, run_id, float(grace)),
            describe=lambda r: r["state"], dry_run=dry_run)
        return
    with session(c, host, hosts, dry_run) as t:
        res = _jobs.stop(t, run_id, float(grace))
        console.print(f"stop {run_id}: {res['state']}" + (f" after {res.get('seconds')}s" if "seconds" in res else "")
                      + (" (SIGKILL needed)" if res.get("sigkill") else ""))


@task(help={"host": HOST, "hosts": HOSTS, "run_id": "run to fetch (default: the newest)",
            "dest": "local folder for runs (default runs/)", "bwlimit": "rsync bandwidth limit, KiB/s (0: none)"})
def fetch(c, host=None, hosts=None, run_id=None, dest="runs", bwlimit=0):
    """Pull a run back: incremental, resumable, every file checked against the host's sha256."""
    if is_multi(c, host, hosts):
        if not run_id:
            raise Exit("specops: fetch from a group needs --run-id")
        fan(c, host, hosts, f"fetch {run_id}",
            lambda t: _fetch.fetch_run(t, run_id, dest, bwlimit=int(bwlimit),
                                       into=Path(dest) / run_id / "nodes" / t.host.name),
            describe=lambda r: f"{r['files']} files, {r['bytes'] / 2**20:.1f} MiB verified in {r['dest']}")
        return
    with session(c, host, hosts) as t:
        rid = run_id or _jobs.get(t, None)["run_id"]
        res = _fetch.fetch_run(t, rid, dest, bwlimit=int(bwlimit))
        m = _metrics.write(Path(res["dest"]))
        console.print(f"fetch {rid}: {res['files']} file(s), {res['bytes'] / 2**20:.1f} MiB verified "
                      f"(sha256) in {res['dest']}; {m['records']} metric records"
                      + (f", plot {m['plot']}" if m["plot"] else ""))


@task(name="inspect-data", help={"host": HOST, "hosts": HOSTS,
                                 "path": "data directory on the host (default: <workdir>/data/default)",
                                 "sample": "files to load fully (default 8)",
                                 "verifier": "verifier model dir on the host (default: the host's `verifier` "
                                             "or the one recorded at extraction)",
                                 "layers": "expected stored layers per position", "json": "print JSON"})
def inspect_data(c, host=None, hosts=None, path=None, sample=8, verifier=None, layers=None, json=False):
    """Prove the data layout (keys, shapes, dtypes, counts) against the contract, in seconds."""
    with session(c, host, hosts) as t:
        res = _inspect.inspect(t, path or f"{t.host.workdir_path}/data/default", sample=int(sample),
                               verifier=verifier or t.host.verifier,
                               layers=None if layers is None else int(layers))
        _inspect.render(res, as_json=json)
        _inspect.verdict(res)


@task(name="convert-data", help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS, "src": "legacy v0.3 data dir on the host",
                                 "dst": "new speculators 0.9 data dir on the host (must not exist)",
                                 "verifier": "verifier model dir for the contract check"})
def convert_data(c, host=None, hosts=None, src=None, dst=None, verifier=None, dry_run=False):
    """Convert legacy speculators v0.3 data (rows_*/data_*.pt) to the 0.9 layout, then inspect it."""
    if not src or not dst:
        raise Exit("specops: convert-data needs --src OLD_DIR and --dst NEW_DIR (paths on the host)")
    with session(c, host, hosts, dry_run) as t:
        res = _data.convert(t, src, dst)
        if t.dry_run:
            return
        console.print(f"converted {res['rows']} rows to {res['dst']} in {res['seconds']}s")
        out = _inspect.inspect(t, dst, sample=8, verifier=verifier or t.host.verifier)
        _inspect.render(out)
        _inspect.verdict(out)


DATA = "dataset name under <workdir>/data/ or a path on the host (default: default)"
VERIFIER = "verifier model dir on the host (default: the host's `verifier`)"


@task(name="prepare-data", help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS, "data": "conversations/pre-tokenised .jsonl "
                                 "(a laptop file is uploaded; otherwise a host path)", "seq_length": "max tokens "
                                 "per row (default 2048)", "dataset": DATA, "verifier": VERIFIER,
                                 "detach": "start it and return"})
def prepare_data(c, host=None, hosts=None, data=None, seq_length=2048, dataset=None, verifier=None, detach=False, dry_run=False):
    """Tokenise data with `speculators prepare-data` (starts a vLLM render server for conversations)."""
    if not data:
        raise Exit("specops: prepare-data needs --data FILE (.jsonl with conversations or input_ids+loss_mask)")
    with session(c, host, hosts, dry_run) as t:
        args = _data.datagen_args(t, data=_data.data_dir(t, dataset), verifier=_data.verifier_path(t, verifier),
                                  prepare=_data.remote_input(t, data), seq_length=int(seq_length))
        res = _data.run_datagen(t, args, kind="prepare", detach=detach)
        if not t.dry_run:
            console.print(f"prepare-data: {res.get('data_dir', '')} ready (run {res['run_id']})")


@task(help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS, "backend": "vllm (default) or hf", "layers": "layer ids, e.g. 2,30,58,61 "
            "(default speculators' [2, n//2, n-3, n] where valid)", "shard": "i/n: this host's share of the rows",
            "rows": "a:b: a row range (hf backend)", "dataset": DATA, "verifier": VERIFIER,
            "concurrency": "vLLM requests in flight (default 32)", "detach": "start it and return",
            "max_model_len": "vLLM --max-model-len"})
def extract(c, host=None, hosts=None, backend="vllm", layers=None, shard=None, rows=None, dataset=None,
            verifier=None, concurrency=32, detach=False, max_model_len=None, dry_run=False):
    """Extract the verifier's hidden states for the prepared rows (resumable; disk budget first)."""
    if backend not in ("vllm", "hf"):
        raise Exit(f"specops: --backend {backend!r}: choose vllm or hf")
    if is_multi(c, host, hosts):
        if shard or rows:
            raise Exit("specops: with a group, specops splits the rows itself: drop --shard/--rows")
        hs = targets(c, host, hosts)
        outs = _multi.extract_sharded(hs, dataset=dataset, verifier=verifier, backend=backend, layers=layers,
                                      concurrency=int(concurrency), max_model_len=max_model_len, dry_run=dry_run)
        from specops import fanout
        console.print(fanout.table(f"extract ({len(hs)} hosts)", outs, lambda r: "DRY-RUN" if r.get("dry_run") else (
            f"rows {r['rows'][0]}:{r['rows'][1]}, {r.get('extract', {}).get('tokens')} tokens, "
            f"{r.get('extract', {}).get('tokens_per_s')} tokens/s")))
        with errors():
            fanout.verdict("extract", outs)
            if dry_run:
                console.print("extract: then every host would get every shard (DRY-RUN: nothing was changed)")
                return
            res = _multi.complete_data(hs, dataset)
        console.print(f"extract: every host now holds all shards ({res['mode']})")
        return
    with session(c, host, hosts, dry_run) as t:
        args = _data.datagen_args(t, data=_data.data_dir(t, dataset), verifier=_data.verifier_path(t, verifier),
                                  extract=True, backend=backend, layers=layers, shard=shard, rows=rows,
                                  concurrency=int(concurrency), max_model_len=max_model_len)
        res = _data.run_datagen(t, args, kind="extract", detach=detach)
        ex = res.get("extract", {})
        if not t.dry_run and not res.get("detached"):
            console.print(f"extract ({backend}): {ex.get('tokens')} tokens in {ex.get('seconds')}s "
                      f"({ex.get('tokens_per_s')} tokens/s), layers {res.get('layer_ids')} (run {res['run_id']})")


@task(name="make-verifier", help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS, "path": "where on the host (default "
                                  "<workdir>/models/tiny-llama)", "layers": "decoder layers (default 6)",
                                  "hidden": "hidden size (default 256)"})
def make_verifier(c, host=None, hosts=None, path=None, layers=6, hidden=256, dry_run=False):
    """Build a tiny random Llama verifier + local tokenizer on the host (no model hub needed)."""
    with session(c, host, hosts, dry_run) as t:
        res = _data.make_tiny_verifier(t, path or f"{t.host.workdir_path}/models/tiny-llama",
                                       layers=int(layers), hidden=int(hidden))
        if not t.dry_run:
            console.print(f"tiny verifier at {res['path']}: {res['layers']} layers, hidden {res['hidden']}, "
                      f"vocab {res['vocab']}, {res['params']} parameters")


@task(help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS, "config": "training config (default configs/eagle3.yaml)",
            "run_id": "run id (default: a new one; an existing one resumes)", "follow": "follow the log",
            "dataset": DATA, "verifier": VERIFIER, "nproc": "processes (GPUs) per host (default: the host's gpus)",
            "epochs": "override the config's epochs", "max_steps": "override: stop after N steps",
            "rdzv_host": "with a group: rendezvous address of the first host as the others reach it "
                         "(default: its hosts.yaml address)", "rdzv_port": "rendezvous port (default 29500)"})
def train(c, host=None, hosts=None, config=None, run_id=None, follow=False, dataset=None, verifier=None,
          nproc=None, epochs=None, max_steps=None, dry_run=False, rdzv_host=None, rdzv_port=29500):
    """Train the draft with `speculators train` as a detached job (survives the SSH session);
    with a group, one torchrun per host (c10d rendezvous on the first)."""
    overrides = {"epochs": epochs and int(epochs), "max-steps": max_steps and int(max_steps)}
    if is_multi(c, host, hosts):
        with errors():
            res = _multi.train_nodes(targets(c, host, hosts), config=config, run_id=run_id, dataset=dataset,
                                     verifier=verifier, nproc=None if nproc is None else int(nproc),
                                     overrides=overrides, rdzv_host=rdzv_host, port=int(rdzv_port), follow=follow,
                                     dry_run=dry_run)
        if res.get("dry_run"):
            return
        console.print(f"train {res['run_id']}: " + ("started on every node (`inv logs -f --host ...` follows rank 0)"
                                                      if res["exit_code"] is None else f"every node succeeded ({res['states']})"))
        return
    with session(c, host, hosts, dry_run) as t:
        res = _train.train(t, config=config, run_id=run_id, dataset=dataset, verifier=verifier,
                           nproc=None if nproc is None else int(nproc), follow=follow, overrides=overrides)
        if not t.dry_run:
            console.print(f"train {res['run_id']} on {t.host.name}: "
                      + ("started (`inv logs -f` follows it)" if res["exit_code"] is None else
                         f"finished (exit {res['exit_code']}); `inv fetch --run-id {res['run_id']}` brings it back"))


@task(help={"dry_run": DRY_RUN, "host": HOST, "hosts": HOSTS, "data": "conversations .jsonl (laptop file or host path)",
            "dataset": DATA, "verifier": VERIFIER, "backend": "vllm (default) or hf", "layers": "layer ids",
            "seq_length": "max tokens per row (default 2048)", "config": "training config",
            "dest": "local folder for runs (default runs/)", "max_steps": "override: stop training after N steps"})
def pipeline(c, host=None, hosts=None, data=None, dataset=None, verifier=None, backend="vllm", layers=None,
             seq_length=2048, config=None, dest="runs", max_steps=None, dry_run=False):
    """bootstrap, check, prepare-data, extract, inspect-data, train, fetch: the whole job on one host."""
    if not data:
        raise Exit("specops: pipeline needs --data FILE (.jsonl)")
    with session(c, host, hosts, dry_run) as t:
        _pipeline.run(t, data_file=data, dataset=dataset, verifier=verifier, backend=backend, layers=layers,
                      seq_length=int(seq_length), config=config, dest=dest,
                      overrides={"max-steps": int(max_steps)} if max_steps else None)


@task(help={"dry_run": DRY_RUN, "host": "a cpu-profile host (default: the built-in local)", "hosts": HOSTS,
            "dest": "local folder for runs (default runs/)", "steps": "stop training after N steps"})
def demo(c, host="local", hosts=None, dest="runs", steps=None, dry_run=False):
    """The whole pipeline on `local` with a tiny random verifier built on the fly, on CPU."""
    with session(c, host, hosts, dry_run) as t:
        _pipeline.demo(t, dest=dest, steps=int(steps) if steps else None)


@task(help={"host": HOST, "hosts": HOSTS, "run_id": "the training run", "checkpoint": "best (default) or an "
            "epoch number", "prompts": "jsonl of {\"prompt\": text or token ids} (default: the run's validation "
            "split)", "num_spec_tokens": "draft tokens per step (default 3)", "max_prompts": "default 32",
            "max_tokens": "tokens generated per prompt (default 64)", "dest": "local folder for runs (default runs/)"})
def evaluate(c, host=None, hosts=None, run_id=None, checkpoint="best", prompts=None, num_spec_tokens=3,
             max_prompts=32, max_tokens=64, dest="runs"):
    """Serve verifier + draft through vLLM; acceptance per position beside training accuracy."""
    if not run_id:
        raise Exit("specops: evaluate needs --run-id (`inv status` lists the runs)")
    with session(c, host, hosts) as t:
        ev = _evaluate.evaluate(t, run_id, checkpoint=checkpoint, prompts=prompts,
                                num_spec_tokens=int(num_spec_tokens), max_prompts=int(max_prompts),
                                max_tokens=int(max_tokens), dest=dest)
        _evaluate.render(run_id, ev)
        console.print(f"evaluation written to {dest}/{run_id}/evaluation.json (on the host: runs/{run_id}/)"
                      + (f"; plot {ev['plot']}" if ev.get("plot") else ""))


@task(name="dist-check", help={"host": "a group (@name) or a comma-separated list of hosts", "hosts": HOSTS,
                               "nproc": "processes per host (default 1)", "rdzv_host": "rendezvous address of "
                               "the first host (default: its hosts.yaml address)", "rdzv_port": "default 29500"})
def dist_check(c, host=None, hosts=None, nproc=1, rdzv_host=None, rdzv_port=29500):
    """Prove a multi-node launch: torchrun on every host, c10d rendezvous, gloo all-reduce."""
    with errors():
        res = _multi.dist_check(targets(c, host, hosts), nproc=int(nproc), rdzv_host=rdzv_host, port=int(rdzv_port))
    r0 = res["ranks"][0]
    console.print(f"dist-check {res['run_id']}: world {r0['world']}, all-reduce sum {r0['sum']} "
                  f"(want {r0['want']}) on every rank: " + ", ".join(
                      f"rank {x['rank']}@node {x['ranks'][x['rank']]['node_rank']}" for x in res["ranks"]))


@task(help={"profile": "profile in bootstrap/profiles/ (cuda, cpu)", "python": "the host interpreter's version "
            "(default 3.12)", "platform": "the host's wheel platform (default manylinux_2_28_x86_64; lower "
            "manylinux tags are included)", "dest": "folder (default wheelhouse/<profile>-py<python>-<platform>)",
            "have": "`pip list --format=freeze` of an existing host venv: download only what it lacks",
            "host": "read --have from this host's venv instead (its venv must exist)", "hosts": HOSTS,
            "skip": "comma-separated profile packages to leave out", "laptop": "also specops' own laptop-side "
            "dependencies, into DEST/laptop/"})
def wheelhouse(c, profile=None, python="3.12", platform="manylinux_2_28_x86_64", dest=None, have=None, host=None,
               hosts=None, skip="", laptop=False):
    """Download a profile's wheels on this machine (pip download --only-binary) for an air-gapped host."""
    from specops import wheelhouse as _wh

    if not profile:
        raise Exit("specops: wheelhouse needs --profile (cuda or cpu)")
    if have and host:
        raise Exit("specops: give --have FILE or --host H, not both")
    with errors():
        have_map, source = None, ""
        if have:
            have_map, source = _wh.read_have(have), str(have)
        elif host:
            from specops.remote_exec import run_script

            with session(c, host, hosts) as t:
                _push(t)
                res = run_script(t, "install_profile", ["--list-installed"], changes=False)
                have_map, source = res["installed"], f"{t.host.name}:{t.host.venv_path}"
                if res.get("python") and res["python"] != python:
                    raise SpecopsError(f"{t.host.name}'s venv is Python {res['python']}, not {python}: "
                                       f"pass --python {res['python']}")
        man = _wh.build(profile, python=python, platform=platform, dest=dest, have=have_map, have_source=source,
                        skip=[x for x in skip.split(",") if x.strip()], laptop=laptop, say=console.print)
    _wh.report(man)


ns = Collection(hosts, bootstrap, check, push, status, logs, stop, fetch, inspect_data, convert_data,
                prepare_data, extract, make_verifier, train, pipeline, demo, dist_check, wheelhouse, evaluate)
ns.configure({"specops": {"host": None, "hosts": None}})
