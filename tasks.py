"""specops tasks. `inv --list` for all, `inv --help TASK` for one.

--host defaults to $SPECOPS_HOST, then invoke.yaml's `specops.host`, then the built-in `local`;
`--host @group` or `--host a,b` runs a task on several hosts at once where it makes sense.
--hosts defaults to $SPECOPS_HOSTS, then ./hosts.yaml.
"""


import contextlib

from invoke import Collection, Exit

from specops.ops import bootstrap as _bootstrap
from specops.ops import check as _check
from specops.ops import data as _data
from specops.ops import evaluate as _evaluate
from specops.ops import fetch as _fetch
from specops.ops import inspect_data as _inspect
from specops import inventory, views
from specops.ops import jobs as _jobs
from specops.ops import pipeline as _pipeline
from specops.ops import plan as _plan
from specops.ops import regenerate as _regenerate
from specops.ops import train as _train
from specops.errors import SpecopsError
from specops.cli import errors, hint_args, hosts_file, is_multi, open_host, over, result, session, targets, task

HOST = "host name from hosts.yaml (or `local`), a group `@name` or `a,b`; default $SPECOPS_HOST / invoke.yaml / local"
HOSTS = "inventory file; default $SPECOPS_HOSTS, then ./hosts.yaml"
DRY_RUN = "print the commands and transfers that would change the host; change nothing"
JSON = "print the result as JSON"
DATA = "dataset name under <workdir>/data/ or a path on the host (default: default)"
VERIFIER = "verifier model dir on the host (default: the host's `verifier`)"
OVERWRITE = "replace a dataset prepared from another file or with another --seq-length (never without it)"
VLLM_ARG = "an extra argument for every vLLM server this run starts, after the host's `vllm_args` (repeatable)"
COMMON = {"host": HOST, "hosts": HOSTS}
PLAN_HELP = {"sample": "rows of --data measured (default 32; the first ones)",
             "steps": "training steps measured per mode (default 10; one epoch of the sample at most)",
             "epochs": "epochs of the whole run (default: the config's)",
             "hidden_states": "offline or online: plan that mode only; auto (default): both, and which auto takes"}


def _int(x):
    return None if x is None else int(x)


@task(help={"hosts": HOSTS, "json": JSON})
def hosts(c, hosts=None, json=False):
    """Table of the hosts in hosts.yaml, plus the built-in `local`, and the groups.

    Example: inv hosts"""
    with errors():
        views.hosts(inventory.load(hosts_file(c, hosts)), as_json_=json)


@task(help={**COMMON, "dry_run": DRY_RUN,
            "profile": "profile in bootstrap/profiles/ (default: the host's `profile`)",
            "force": "reinstall the profile even if the venv's stamp matches",
            "wheelhouse": "a folder from `inv wheelhouse`: pushed, then installed with --no-index (air-gapped hosts)"})
def bootstrap(c, host=None, hosts=None, profile=None, force=False, dry_run=False, wheelhouse=None):
    """Create or refresh the host venv from a pinned profile and push specops_host/ (idempotent).

    A `venv_existing` host's venv is only topped up with what it lacks, never upgraded.

    Example: inv bootstrap --host gpu1"""
    over(c, host, hosts, "bootstrap", lambda t: _bootstrap.bootstrap(t, profile=profile, force=force,
                                                                     wheelhouse=wheelhouse), dry_run=dry_run,
         describe=lambda o: f"venv {'created' if o.venv_created else 'present'}, {len(o.pushed)} file(s) pushed, "
                            f"profile {o.install.action}")


@task(iterable=["vllm_arg"],
      help={**COMMON, "json": JSON, "min_free_gb": "free disk the workdir must have (GiB, default 5)",
            "deep": "also train real steps on a tiny fixture with the config's settings, then fallbacks; "
                    "the verdict stays on the host for `inv train`",
            "config": "with --deep: training config (default configs/eagle3.yaml)",
            "all": "with --deep: try every fallback too", "steps": "with --deep: training steps per attempt (default 2)",
            "timeout": "with --deep: seconds per attempt (default 300)",
            "serve": "also have vLLM serve the verifier with an untrained EAGLE-3 draft of the config for one short "
                     "request (the draft-serves preflight `inv train` runs; a pass is cached on the host)",
            "verifier": "with --serve: " + VERIFIER, "layers": "with --serve: the extraction's layer ids, e.g. "
                        "2,30,58,61 (default: --dataset's record, else speculators' default)",
            "dataset": "with --serve: the dataset whose vocabulary (token_freq.pt) and layer ids the draft takes "
                       "(default: none: a uniform vocabulary)", "vllm_arg": "with --serve: " + VLLM_ARG})
def check(c, host=None, hosts=None, json=False, min_free_gb=5.0, deep=False, config=None, all=False, steps=2,
          timeout=300.0, serve=False, verifier=None, layers=None, dataset=None, vllm_arg=None):
    """Preflight on the host: versions, exact imports, devices, disk.

    Run by the host venv's interpreter. --deep: real training steps on a tiny fixture; --serve: vLLM
    serves the verifier with an untrained draft of the config.

    Example: inv check --host gpu1 --deep"""
    over(c, host, hosts, "check", lambda t: _check.preflight(
        t, min_free_gb=float(min_free_gb), deep_steps=deep, config=config, try_all=all, steps=int(steps),
        timeout=float(timeout), serve_draft=serve, verifier=verifier, layers=layers, dataset=dataset,
        vllm_args=list(vllm_arg or [])), judge=_check.judge, describe=views.preflight_summary,
        show=lambda t, r: (views.as_json(r["check"] if r["deep"] is None and r["serve"] is None else r) if json
                           else _show_preflight(t.host.name, r)))


def _show_preflight(name, r):
    views.preflight(name, r)
    if r.get("serve") and r["serve"].get("ok"):
        views.line(_check.serve_line(r["serve"]))


@task(help={**COMMON, "dry_run": DRY_RUN})
def push(c, host=None, hosts=None, dry_run=False):
    """Push specops_host/ (and the profiles) to the host's workdir; only changed files travel.

    Example: inv push --host gpu1"""
    over(c, host, hosts, "push", lambda t: t.ensure_pushed(), dry_run=dry_run,
         show=lambda t, sent: None if t.dry_run else views.line(
             f"push {t.host.name}: " + (f"{len(sent)} file(s) sent" if sent else "already in sync")),
         describe=lambda sent: f"{len(sent)} file(s) sent" if sent else "already in sync")


@task(help={**COMMON, "run_id": "one run (default: all)", "json": JSON,
            "kind": "only runs of these kinds, comma-separated: train, data, extract, evaluate, ..."})
def status(c, host=None, hosts=None, run_id=None, json=False, kind=None):
    """Runs on the host: state, age, GPU memory, last log line.

    Example: inv status --host gpu1 --kind train"""
    kinds = [k.strip() for k in (kind or "").split(",") if k.strip()]

    def rows(t):
        js = _jobs.status(t, run_id)
        return [j for j in js if j.kind in kinds] if kinds else js

    def show(t, rows):
        views.status(t.host.name, rows)
        if run_id and rows and rows[0].kind == "train" and rows[0].ended:  # (its dataset's plan, if any)
            views.plan_versus(_plan.versus(t, run_id))

    outs = over(c, host, hosts, "status", rows, as_json=json, show=show,
                describe=lambda rows: f"{len(rows)} run(s), running: "
                + (", ".join(j.run_id for j in rows if not j.ended) or "none"))
    if is_multi(c, host) and not json:
        for o in outs:
            if o.ok:
                views.status(o.host, o.value)


@task(name="clean", help={**COMMON, "dry_run": DRY_RUN,
                          "older_than": "remove runs older than this (7d, 12h, 30m, ...; required)",
                          "checkpoints": "also runs that hold checkpoints (default: such a run is kept)"})
def clean(c, host=None, hosts=None, older_than=None, checkpoints=False, dry_run=False):
    """Remove old ended runs from the host's runs/ (never a running one; checkpoints only if asked).

    Example: inv clean --host gpu1 --older-than 7d --dry-run"""
    if not older_than:
        raise Exit("specops: clean needs --older-than AGE (e.g. 7d): which runs are old enough to remove")
    try:
        age = _jobs.parse_age(older_than)
    except SpecopsError as e:
        raise Exit(f"specops: {e}", code=2) from None
    with session(c, host, hosts, dry_run) as t:
        views.cleaned(t.host.name, _jobs.clean(t, age, checkpoints=checkpoints), dry_run=t.dry_run)


@task(help={**COMMON, "run_id": "run (default: the newest)", "follow": "follow until the job ends; Ctrl-C detaches only",
            "rank": "with a group: which node's log (default 0, the first host)",
            "task": "a Slurm job array run (`extract --shards N`): which task's log"})
def logs(c, host=None, hosts=None, run_id=None, follow=False, rank=0, task=None):
    """Show a run's log; with -f, follow it (reconnecting if the connection drops).

    Example: inv logs --host gpu1 -f"""
    if is_multi(c, host):
        hs = targets(c, host, hosts)
        if not 0 <= int(rank) < len(hs):
            raise Exit(f"specops: --rank {rank}: the group has ranks 0..{len(hs) - 1}")
        host = hs[int(rank)].name
    with session(c, host, hosts) as t:
        j = _jobs.get(t, run_id)
        if task is None and getattr(j, "array", None):
            raise SpecopsError(f"run {j.run_id} is a Slurm job array of {j.array} tasks, each with its own log: "
                               f"give --task 0..{j.array - 1}")
        if follow:
            if _jobs.run_following(t, j.run_id, task=task):
                raise SpecopsError(f"run {j.run_id} ended: {_jobs.status(t, j.run_id)[0].describe}")
        else:
            log, _ = _jobs.log_files(t, j.run_id, task)
            size = j.subjobs[task].log_bytes if task is not None else j.log_bytes
            views.log(t.read_bytes(log, max(size - (1 << 20), 0)) or b"")


@task(help={**COMMON, "dry_run": DRY_RUN, "run_id": "run to stop", "grace": "seconds between SIGTERM and SIGKILL (default 120)"})
def stop(c, host=None, hosts=None, run_id=None, grace=120.0, dry_run=False):
    """SIGTERM the run's process group, wait for it (checkpoint), SIGKILL after the grace period.

    Example: inv stop --host gpu1 --run-id R"""
    if not run_id:
        raise Exit("specops: stop needs --run-id (`inv status` lists the runs)")
    over(c, host, hosts, f"stop {run_id}", lambda t: _jobs.stop(t, run_id, float(grace)), dry_run=dry_run,
         show=lambda t, r: views.line(f"stop {run_id}: {views.stopped(r)}"), describe=views.stopped)


@task(help={**COMMON, "run_id": "run to fetch (default: the newest)", "dest": "local folder for runs (default runs/)",
            "bwlimit": "rsync bandwidth limit, KiB/s (0: none)",
            "streams": "SSH streams at once (default: from the measured link: 1 on a LAN, up to 8 on a slow one)",
            "checkpoint": "only this checkpoint (a name such as 2, or best-served: the one `inv evaluate "
                          "--checkpoints all --pick` recorded) with the run's logs and records"})
def fetch(c, host=None, hosts=None, run_id=None, dest="runs", bwlimit=0, streams=None, checkpoint=None):
    """Pull a run back: several streams on a slow link, resumable, every file checked against the host's sha256.

    Example: inv fetch --host gpu1 --run-id R"""
    multi = is_multi(c, host)
    if multi and not run_id:
        raise Exit("specops: fetch from a group needs --run-id")
    if multi and checkpoint:
        raise Exit("specops: fetch --checkpoint takes one host (the one the run was evaluated on), not a group")

    def one(t):
        with views.transfer_progress(f"fetch {run_id or 'newest run'} from {t.host.name}") as bar:
            return _fetch.fetch(t, run_id, dest, bwlimit=int(bwlimit), node=multi, streams=_int(streams),
                                on_progress=None if multi else bar, checkpoint=checkpoint)

    over(c, host, hosts, f"fetch {run_id}", one, describe=views.fetched_summary,
         show=lambda t, r: views.fetched_checkpoint(r) if checkpoint else (
             views.fetched(r), views.plan_versus(_plan.versus(t, r["run_id"])), views.next_step(t.hint(f"evaluate --run-id {r['run_id']}"),
                                               "serve the draft with the verifier: acceptance and speedup")))


@task(name="inspect-data", help={**COMMON, "json": JSON, "path": "data directory on the host (default: <workdir>/data/default)",
                                 "sample": "files to load fully (default 8)",
                                 "verifier": "verifier model dir on the host (default: the host's `verifier` "
                                             "or the one recorded at extraction)",
                                 "layers": "expected stored layers per position",
                                 "seed": "which files are loaded fully (default: another sample each run; shown)"})
def inspect_data(c, host=None, hosts=None, path=None, sample=8, verifier=None, layers=None, json=False, seed=None):
    """Prove the data layout (keys, shapes, dtypes, counts) against the contract, in seconds.

    Example: inv inspect-data --host gpu1"""
    def one(t):
        return _inspect.inspect(t, path or f"{t.workdir}/data/default", sample=int(sample),
                                verifier=verifier or t.host.verifier, layers=_int(layers), seed=_int(seed))

    with errors():
        res = over(c, host, hosts, "inspect-data", one, as_json=json, show=lambda t, r: views.inspect(r), group=False)
        _inspect.verdict(res)


@task(name="convert-data", help={**COMMON, "dry_run": DRY_RUN, "src": "legacy v0.3 data dir on the host",
                                 "dst": "new speculators 0.9 data dir on the host (must not exist)",
                                 "verifier": "verifier model dir for the contract check"})
def convert_data(c, host=None, hosts=None, src=None, dst=None, verifier=None, dry_run=False):
    """Convert legacy speculators v0.3 data (rows_*/data_*.pt) to the 0.9 layout, then inspect it.

    Example: inv convert-data --host gpu1 --src /data/old --dataset conv"""
    if not src or not dst:
        raise Exit("specops: convert-data needs --src OLD_DIR and --dst NEW_DIR (paths on the host)")
    with session(c, host, hosts, dry_run) as t:
        res = result(_data.convert(t, src, dst))
        if res is not None:
            views.line(f"converted {res.rows} rows to {res.dst} in {res.seconds}s")
            out = _inspect.inspect(t, dst, sample=8, verifier=verifier or t.host.verifier)
            views.inspect(out)
            _inspect.verdict(out)


@task(name="prepare-data", iterable=["vllm_arg"],
      help={**COMMON, "dry_run": DRY_RUN, "data": "conversations/pre-tokenised .jsonl (a laptop file is uploaded; "
            "otherwise a host path)", "seq_length": "max tokens per row (default 2048)", "dataset": DATA,
            "verifier": VERIFIER, "detach": "start it and return", "vllm_arg": VLLM_ARG, "overwrite": OVERWRITE})
def prepare_data(c, host=None, hosts=None, data=None, seq_length=2048, dataset=None, verifier=None, detach=False,
                 dry_run=False, vllm_arg=None, overwrite=False):
    """Tokenise data with `speculators prepare-data` (starts a vLLM render server for conversations).

    Example: inv prepare-data --host gpu1 --data convs.jsonl"""
    if not data:
        raise Exit("specops: prepare-data needs --data FILE (.jsonl with conversations or input_ids+loss_mask)")
    with session(c, host, hosts, dry_run) as t:
        args = _data.Datagen.of(t, data=_data.data_dir(t, dataset), verifier=_data.verifier_path(t, verifier),
                                prepare=_data.remote_input(t, data), seq_length=int(seq_length),
                                overwrite=overwrite, **_vllm(vllm_arg))
        res = result(_data.run_datagen(t, args, kind="prepare", detach=detach))
        if res:
            views.line(f"prepare-data: {res.get('data_dir', '')} ready (run {res['run_id']})")
            views.next_step(t.hint("extract" + (f" --dataset {dataset}" if dataset else "")),
                            "the verifier's hidden states for these rows; or train online: "
                            + t.hint("train --hidden-states online"))


def _vllm(vllm_arg):
    return {"vllm_args": list(vllm_arg)} if vllm_arg else {}


@task(iterable=["vllm_arg"], help={
    **COMMON, "dry_run": DRY_RUN, "backend": "vllm (default) or hf",
    "layers": "layer ids, e.g. 2,30,58,61 (default speculators' [2, n//2, n-3, n] where valid)",
    "shard": "i/n: this host's share of the rows",
    "shards": "a `scheduler: slurm` host: N tasks of one job array, each a share of the rows on its own GPUs",
    "rows": "a:b: a row range (hf backend)", "dataset": DATA,
    "verifier": VERIFIER, "concurrency": "vLLM requests in flight (default 32)", "detach": "start it and return",
    "max_model_len": "vLLM --max-model-len (default: the data's sequence length)", "vllm_arg": VLLM_ARG,
    "overwrite": "replace hidden states extracted with other layer ids (never relabelled without it)"})
def extract(c, host=None, hosts=None, backend="vllm", layers=None, shard=None, rows=None, dataset=None,
            verifier=None, concurrency=32, detach=False, max_model_len=None, dry_run=False, vllm_arg=None,
            overwrite=False, shards=None):
    """Extract the verifier's hidden states for the prepared rows (resumable; disk budget first).
    With a group, each host extracts its share, then every host gets every shard. A `scheduler:
    slurm` host with --shards N: one job array, a share and a vLLM server per task.

    Example: inv extract --host gpu1 --dataset default"""
    if backend not in ("vllm", "hf"):
        raise Exit(f"specops: --backend {backend!r}: choose vllm or hf")
    if is_multi(c, host):
        from specops.group.fanout import verdict
        from specops.group.extract import extract_group

        if shard or rows:
            raise Exit("specops: with a group, specops splits the rows itself: drop --shard/--rows")
        with errors():
            res = extract_group(targets(c, host, hosts), dataset=dataset, verifier=verifier, backend=backend,
                                layers=layers, concurrency=int(concurrency), max_model_len=_int(max_model_len),
                                dry_run=dry_run, connect=open_host, **_vllm(vllm_arg))
            views.extract_group(res)
            verdict("extract", res["outcomes"])
        if dry_run:
            views.line("extract: then every host would get every shard (DRY-RUN: nothing was changed)")
        return
    if shards is not None:
        from specops.group.fanout import verdict
        from specops.group.extract import extract_array

        if shard or rows or overwrite:
            raise Exit("specops: --shards splits the rows itself (one share per array task): drop --shard/--rows/"
                       "--overwrite")
        with session(c, host, hosts, dry_run) as t, errors():
            res = result(extract_array(t, int(shards), dataset=dataset, verifier=verifier, backend=backend,
                                       layers=layers, concurrency=int(concurrency), max_model_len=_int(max_model_len),
                                       detach=detach, **_vllm(vllm_arg)))
            if res and res["outcomes"]:
                views.extract_array(res)
                verdict("extract", res["outcomes"])
                if res["left"] != 0:
                    raise SpecopsError(f"extract {res['run_id']}: every task succeeded but {res['left']} row(s) of "
                                       f"the dataset still have no hidden states: run the same command again "
                                       f"(extraction resumes)")
                ds = f" --dataset {dataset}" if dataset else ""
                views.next_step(t.hint(f"inspect-data{ds}"), f"then {t.hint(f'train{ds}')}")
        return
    with session(c, host, hosts, dry_run) as t:
        args = _data.Datagen.of(t, data=_data.data_dir(t, dataset), verifier=_data.verifier_path(t, verifier),
                                extract=True, backend=backend, layers=layers, shard=shard, rows=rows,
                                concurrency=int(concurrency), max_model_len=_int(max_model_len), overwrite=overwrite,
                                **_vllm(vllm_arg))
        res = result(_data.run_datagen(t, args, kind="extract", detach=detach))
        if res:
            views.line(f"extract ({backend}): {views.extracted(res)}, layers {res.get('layer_ids')} (run {res['run_id']})")
            ds = f" --dataset {dataset}" if dataset else ""
            views.next_step(t.hint(f"inspect-data{ds}"), f"then {t.hint(f'train{ds}')}")


@task(name="make-verifier", help={**COMMON, "dry_run": DRY_RUN, "path": "where on the host (default "
                                  "<workdir>/models/tiny-<shape>; --learnable: <workdir>/models/learnable-llama)",
                                  "layers": "decoder layers (default: llama 6, kimi 8)",
                                  "hidden": "hidden size (default 256)", "overwrite": "replace a model already there",
                                  "shape": "llama (default) or kimi: Kimi-K2.5's config shape (multimodal wrapper, "
                                           "DeepSeek-V3 MoE text_config, custom code)",
                                  "learnable": "a tiny Llama that learnt the demo's synthetic language on the host's "
                                               "CPU (its drafts can be accepted; a random verifier's never are)",
                                  "seconds": "--learnable: training time cap (default 90; --size 1b: 300, 3b: 600)",
                                  "size": "--learnable: tiny (default, CPU), 1b or 3b (about 1 / 2.8 billion "
                                          "parameters, trained on the host's GPU: verifiers whose drafts show a speedup)"})
def make_verifier(c, host=None, hosts=None, path=None, layers=None, hidden=256, shape="llama", overwrite=False,
                  learnable=False, seconds=None, size="tiny", dry_run=False):
    """Build a small verifier with a local tokenizer on the host (no model hub needed).

    Random, or --learnable (trained on the synthetic language of specops_host/fixtures/synthlang.py: what the
    demo uses). Next: `inv pipeline --verifier PATH --data ...` or set `verifier:` in hosts.yaml.

    Example: inv make-verifier --host gpu1 --learnable --size 1b"""
    if shape not in ("llama", "kimi"):
        raise Exit(f"specops: --shape {shape!r}: choose llama or kimi")
    if size != "tiny" and not learnable:
        raise Exit(f"specops: --size {size} sizes the learnable verifier: add --learnable")
    if learnable and (shape != "llama" or layers or int(hidden) != 256):
        raise Exit("specops: --learnable builds its own shape (4 layers, hidden 128): drop --shape/--layers/--hidden")
    with session(c, host, hosts, dry_run) as t:
        if learnable:
            res = result(_data.make_learnable_verifier(t, path or f"{t.workdir}/{_pipeline.DEMO_VERIFIER}",
                                                       seconds=None if seconds is None else float(seconds),
                                                       overwrite=overwrite, size=size))
            if res is not None:
                views.line(views.learnable_verifier(res))
                views.next_step(t.hint(f"pipeline --verifier {res.path} --data FILE.jsonl"),
                                "or set `verifier:` for the host in hosts.yaml")
            return
        res = result(_data.make_tiny_verifier(t, path or f"{t.workdir}/models/tiny-{shape}", layers=_int(layers),
                                              hidden=int(hidden), shape=shape, overwrite=overwrite))
        if res is not None:
            views.line(f"tiny verifier at {res.path}: {res.layers} layers, hidden {res.hidden}, "
                       f"vocab {res.vocab}, {res.params} parameters")
            views.next_step(t.hint(f"pipeline --verifier {res.path} --data FILE.jsonl"),
                            "or set `verifier:` for the host in hosts.yaml")


HIDDEN_STATES = ("offline: the dataset's files (`inv extract`); online: the run's own vLLM server generates "
                 "them during training, nothing is written to the dataset; auto (default): offline when the files "
                 "are there or fit the disk budget, else online")


@task(iterable=["vllm_arg"], help={
    **COMMON, "dry_run": DRY_RUN, "config": "training config (default configs/eagle3.yaml)",
    "run_id": "run id (default: a new one; an existing one resumes)", "follow": "follow the log",
    "dataset": DATA, "verifier": VERIFIER, "nproc": "processes (GPUs) per host (default: the host's gpus)",
    "epochs": "override the config's epochs", "max_steps": "override: stop after N steps",
    "nodes": "a `scheduler: slurm` host: nodes of the batch job, one torchrun each (default: its slurm.nodes)",
    "rdzv_host": "with a group: rendezvous address of the first host as the others reach it "
                 "(default: its hosts.yaml address)", "rdzv_port": "rendezvous port (default 29500)",
    "hidden_states": HIDDEN_STATES,
    "layers": "online: layer ids the server extracts, e.g. 2,30,58,61 (default: the dataset's extraction record)",
    "disk_budget": "auto: GiB of hidden states the host's disk may hold (default: the free space at the data dir, "
                   "less 10%)",
    "server_gpus": "online, cuda host: the vLLM server's GPUs as CUDA_VISIBLE_DEVICES, e.g. 0-3 (default: the "
                   "first half)",
    "train_gpus": "online, cuda host: the trainer's GPUs, e.g. 4-7 (default: the second half)",
    "vllm_arg": VLLM_ARG,
    "serve_check": "before the job starts, vLLM serves the verifier with an untrained draft of the run's config "
                   "for one short request, and a draft it cannot serve is refused with vLLM's root cause "
                   "(default on, cached on the host per verifier, draft config and vLLM version; a group: the "
                   "first node); --no-serve-check skips it",
    "continue_on_new_data": "resume a run id on another dataset or other settings (refused otherwise; run.json keeps "
                            "every start's data and settings)"})
def train(c, host=None, hosts=None, config=None, run_id=None, follow=False, dataset=None, verifier=None,
          nproc=None, epochs=None, max_steps=None, dry_run=False, rdzv_host=None, rdzv_port=29500,
          hidden_states="auto", layers=None, disk_budget=None, server_gpus=None, train_gpus=None, vllm_arg=None,
          serve_check=True, continue_on_new_data=False, nodes=None):
    """Train the draft with `speculators train` as a detached job that survives the SSH session.

    With a group, one torchrun per host (c10d rendezvous on the first); a `scheduler: slurm` host
    submits a batch job, one torchrun per node (--nodes). --hidden-states online
    runs the verifier's vLLM server beside the trainer, as one run (status, logs, stop). First,
    vLLM serves the verifier with an untrained draft of the config (--no-serve-check skips it).

    Example: inv train --host gpu1 --follow"""
    kw = dict(config=config, run_id=run_id, dataset=dataset, verifier=verifier, nproc=_int(nproc), follow=follow,
              overrides={"epochs": _int(epochs), "max-steps": _int(max_steps)}, serve_check=serve_check)
    if is_multi(c, host):
        from specops.group.train import train_nodes

        if hidden_states == "online" or server_gpus or train_gpus or layers or disk_budget is not None:
            raise Exit("specops: --hidden-states online trains on one host (its own vLLM server); a group trains "
                       "on extracted files: `inv extract` for the group first")
        hs = targets(c, host, hosts)
        with errors():
            res = train_nodes(hs, rdzv_host=rdzv_host, port=int(rdzv_port), dry_run=dry_run, connect=open_host,
                              continue_on_new_data=continue_on_new_data, **kw)
        if dry_run:
            for p in res:
                views.dry_run_done(p.host, p)
        else:
            views.trained("", {**res, "nodes": True}, lambda x: f"inv {x} {hint_args(c, host, hosts)}")
        return
    kw.update(nodes=_int(nodes), hidden_states=hidden_states, layers=layers, server_gpus=server_gpus,
              train_gpus=train_gpus, continue_on_new_data=continue_on_new_data,
              disk_budget_gb=None if disk_budget is None else float(disk_budget), vllm_args=list(vllm_arg or []))
    over(c, host, hosts, "train", lambda t: _train.train(t, **kw), dry_run=dry_run, group=False,
         show=lambda t, r: views.trained(t.host.name, r, t.hint))


@task(iterable=["vllm_arg"], help={
    **COMMON, "dry_run": DRY_RUN, "data": "conversations/prompts .json or .jsonl (a laptop file is uploaded; "
    "otherwise a host path)", "out": "output name: <workdir>/regenerated/NAME.jsonl on the host "
    "(default: <data's name>-regen)", "verifier": VERIFIER,
    "max_tokens": "a response's token cap (default 4096; prompt + response must fit the server's max model len)",
    "concurrency": "requests in flight (default 32)", "limit": "only the first N prompts",
    "sampling_params": "JSON merged into every request, e.g. '{\"temperature\": 0.6, \"top_p\": 0.95}'",
    "max_model_len": "the server's --max-model-len (default: the verifier's)", "detach": "start it and return",
    "vllm_arg": VLLM_ARG})
def regenerate(c, host=None, hosts=None, data=None, out=None, verifier=None, max_tokens=4096, concurrency=32,
               limit=None, sampling_params=None, max_model_len=None, detach=False, dry_run=False, vllm_arg=None):
    """Have the verifier answer a dataset's prompts itself (speculators regenerate-responses).

    `speculators regenerate-responses` against a managed vLLM server of the verifier; the output
    goes through `inv prepare-data --data <it>`.

    Example: inv regenerate --host gpu1 --data prompts.jsonl"""
    if not data:
        raise Exit("specops: regenerate needs --data FILE (.jsonl of conversations or prompts)")
    with session(c, host, hosts, dry_run) as t:
        res = result(_regenerate.regenerate(t, data=data, out=out, verifier=verifier, max_tokens=int(max_tokens),
                                            concurrency=int(concurrency), limit=_int(limit),
                                            sampling_params=sampling_params, max_model_len=_int(max_model_len),
                                            vllm_args=list(vllm_arg or []), detach=detach))
        if res:
            views.line(f"regenerate: {res['rows']} row(s) of verifier responses for {res['prompts']} prompt(s) -> "
                       f"{res['out']}" + (f" ({res['errors']} failed: {res['errors_file']})" if res["errors"] else "")
                       + f" (run {res['run_id']}); next: `{res['next']}`")


@task(iterable=["vllm_arg"], help={
    **COMMON, "dry_run": DRY_RUN, "data": "conversations .jsonl (laptop file or host path)",
    "dataset": DATA, "verifier": VERIFIER, "backend": "vllm (default) or hf", "layers": "layer ids",
    "seq_length": "max tokens per row (default 2048)", "config": "training config",
    "dest": "local folder for runs (default runs/)", "max_steps": "override: stop training after N steps",
    "regenerate": "first have the verifier answer the prompts (`inv regenerate`): train on its own responses",
    "hidden_states": "offline (default: extracted files), online (the training's own vLLM server, nothing stored) "
                     "or auto (offline when the files fit the disk budget)",
    "disk_budget": "auto: GiB of hidden states the host's disk may hold (default: the free space, less 10%)",
    "vllm_arg": VLLM_ARG, "plan_first": "first `inv plan` (measured on a sample, priced), then stop unless --yes",
    "yes": "with --plan-first: go on with the run once the plan is shown", "sample": PLAN_HELP["sample"]})
def pipeline(c, host=None, hosts=None, data=None, dataset=None, verifier=None, backend="vllm", layers=None,
             seq_length=2048, config=None, dest="runs", max_steps=None, regenerate=False, hidden_states="offline",
             disk_budget=None, dry_run=False, vllm_arg=None, plan_first=False, yes=False, sample=32):
    """bootstrap, check, [regenerate,] prepare-data, extract, inspect-data, train, fetch: the whole job on one host.

    Example: inv pipeline --host gpu1 --data convs.jsonl"""
    if not data:
        raise Exit("specops: pipeline needs --data FILE (.jsonl)")
    if yes and not plan_first:
        raise Exit("specops: --yes answers --plan-first: add --plan-first (or drop --yes)", code=2)
    with session(c, host, hosts, dry_run) as t:
        if plan_first:
            p = result(_plan.measure(t, data_file=data, dataset=dataset, verifier=verifier, config=config, layers=layers,
                              seq_length=int(seq_length), sample=int(sample), hidden_states=hidden_states,
                              backend=backend, vllm_args=list(vllm_arg or []),
                              disk_budget_gb=None if disk_budget is None else float(disk_budget)))
            if p is None:  # --dry-run: the plan of the plan
                return
            views.plan(p)
            if not yes:
                views.next_step(t.hint(f"pipeline --data {data} --plan-first --yes" + (
                    f" --dataset {dataset}" if dataset else "") + f" --hidden-states {hidden_states}"),
                    "nothing spent beyond the plan: --yes runs it")
                return
        _pipeline.run(t, data_file=data, dataset=dataset, verifier=verifier, backend=backend, layers=layers,
                      seq_length=int(seq_length), config=config, dest=dest, on_inspect=views.inspect,
                      overrides={"max-steps": int(max_steps)} if max_steps else None, regenerate=regenerate,
                      hidden_states=hidden_states, vllm_args=list(vllm_arg or []),
                      disk_budget_gb=None if disk_budget is None else float(disk_budget))


@task(name="plan", iterable=["vllm_arg"], help={
    **COMMON, "dry_run": DRY_RUN, "json": JSON, "data": "conversations/pre-tokenised .jsonl (laptop file or host path)",
    "dataset": DATA, "verifier": VERIFIER, "config": "training config (default configs/eagle3.yaml)",
    "layers": "layer ids", "seq_length": "max tokens per row (default 2048)", "backend": "vllm (default) or hf",
    "disk_budget": "auto: GiB of hidden states the host's disk may hold (default: the free space, less 10%)",
    "vllm_arg": VLLM_ARG, **PLAN_HELP})
def plan(c, host=None, hosts=None, data=None, dataset=None, verifier=None, config=None, layers=None, seq_length=2048,
         epochs=None, hidden_states="auto", sample=32, steps=10, backend="vllm", disk_budget=None, vllm_arg=None,
         json=False, dry_run=False):
    """Measure a short sample of the real stages on the host and price the whole run.

    prepare + extract on --sample rows, a few training steps offline and online (the real verifier
    and config), then per mode: stage | tokens | hours | disk | GPU-hours | cost, what auto takes and
    why; kept with the dataset (plan.json), shown beside the actual hours by status and fetch.

    Example: inv plan --host gpu1 --data convs.jsonl --config configs/eagle3.yaml"""
    if not data:
        raise Exit("specops: plan needs --data FILE (.jsonl: the rows the run will train on)", code=2)
    if is_multi(c, host):
        raise Exit("specops: plan measures one host: give --host NAME (the host the run will use)", code=2)
    with session(c, host, hosts, dry_run) as t:
        with views.progress_to_stderr() if json else contextlib.nullcontext():
            p = result(_plan.measure(t, data_file=data, dataset=dataset, verifier=verifier, config=config, layers=layers,
                              seq_length=int(seq_length), sample=int(sample), steps=int(steps), epochs=_int(epochs),
                              hidden_states=hidden_states, backend=backend, vllm_args=list(vllm_arg or []),
                              disk_budget_gb=None if disk_budget is None else float(disk_budget)))
        if p is not None:
            views.as_json(p) if json else views.plan(p)
            if not json:
                views.next_step(t.hint(f"pipeline --data {data} --hidden-states {p['auto']['mode']}"
                                       + (f" --dataset {dataset}" if dataset else "")), "the run this plan priced")


@task(help={**COMMON, "dry_run": DRY_RUN, "host": "the host (default: the built-in local, on CPU; a cuda host trains "
                                                  "a 1B verifier on its GPU and serves the drafts with CUDA graphs)",
            "dest": "local folder for runs (default runs/)", "steps": "stop training after N steps",
            "evaluate": "serve the trained draft and its controls through vLLM at the end (default on; "
                        "--no-evaluate skips it)",
            "speedup": "concurrency levels at which the trained draft's output tokens/s is timed against the "
                       "verifier served without it (default 1,16; none skips it; on a CPU near 1, can be below)"})
def demo(c, host="local", hosts=None, dest="runs", steps=None, evaluate=True, speedup="1,16", dry_run=False):
    """The whole pipeline on a learnable verifier, ending with its draft served by vLLM.

    On `local` (CPU) a tiny verifier that learnt a synthetic language; on a cuda host one of about
    1B parameters trained on its GPU. Its draft is trained, then served by vLLM: mean acceptance
    length beside untrained and wrong-layers drafts, and the speedup over the verifier alone.

    Example: inv demo"""
    with session(c, host, hosts, dry_run) as t:
        res = result(_pipeline.demo(t, dest=dest, steps=_int(steps), on_inspect=views.inspect,
                                    evaluate_drafts=evaluate, speedup=speedup))
        if res and res.get("acceptance"):
            views.demo_acceptance(res)
        if res and res.get("stages"):
            views.demo_stages(res["stages"])


@task(iterable=["vllm_arg"], help={**COMMON, "json": JSON, "run_id": "the training run", "vllm_arg": VLLM_ARG,
            "checkpoint": "best (default) or an epoch number",
            "checkpoints": "several checkpoints served in turn: all, or names such as 0,2 (instead of --checkpoint)",
            "pick": "with --checkpoints: record the best by served mean acceptance length in the run's record "
                    "(`inv fetch --checkpoint best-served` brings it)",
            "prompts": "jsonl of {\"prompt\": text or token ids} (default: the run's validation split)",
            "num_spec_tokens": "draft tokens per step (default 3)", "max_prompts": "default 32",
            "max_tokens": "tokens generated per prompt (default 64)", "dest": "local folder for runs (default runs/)",
            "speedup": "concurrency levels at which output tokens/s is timed with the draft and on the same verifier "
                       "served without it (same prompts and settings; CUDA graphs unless --enforce-eager): default "
                       "1,16 for one checkpoint, none with --checkpoints (give levels to time each checkpoint); "
                       "none skips it",
            "dry_run": DRY_RUN})
def evaluate(c, host=None, hosts=None, run_id=None, checkpoint="best", checkpoints=None, pick=False, prompts=None,
             num_spec_tokens=3, max_prompts=32, max_tokens=64, dest="runs", speedup=None, json=False, dry_run=False,
             vllm_arg=None):
    """Serve verifier + draft through vLLM; acceptance per position beside training accuracy.

    Example: inv evaluate --host gpu1 --run-id R"""
    if not run_id:
        raise Exit("specops: evaluate needs --run-id (`inv status` lists the runs)")
    if checkpoints is not None and checkpoint != "best":
        raise Exit(f"specops: evaluate takes --checkpoint {checkpoint} (one) or --checkpoints {checkpoints} "
                   f"(several), not both")
    if pick and checkpoints is None:
        raise Exit("specops: --pick chooses among checkpoints: add --checkpoints all (or names such as 0,2)")
    kw = dict(prompts=prompts, num_spec_tokens=int(num_spec_tokens), max_prompts=int(max_prompts),
              max_tokens=int(max_tokens), dest=dest, **_vllm(vllm_arg),
              speedup=speedup if speedup is not None else ("none" if checkpoints is not None else "1,16"))

    def show(t, ev):
        views.evaluation(run_id, ev, _evaluate.CAUSES)
        views.line(f"evaluation written to {dest}/{run_id}/evaluation.json (on the host: runs/{run_id}/)"
                   + (f"; plot {ev['plot']}" if ev.get("plot") else ""))

    if checkpoints is not None:
        over(c, host, hosts, "evaluate", lambda t: _evaluate.evaluate_checkpoints(t, run_id, checkpoints, pick=pick, **kw),
             show=lambda t, r: views.evaluation_checkpoints(run_id, r, dest, _evaluate.CAUSES, t.hint), as_json=json,
             dry_run=dry_run, group=False)
        return
    over(c, host, hosts, "evaluate", lambda t: _evaluate.evaluate(t, run_id, checkpoint=checkpoint, **kw), show=show,
         as_json=json, dry_run=dry_run, group=False)


@task(name="dist-check", help={"host": "a group (@name) or a comma-separated list of hosts", "hosts": HOSTS,
                               "nproc": "processes per host (default 1)", "rdzv_host": "rendezvous address of "
                               "the first host (default: its hosts.yaml address)", "rdzv_port": "default 29500",
                               "nodes": "a `scheduler: slurm` host: nodes of the batch job (default: its slurm.nodes)"})
def dist_check(c, host=None, hosts=None, nproc=1, rdzv_host=None, rdzv_port=29500, nodes=None):
    """Prove a multi-node launch: torchrun on every host, c10d rendezvous, gloo all-reduce.

    A `scheduler: slurm` host: one batch job, one torchrun per node (--nodes).

    Example: inv dist-check --host @pair"""
    from specops.group.distcheck import dist_check as _dist_check

    with errors():
        res = _dist_check(targets(c, host, hosts), nproc=int(nproc), rdzv_host=rdzv_host, port=int(rdzv_port),
                          connect=open_host, nodes=_int(nodes))
    r0 = res["ranks"][0]
    views.line(f"dist-check {res['run_id']}: world {r0['world']}, all-reduce sum {r0['sum']} (want {r0['want']}) on "
               f"every rank: " + ", ".join(f"rank {x['rank']}@node {x['ranks'][x['rank']]['node_rank']}"
                                           for x in res["ranks"]))


@task(help={"profile": "profile in bootstrap/profiles/ (cuda, cpu)", "python": "the host interpreter's version "
            "(default 3.12)", "platform": "the host's wheel platform (default: the host's glibc with --host, else "
            "the profile's default; lower manylinux tags are included)",
            "dest": "folder (default wheelhouse/<profile>-py<python>-<platform>)",
            "have": "`pip list --format=freeze` of an existing host venv: download only what it lacks",
            "host": "read --have (and the platform) from this host's venv instead (its venv must exist)",
            "hosts": HOSTS, "skip": "comma-separated profile packages to leave out",
            "laptop": "also specops' own laptop-side dependencies, into DEST/laptop/"})
def wheelhouse(c, profile=None, python="3.12", platform=None, dest=None, have=None, host=None, hosts=None, skip="",
               laptop=False):
    """Download a profile's wheels on this machine for a host with no package index.

    pip's resolver and `pip download --only-binary` for the host's Python and platform; with
    --have/--host only what an existing venv lacks, the profile picked for its torch.

    Example: inv wheelhouse --profile cuda --host gpu1"""
    from specops.ops import wheelhouse as _wh

    if not profile:
        raise Exit("specops: wheelhouse needs --profile (cuda or cpu)")
    if have and host:
        raise Exit("specops: give --have FILE or --host H, not both")
    with errors():
        have_map, source = (_wh.read_have(have), str(have)) if have else (None, "")
        if host:
            with session(c, host, hosts) as t:
                got = _wh.host_environment(t, python, platform)
            have_map, source, platform = got["installed"], got["source"], platform or got["platform"]
        man = _wh.build(profile, python=python, platform=platform, dest=dest, have=have_map, have_source=source,
                        skip=[x for x in skip.split(",") if x.strip()], laptop=laptop,
                        note=lambda s: views.line(f"[specops] {s}"))
    for ln in _wh.summary_lines(man):
        views.line(ln)


ns = Collection(hosts, bootstrap, check, push, status, clean, logs, stop, fetch, inspect_data, convert_data,
                prepare_data, extract, make_verifier, train, regenerate, plan, pipeline, demo, dist_check, wheelhouse,
                evaluate)
ns.configure({"specops": {"host": None, "hosts": None}})
