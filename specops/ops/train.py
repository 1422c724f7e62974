"""train: `speculators train` as a detached job (remote/specops_host/train/run.py), on hidden states read from the
dataset's files (offline) or generated for each step by the verifier's vLLM server that the job
starts beside the trainer (online: remote/specops_host/train/online.py); `auto` picks one from the disk budget."""

from __future__ import annotations

import json
import shlex
from typing import Optional, Union

from specops import estimate, paths, vocab
from specops.args import USAGE, Refused, refusing
from specops.ops import jobs, watch
from specops.ops.check import SERVE_SKIP, refuse_failed_settings, serve_gate
from specops.config import load_config, revision
from specops.ops.data import data_dir
from specops.errors import SpecopsError
from specops.ops.inspect_data import inspect
from specops.host.remote_exec import run_script
from specops.host.transport import NotDone, Transport
from specops.payloads import HiddenStatesPlan, ServeCheck, TrainSpec
from specops.slurm import cluster, script
from specops_host.serve import drafts

#: --hidden-states: offline (the dataset's files), online (a vLLM server generates them during
#: training), auto (offline when the files are there or fit the disk budget, else online)
HIDDEN_STATES = ("offline", "online", "auto")
#: flags specops sets itself on an online run (the server's address, where its files are read)
ONLINE_RESERVED = ("vllm-endpoint", "hidden-states-path", "hidden-states-backend")
#: how long an online run waits for its server, and how long the server may not answer /health
ONLINE_TIMING = {"server_timeout": 900, "trainer_grace": 120}


def hidden_states_plan(t: Transport, *, data: str, verifier: Optional[str], mode: str = "auto",
                       layers: Optional[str] = None, disk_budget_gb: Optional[float] = None,
                       server_gpus: Optional[str] = None, train_gpus: Optional[str] = None,
                       nproc: Optional[int] = None, vllm_arg: Optional[list] = None,
                       run_id: Optional[str] = None) -> HiddenStatesPlan:
    """Ask the host (remote/specops_host/train/online.py, read-only) which hidden states a run on `data` uses and why:
    {mode: offline|online, reason (both numbers: what the missing rows need, the disk budget),
    rows, files, missing, need_bytes, budget_bytes, layer_ids, server (online: its settings),
    nproc, notes, server_command}. Refuses (SpecopsError) what cannot start; changes nothing."""
    if mode not in HIDDEN_STATES:
        raise SpecopsError(f"--hidden-states {mode!r}: choose offline, online or auto")
    h = t.host
    args = ["--data-dir", data, "--kind", h.profile, "--mode", mode]
    if verifier:
        args += ["--verifier", t.expand(verifier)]
    if layers:
        args += ["--layers", str(layers)]
    if disk_budget_gb is not None:
        args += ["--disk-budget", str(int(float(disk_budget_gb) * 2**30))]
    gpus = h.gpus if h.gpus is not None else (h.slurm.gpus_per_node or None) if h.slurm is not None else None
    if gpus is not None:  # (a Slurm job's: what its allocation gets, not the login node's)
        args += ["--gpus", str(gpus)]
    if server_gpus:
        args += ["--server-gpus", str(server_gpus)]
    if train_gpus:
        args += ["--train-gpus", str(train_gpus)]
    if nproc:
        args += ["--nproc", str(nproc)]
    if run_id:
        args += ["--run-id", run_id]
    args += h.vllm_flags(list(vllm_arg or []))
    res = run_script(t, "train.online", args, changes=False, model=HiddenStatesPlan)
    if not res.ok:
        raise SpecopsError(f"train on {h.name} refused: {res.error}"
                           + ("" if res.error.endswith("(nothing was started)") else " (nothing was started)"))
    return res


def note_plan(t: Transport, plan: HiddenStatesPlan) -> None:
    """The one line that says which hidden states a run uses, and why."""
    t.note(f"hidden states: {plan.mode}" + (f" ({plan.asked} asked)" if plan.asked not in
                                            (None, "auto", plan.mode) else "") + f": {plan.reason}")
    for n in plan.notes:
        t.note(n)


def make_spec(t: Transport, *, config: Optional[str], rid: str, dataset: Optional[str], verifier: Optional[str],
              nproc: Optional[int], overrides: Optional[dict], extra: Optional[dict] = None,
              hidden_states: str = "offline", layers: Optional[str] = None, disk_budget_gb: Optional[float] = None,
              server_gpus: Optional[str] = None, train_gpus: Optional[str] = None,
              vllm_arg: Optional[list] = None, draft: Optional[str] = None) -> TrainSpec:
    """Check the data (refusing before anything starts) and build the run's train spec.
    hidden_states: offline (the dataset's files, as extracted), online (the job starts the
    verifier's vLLM server and the trainer asks it for every row without a file) or auto (the
    host decides from the disk budget; a note says which and why)."""
    h = t.host
    if hidden_states not in HIDDEN_STATES:
        raise SpecopsError(f"--hidden-states {hidden_states!r}: choose offline, online or auto")
    if hidden_states == "offline" and (server_gpus or train_gpus):
        raise SpecopsError("--server-gpus/--train-gpus split GPUs between the vLLM server and the trainer of an "
                           "online run: drop them, or pass --hidden-states online (nothing was started)")
    # (its keys and types first: a dry run shows them)
    cfg = load_config(draft_config(draft, config), h.profile, overrides or {})
    refuse_other_kind(cfg, draft)
    cfg["flag_vocab"] = (overrides or {}).get("draft-vocab-size") is not None
    if hidden_states != "offline":
        if extra and extra.get("nnodes", 1) > 1:
            raise SpecopsError(f"--hidden-states {hidden_states}: online hidden states train on one host; a "
                               f"group trains offline (`inv extract` first) (nothing was started)")
        bad = [k for k in ONLINE_RESERVED if k in cfg["flags"]]
        if bad and hidden_states == "online":
            raise SpecopsError(f"{cfg['path']}: {', '.join(bad)} are set by specops for an online run (its own "
                               f"vLLM server): drop them (nothing was started)")
        plan = hidden_states_plan(t, data=data_dir(t, dataset), verifier=verifier or h.verifier, mode=hidden_states,
                                  layers=layers, disk_budget_gb=disk_budget_gb, server_gpus=server_gpus,
                                  train_gpus=train_gpus, nproc=nproc, vllm_arg=vllm_arg, run_id=rid)
        size_draft_vocab(t, cfg, data_dir(t, dataset), plan.get("verifier_vocab_size"))
        refuse_draft_vocab(cfg, plan.get("verifier_vocab_size"), plan.get("verifier_config"))
        note_plan(t, plan)
        if plan.mode == "online":
            return online_spec(t, plan, cfg, rid)
        if plan.prepared and plan.missing:
            raise SpecopsError(
                f"hidden states: offline ({plan.reason}): write them first with `{t.hint('extract')}`, or "
                f"generate them during training with `--hidden-states online` (nothing was started)")
    procs, nodes = nproc or h.gpus or 1, (extra or {}).get("nnodes", 1)
    if h.profile == "cpu" and procs * nodes > 1:
        raise SpecopsError(
            f"train on {h.name}: a cpu host trains in one process ({nodes} node(s) x {procs} process(es) asked); "
            f"speculators' distributed training needs an accelerator ('No accelerator found'): train on one cpu "
            f"host without --nproc, or on GPU hosts (nothing was started)")
    refuse_failed_settings(t, cfg["flags"])  # settings that failed `inv check --deep` here never start
    data = data_dir(t, dataset)
    summary = inspect(t, data, sample=2, verifier=verifier or h.verifier)
    if summary.format is None or not summary.files:
        raise SpecopsError(f"no extracted data at {data} on {h.name}: run `{t.hint('prepare-data --data F')}` and "
                           f"`{t.hint('extract')}` first (nothing was started)")
    if not summary.ok:
        v = summary.violations[0]
        raise SpecopsError(f"data at {data} fails inspect-data ({v['file']}: {v['what']}): fix it before training "
                           f"(nothing was started)")
    if hidden_states == "offline":  # (auto's plan, offline, sized and said it above: once, as auto)
        size_draft_vocab(t, cfg, data, summary.verifier_vocab_size)
    refuse_draft_vocab(cfg, summary.verifier_vocab_size, summary.verifier_config)
    warn_long(t, data, "offline", summary.get("tokens"), cfg["flags"])
    rec = summary.record or {}
    layer_ids = rec.get("layer_ids")
    if not layer_ids:
        raise SpecopsError(f"{data} has no extraction record (layer ids): re-run `{t.hint('extract')}` for it")
    ver = verifier or rec.get("verifier") or h.verifier
    if not ver:
        raise SpecopsError(f"{data}: no verifier given, recorded at extraction or set for {h.name}: pass --verifier")
    return TrainSpec.of({
        "run_dir": jobs.run_path(t, rid), "kind": h.profile, "nproc": procs, "verifier": t.expand(ver),
        "data": data, "target_layer_ids": layer_ids[:-1], "flags": cfg["flags"], **(extra or {}),
        "hidden_states": "offline", "trust_remote_code": h.trust_flag,
        "record": {"run_id": rid, "specops_revision": revision(), "host_name": h.name, "config_file": cfg["path"],
                   "draft": kind_of(cfg), "config": cfg["flags"], **({"nodes": extra} if extra else {}),
                   "hidden_states": {"mode": "offline", "asked": hidden_states},
                   "data_summary": {k: summary.get(k) for k in (
                       "path", "format", "rows", "files", "bytes", "tokens", "hidden_size", "stored_layers",
                       "record")}},
    })


def draft_config(draft: Optional[str], config: Optional[str]) -> Optional[str]:
    """`--draft KIND`: the kind's own config (configs/KIND.yaml) unless --config names one."""
    if draft is None or config is not None:
        return config
    return str(paths.REPO / str(drafts.KINDS[draft]["config"]))


def kind_of(cfg: dict) -> str:
    """The draft kind a loaded config trains (its speculator-type; speculators' default eagle3)."""
    return str(cfg["flags"].get("speculator-type") or "eagle3")


def refuse_other_kind(cfg: dict, draft: Optional[str]) -> None:
    """`--draft peagle --config configs/eagle3.yaml`: two kinds asked for one run, refused in one line."""
    if draft is not None and kind_of(cfg) != draft:
        raise SpecopsError(f"--draft {draft} with {cfg['path']}, whose speculator-type is {kind_of(cfg)}: drop "
                           f"--config (configs/{draft}.yaml is used) or give a config of speculator-type {draft} "
                           f"(nothing was started)")


def check_draft(draft: Optional[str] = None, **kw) -> None:
    """`inv train`'s flags before anything connects: --draft a kind specops runs, then watch.check_flags()."""
    why = drafts.kind_problem(draft) if draft is not None else None
    if why:
        raise Refused(why, code=USAGE)
    watch.check_flags(**kw)


def size_draft_vocab(t: Transport, cfg: dict, data: str, verifier_vocab: Optional[int]) -> None:
    """The config's draft-vocab-size made a number (auto: from the dataset's token_freq.pt, specops/vocab.py),
    said in one line."""
    flags = cfg["flags"]
    setting = flags.get("draft-vocab-size")
    distinct = vocab.distinct_tokens(t.read_bytes(f"{data}/token_freq.pt", limit=64 << 20))
    where = ("--draft-vocab-size" if cfg.get("flag_vocab") else f"draft-vocab-size {setting} in {cfg['path']}"
             if setting is not None else cfg["path"])
    n, line = vocab.choose(setting, distinct, verifier_vocab, where)
    if n is not None:
        flags["draft-vocab-size"] = n
    t.note(line)


def warn_long(t: Transport, data: str, mode: str, tokens: Optional[int], flags: dict) -> None:
    """One line when the dataset's plan (`inv plan`: plan.json, its measured tokens/s) puts this training
    past estimate.LONG_HOURS, with what would shorten it."""
    if not tokens or flags.get("max-steps"):
        return
    try:
        plan = json.loads(t.read_bytes(f"{data}/plan.json") or b"{}")
        tps = float(plan["measured"]["train"][mode]["tokens_per_s"]["median"])
    except (ValueError, KeyError, TypeError):
        return
    epochs = int(flags.get("epochs") or 1)
    ratio = float(flags.get("train-data-ratio") or estimate.TRAIN_RATIO)
    line = estimate.too_long(epochs * tokens * ratio / tps, tps, epochs=epochs,
                             draft_vocab=plan.get("config_flags", {}).get("draft-vocab-size"),
                             basis=f"the dataset's plan, {plan.get('sample_rows')} row(s) measured")
    if line:
        t.note(f"train: {line}", "warn")


def refuse_draft_vocab(cfg: dict, vocab: Optional[int], where: Optional[str]) -> None:
    """A draft vocabulary larger than the verifier's fails deep in speculators (`IndexError: index
    1024 is out of bounds`): refused at plan time, a dry run shows it."""
    n = cfg["flags"].get("draft-vocab-size")
    if isinstance(vocab, int) and isinstance(n, int) and n > vocab:
        raise SpecopsError(f"{cfg['path']}: draft-vocab-size {n} is larger than the verifier's vocabulary ({vocab} "
                           f"tokens, vocab_size in {where}): set draft-vocab-size to {vocab} or less "
                           f"(configs/demo.yaml has 128) (nothing was started)")


def online_spec(t: Transport, plan: HiddenStatesPlan, cfg: dict, rid: str) -> TrainSpec:
    """The train spec of an online run: the trainer's flags, and the server's settings
    (remote/specops_host/train/online.py)."""
    h = t.host
    refuse_failed_settings(t, cfg["flags"])  # settings that failed `inv check --deep` here never start
    flags = {k: v for k, v in cfg["flags"].items() if k not in ONLINE_RESERVED}
    flags["on-missing"] = "generate"
    if (plan.server or {}).get("trust_remote_code"):  # (the trainer loads the verifier's config and tokenizer too)
        flags.setdefault("trust-remote-code", True)
    timeout = float(flags.get("request-timeout") or 120)  # (speculators' default)
    retries = int(flags["max-retries"]) if flags.get("max-retries") is not None else 3
    timing = {**ONLINE_TIMING, "hang_seconds": max(60.0, timeout * (retries + 1))}
    keep = ("asked", "reason", "rows", "files", "missing", "tokens", "missing_tokens", "need_bytes", "budget_bytes",
            "free_bytes", "file_bytes")
    return TrainSpec.of({
        "run_dir": jobs.run_path(t, rid), "kind": h.profile, "nproc": plan.nproc, "verifier": plan.verifier,
        "data": plan.data_dir, "target_layer_ids": plan.layer_ids[:-1], "flags": flags,
        "hidden_states": "online", "online": plan.server, "online_timing": timing,
        "record": {"run_id": rid, "specops_revision": revision(), "host_name": h.name, "config_file": cfg["path"],
                   "draft": kind_of(cfg), "config": flags,
                   "hidden_states": {"mode": "online", **{k: plan.get(k) for k in keep}, "server": plan.server,
                                     "server_command": plan.server_command},
                   "data_summary": {"path": plan.data_dir, "format": "speculators-0.9", "rows": plan.rows,
                                    "files": plan.files, "bytes": plan.file_bytes, "tokens": plan.tokens,
                                    "hidden_size": plan.hidden_size, "stored_layers": len(plan.layer_ids),
                                    "record": {"layer_ids": plan.layer_ids, "verifier": plan.verifier}}},
    })


def put_spec(t: Transport, spec: Union[TrainSpec, dict], name: str = "train-spec.json") -> str:
    """Write the spec whole where the run lives (a dict is checked as a TrainSpec first)."""
    spec = TrainSpec.of(spec)
    run_dir = spec.run_dir
    t.check(f"mkdir -p {shlex.quote(run_dir)}", "mkdir run dir")
    t.put_text(spec.to_json(), f"{run_dir}/{name}", label="(train spec)")
    return f"{run_dir}/{name}"


def launch_argv(t: Transport, spec_path: str, script: str = "train.run") -> list[str]:
    """A job's command: host script `script` (specops_host.train.run, or check.dist) reading the spec."""
    return [*paths.host_argv(t.expand(t.host.python), script), "--spec", spec_path]


#: the c10d rendezvous port of a Slurm job's torchruns (on the allocation's first node)
RDZV_PORT = 29500


def slurm_settings(t: Transport, hidden_states: str, nodes: Optional[int]) -> str:
    """A slurm host: online hidden states put the vLLM server and the trainer in one allocation of one
    node (remote/specops_host/train/run.py starts the server first, the trainer once it is healthy, and stops the
    server when the trainer ends or Slurm signals the job); several nodes train offline."""
    assert t.host.slurm is not None  # (a slurm host: inventory gives it its slurm: section)
    n = nodes or t.host.slurm.nodes
    if hidden_states == "online" and n > 1:
        raise SpecopsError(f"--hidden-states online on {t.host.name}: the vLLM server and the trainer share one "
                           f"node's allocation; {n} nodes asked: give --nodes 1, or `{t.hint('extract --shards N')}` "
                           f"first and train offline (nothing was submitted)")
    if hidden_states == "auto" and n > 1:
        t.note(f"hidden states: offline (a {n}-node Slurm job on {t.host.name} trains on the dataset's extracted "
               f"files)")
        return "offline"
    return hidden_states


def serve_step(t: Transport, rid: str, spec_path: str, vllm_arg: Optional[list]) -> tuple:
    """A Slurm job's draft-serves preflight: a step on the allocation's first node before the
    trainer (the login node has no GPU to serve on); a failure ends the job with vLLM's root cause
    in one line of its log (remote/specops_host/check/serve.py --job-step)."""
    t.note(f"draft-serves preflight: a step of the Slurm job before the trainer, on its node (vLLM serves the "
           f"verifier with an untrained draft: about 80 s on a 2-core CPU node, a minute or two on a GPU, at once "
           f"when the same setting passed before; {SERVE_SKIP})")
    argv = [*paths.host_argv(t.expand(t.host.python), "check.serve"), "--spec", spec_path,
            "--job-step", jobs.run_path(t, rid, "serve-check.json"), *t.host.vllm_flags(list(vllm_arg or []))]
    return ("draft-serves preflight (remote/specops_host/check/serve.py) before the trainer", argv)


def refuse_running(t: Transport, rid: str) -> list:
    """A run id that is running is refused before anything is written for it (its spec stays).
    Returns the host's jobs."""
    js = jobs.status(t)
    for j in js:
        if j.run_id == rid and not j.ended:
            which = f"Slurm job {getattr(j, 'slurm_job_id', '')}" if t.host.is_slurm else f"pid {j.pid}"
            raise SpecopsError(f"train {rid} is already {j.state.value} on {t.host.name} ({which}): "
                               f"`{t.hint(f'logs -f --run-id {rid}')}` follows it (nothing was changed)")
    return js


#: a run's budget: changed on a resume without asking (train longer); any other setting or the data is asked
BUDGET = frozenset({"epochs", "max-steps"})


def changes_since(t: Transport, rid: str, spec: TrainSpec) -> list[str]:
    """What differs from the run's last start (its run.json): the dataset, the settings (the budget
    aside). Empty for a new run."""
    raw = t.read_bytes(jobs.run_path(t, rid, "run.json"))
    try:
        rec = json.loads(raw) if raw else None
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        return []
    now = spec.record
    out = []
    was_data, now_data = (rec.get("data_summary") or {}).get("path"), (now.get("data_summary") or {}).get("path")
    if was_data and was_data != now_data:
        out.append(f"dataset {was_data} -> {now_data}")
    was, cfg = rec.get("config"), now.get("config") or {}
    if isinstance(was, dict):
        keys = sorted(k for k in set(was) | set(cfg) if k not in BUDGET and was.get(k) != cfg.get(k))
        out += [f"{k} {was.get(k)!r} -> {cfg.get(k)!r}" for k in keys]
    return out


def refuse_new_data(t: Transport, rid: str, spec: TrainSpec, allowed: bool) -> None:
    """Resuming a run id on another dataset or other settings mixes two trainings in one run:
    refused unless asked for (--continue-on-new-data); what changed is recorded in run.json's starts."""
    changed = changes_since(t, rid, spec)
    if changed and not allowed:
        shown = "; ".join(changed[:4]) + (f"; and {len(changed) - 4} more" if len(changed) > 4 else "")
        raise SpecopsError(f"run {rid} on {t.host.name} was trained on other data or settings ({shown}): resuming it "
                           f"mixes them in one run; pass --continue-on-new-data to go on from its checkpoint anyway "
                           f"(run.json keeps every start), or give a new --run-id (nothing was started)")
    spec.record["changed_since_last_start"] = changed


def preflight_serve(t: Transport, spec: TrainSpec, host_jobs: list, *, vllm_arg: Optional[list], enabled: bool,
                    served_by: Optional[str] = None) -> Optional[ServeCheck]:
    """The draft-serves preflight before a training starts (check.serve_gate), unless another
    training holds the host (its GPUs are busy; the start below is refused anyway), or served_by says what served an
    untrained draft of this config already (the bake-off's untrained control: not served twice)."""
    if served_by:
        return None
    busy = [j for j in host_jobs if not j.ended and getattr(j, "lock", None) == "train"]
    if enabled and busy:
        t.note(f"draft-serves preflight: not run while {busy[0].run_id} trains on {t.host.name}")
        return None
    return serve_gate(t, spec.model_dump(), vllm_arg=vllm_arg, enabled=enabled)


def train(t: Transport, *, config: Optional[str] = None, run_id: Optional[str] = None,
          dataset: Optional[str] = None, verifier: Optional[str] = None, nproc: Optional[int] = None,
          overrides: Optional[dict] = None, follow: bool = False, hidden_states: str = "auto",
          layers: Optional[str] = None, disk_budget_gb: Optional[float] = None, server_gpus: Optional[str] = None,
          train_gpus: Optional[str] = None, vllm_arg: Optional[list] = None,
          serve_check: bool = True, continue_on_new_data: bool = False, nodes: Optional[int] = None,
          restarts: Optional[int] = None, stall_after: Optional[float] = None, restart_on_stall: bool = False,
          first_step_after: Optional[float] = None,
          backoff: Optional[float] = None, notify: Optional[str] = None, own: bool = False,
          draft: Optional[str] = None, served_by: Optional[str] = None) -> "Trained":
    """Start (or resume) a run; with follow, wait for its end. Returns run id, exit code (None
    while it runs), run dir, hidden_states (offline|online), serve_check (the draft-serves
    preflight's payload, None when skipped). own: the run is the caller's (a plan's sample run, a
    pipeline's or the demo's training), not the user's: Ctrl-C or SIGTERM stops it (and its vLLM
    server) and says so, where `inv train --follow` detaches from the user's run.
    serve_check: once the inputs are checked and before the job starts, vLLM serves the verifier
    with an untrained draft of the run's configuration for one short request (remote/specops_host/check/serve.py;
    a pass is cached on the host per verifier, draft config and vLLM version); a draft vLLM cannot
    serve is refused with its root cause, nothing started.
    hidden_states: offline | online | auto (default); layers: the layer ids an online run's server
    extracts (default: the dataset's extraction record, else speculators' default); disk_budget_gb:
    what auto allows the hidden states on the host's disk (default: the free space at the data
    dir, less 10%); server_gpus / train_gpus: CUDA_VISIBLE_DEVICES of the server and the trainer
    (default: half and half); vllm_arg: more vLLM server arguments (after the host's).
    nodes: a slurm host's nodes for this run (default: its slurm.nodes): one batch job, one
    torchrun per node (specops/slurm).
    restarts, stall_after, first_step_after, restart_on_stall, backoff, notify: the job's Supervision
    (ops/watch.py supervision(), built here once): restart after an abnormal end, find a stall, tell.
    draft: eagle3 | peagle | dflash (specops_host/serve/drafts.py): its configs/KIND.yaml unless config is given
    (a config of another speculator-type is refused); the run records its kind (run.json `draft`).
    served_by: what served an untrained draft of this config already (the bake-off's untrained control, served before
    its training: ops/controls.py untrained_first): the preflight is not run again."""
    rid = jobs.validate_run_id(run_id or jobs.new_run_id("train"))
    h = t.host
    sup = watch.supervision(t, restarts=restarts, stall_after=stall_after, restart_on_stall=restart_on_stall,
                            first_step_after=first_step_after, backoff=backoff, notify=notify)
    extra = None
    if h.is_slurm and h.slurm is not None:  # (the partition first, before the data is read or anything written)
        hidden_states = slurm_settings(t, hidden_states, nodes)
        cluster.judge_request(t, script.Request.of(h.slurm, nodes=nodes), "train")
        cluster.refuse_unshared(t, "train")
        extra = {"nnodes": nodes or h.slurm.nodes, "scheduler": "slurm", "rdzv_port": RDZV_PORT}
    elif nodes is not None:
        raise SpecopsError(f"--nodes is for a `scheduler: slurm` host; {h.name} is one host (several hosts train "
                           f"with `--host @group`) (nothing was started)")
    spec = make_spec(t, config=config, rid=rid, dataset=dataset, verifier=verifier, nproc=nproc, overrides=overrides,
                     hidden_states=hidden_states, layers=layers, disk_budget_gb=disk_budget_gb,
                     server_gpus=server_gpus, train_gpus=train_gpus, vllm_arg=vllm_arg, extra=extra, draft=draft)
    host_jobs = refuse_running(t, rid)
    refuse_new_data(t, rid, spec, continue_on_new_data)
    served = None if h.is_slurm else preflight_serve(t, spec, host_jobs, vllm_arg=vllm_arg, enabled=serve_check,
                                                      served_by=served_by)
    if h.is_slurm and not serve_check:
        t.note("draft-serves preflight: skipped (--no-serve-check)")
    fresh = not t.exists(spec.run_dir, "-d")
    path = put_spec(t, spec)
    before = [serve_step(t, rid, path, vllm_arg)] if h.is_slurm and serve_check else []
    if watch.worth_saying(sup):
        t.note(f"looked after on {h.name}: {watch.said(sup)}")
    if spec.hidden_states == "online":
        t.would("the job would start the vLLM server: "
                + shlex.join(map(str, spec.record["hidden_states"].get("server_command") or [])))
    try:
        code = jobs.run_attached(t, rid, launch_argv(t, path), kind="train", lock="train", detach=not follow,
                                 stop_on_interrupt=own, term="child", fail_on="nonfinite-loss", nodes=nodes,
                                 before=before, supervision=sup)
    except NotDone:
        raise
    except SpecopsError:
        marker = cluster.RECORD if h.is_slurm else "job.json"
        if fresh and not t.exists(f"{spec.run_dir}/{marker}", "-f"):  # a refused start leaves no run folder
            t.change(f"rm -rf {shlex.quote(spec.run_dir)}")
        raise
    if follow and code not in (None, 0):
        raise jobs.failure(t, rid, "train")
    return Trained({"run_id": rid, "exit_code": code, "run_dir": spec.run_dir, "hidden_states": spec.hidden_states,
                    "serve_check": served, "stopped": code is not None and jobs.was_stopped(t, rid)})


class Trained(dict):
    """train(): {run_id, exit_code (None while it runs), run_dir, hidden_states, serve_check, stopped (by `inv stop`:
    its exit code 0 is no finish)};
    a group's (group.train): {run_id, exit_code, states, nodes: True}."""


@refusing(check_draft)
def train_run(t: Transport, *, epochs: Optional[int] = None, max_steps: Optional[int] = None,
              disk_budget: Optional[float] = None, draft_vocab_size: Optional[str] = None, **kw) -> Trained:
    """`inv train` on one host: train() with --epochs/--max-steps/--draft-vocab-size as overrides and
    --disk-budget in GiB (kw: train()'s; a group's --rdzv-host/--rdzv-port have no use here)."""
    kw.pop("rdzv_host", None), kw.pop("rdzv_port", None)
    return train(t, overrides={"epochs": epochs, "max-steps": max_steps, "draft-vocab-size": draft_vocab_size},
                 disk_budget_gb=disk_budget, **kw)
