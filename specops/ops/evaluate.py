"""evaluate: serve the verifier + a run's draft through vLLM; acceptance beside training accuracy.

evaluate() serves one checkpoint and, with speedup levels (default 1,16), also times it against
the same verifier served without the draft (output tokens/s at each concurrency: `speedup`);
evaluate_checkpoints() serves several in turn (evaluate() for
each), compares their mean acceptance length and, with pick=True, records the best in the run's
record on the host (runs/R/run.json, field best_served), which `inv fetch --checkpoint
best-served` reads.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from pathlib import Path
from typing import Optional

from specops.ops import ceiling as ceilings, checkpoints as ckpts, fetch, jobs
from specops import metrics, paths
from specops.contract import Refused as HostRefused, concurrency_levels
from specops.ops.data import remote_input
from specops.args import Refused, refusing, requests_of
from specops.errors import SpecopsError
from specops.host.remote_exec import progress_args, run_script
from specops.host.transport import NotDone, Transport
from specops.payloads import ServePlan
from specops_host.serve import categories, drafts
from specops_host.serve.speedup import METHODS, requests_given

CAUSES = ("layer ids differ between extraction, training and serving; the vocabulary mapping (d2t/t2d) "
          "does not match the verifier's tokenizer; the chat template drifted between prepare-data and "
          "serving; the extracted hidden states were all zero (inspect-data reports that)")


def gap_flags(ev: dict, train_acc: dict) -> list[str]:
    flags = []
    cond = ev.get("conditional_acceptance_by_position") or []
    for k, acc in enumerate(cond):
        tr = train_acc.get("cond", {}).get(k)
        if tr is not None and tr >= 0.2 and acc < 0.5 * tr:
            flags.append(f"position {k}: served acceptance {acc:.2f} vs training cond_acc {tr:.2f}")
    return flags


def _spec(t: Transport, run_id: str) -> dict:
    jobs.validate_run_id(run_id)  # (its one check: the first thing an evaluation reads is under it)
    spec_raw = t.read_bytes(jobs.run_path(t, run_id, "train-spec.json"))
    if not spec_raw:
        raise SpecopsError(f"evaluate: no training run {run_id!r} on {t.host.name} (no train-spec.json): "
                           f"`{t.hint('status')}` lists the runs")
    return json.loads(spec_raw)


def evaluate(t: Transport, run_id: str, *, checkpoint: str = "best", prompts: Optional[str] = None,
             num_spec_tokens: int = 3, max_prompts: int = 32, max_tokens: int = 64, dest: str = "runs",
             vllm_arg: Optional[list] = None, result_name: str = "evaluation.json",
             write: bool = True, speedup: str = "1,16", beside: bool = False, **timing):
    """One checkpoint served; its evaluation. The host keeps it as
    runs/R/<result_name>; write=True also writes dest/R/evaluation.json and acceptance.png.
    speedup: concurrency levels ("1,16"; "none": not measured) at which the same prompts are
    timed on that server and on the verifier served without the draft (`speedup`, `speedup_at_1`).
    beside: started as a job without the evaluations' lock, not followed (what runs meanwhile
    must not be timed: acceptance only); returns a Pending for finish(). timing: timing_args()'s
    (repeats, tune, tune_k, baselines, speedup_requests, speedup_tokens, side_by_side)."""
    levels = concurrency_levels(speedup)
    spec = _spec(t, run_id)
    extra = timing_args(levels, kind=str((spec.get("flags") or {}).get("speculator-type") or "eagle3"), **timing)
    args = ["--run-dir", jobs.run_path(t, run_id), "--verifier", spec["verifier"], "--kind", t.host.profile,
            "--checkpoint", str(checkpoint), "--num-spec-tokens", str(num_spec_tokens),
            "--max-prompts", str(max_prompts), "--max-tokens", str(max_tokens),
            "--speedup", ",".join(map(str, levels)) or "none", *extra, *progress_args()]
    if prompts:
        args += ["--prompts", remote_input(t, prompts)]
    args += t.host.vllm_flags(list(vllm_arg or []))
    on_laptop = prompts is not None and t.pending(args[args.index("--prompts") + 1])
    if on_laptop:  # (a laptop prompts file is not on the host during a dry run: checked here)
        dry_check_prompts(t, spec["verifier"], str(prompts), levels=levels, max_tokens=max_tokens,
                          speedup_tokens=timing.get("speedup_tokens"), vllm_args=args, max_prompts=max_prompts)
    else:
        plan = run_script(t, "serve.evaluate", args + ["--plan"], changes=False, model=ServePlan)
        if not plan.ok:
            raise SpecopsError(f"evaluate {run_id} on {t.host.name} refused: {plan.error}")
        for i, cmd in enumerate(plan.commands):  # (said under --dry-run: review -tp before GPU hours)
            what = plan.sides[i] if i < len(plan.sides) else "the verifier without the draft"
            t.would(("would start: " if i == 0 else f"then, for the speedup, {what}: would start: ")
                    + shlex.join(map(str, cmd)))
        for s in plan.skipped:
            t.note(f"evaluate: {s['method']} not measured: {s['why']}", "warn")
    eid = f"{run_id}.eval-{time.strftime('%H%M%S')}"
    result = jobs.run_path(t, run_id, *result_name.split("/"))
    argv = [*paths.host_argv(t.expand(t.host.python), "serve.evaluate"), *args, "--result", result]
    pending = Pending(run_id, eid, result, dest, write)
    if beside:
        jobs.start(t, eid, argv, kind="evaluate", uses=[run_id])
        return pending
    code = jobs.run_attached(t, eid, argv, kind="evaluate", lock="evaluate", uses=[run_id])
    return finish(t, pending, code)


def dry_check_prompts(t: Transport, verifier: str, path: str, *, levels: list, max_tokens: int,
                      speedup_tokens: Optional[int], vllm_args: list, max_prompts: int = 32) -> None:
    """A laptop prompts file that a dry run has not sent: checked here by the host's rule
    (specops_host/serve/prompts.py check) against the verifier's config.json read from the host: token
    ids and the length of token-id prompts (a text's length needs the tokenizer: the host's --plan
    counts it before any server; so does a --max-model-len given through vLLM's arguments)."""
    from specops_host.serve import prompts as host_prompts

    try:
        cfg = json.loads(t.read_bytes(f"{verifier}/config.json") or b"null")
    except ValueError:
        cfg = None
    if not isinstance(cfg, dict):
        return
    inner = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    vocab, mpe = inner.get("vocab_size", cfg.get("vocab_size")), inner.get("max_position_embeddings")
    vocab = vocab if type(vocab) is int and vocab > 0 else None
    mpe = mpe if type(mpe) is int and mpe > 0 else None
    own = any(str(x).split("=", 1)[0].replace("_", "-") == "--max-model-len" for x in vllm_args)
    out, why = int(max_tokens), f"--max-tokens {max_tokens}"
    timed = int(speedup_tokens or (256 if t.host.profile == "cuda" else max_tokens)) if levels else 0
    if timed > out:
        out, why = timed, f"the speedup's {timed} tokens per request (--speedup-tokens)"
    try:
        rows, src = host_prompts.file_prompts(path, max_prompts)  # (the ones the evaluation sends)
        host_prompts.check(host_prompts.labelled(rows, src, path), vocab=vocab,
                           vocab_where=f"vocab_size of {verifier}/config.json", out_tokens=out, out_why=why,
                           max_model_len=None if own or not mpe else min(2048, mpe),
                           length_why=f"evaluate's default: 2048, or the verifier's {mpe} positions where fewer")
    except HostRefused as e:  # (the host's rule's refusal, said as the laptop's one line)
        raise SpecopsError(str(e)) from None


TUNE_K = "1,2,3,4,5"  # (an EAGLE-3 draft's; each kind's own: specops_host/serve/drafts.py KINDS tune_k)
DEFAULT_BASELINES = "ngram,suffix"  # (suffix: skipped, with its reason, where the host's vLLM cannot serve it)
TIMING = ("repeats", "tune_k", "baselines", "speedup_requests", "speedup_tokens", "side_by_side", "ceiling")


def timing_args(levels: list, *, repeats: int = 3, tune: bool = False, tune_k: Optional[str] = None,
                baselines: Optional[str] = None, speedup_requests: Optional[int | str] = None,
                speedup_tokens: Optional[int] = None, side_by_side: Optional[int] = None,
                kind: str = "eagle3", ceiling: Optional[str] = None) -> list[str]:
    """The host's options of the speedup's timing (remote/specops_host/serve/evaluate.py); bad values
    one line, before any server starts. kind: the draft's (--tune sweeps its k: up to 8 for peagle and dflash);
    ceiling: acceptance rates the draft is also timed at (vLLM's synthetic acceptance: ops/ceiling.py)."""
    if int(repeats) < 1:
        raise SpecopsError(f"--repeats {repeats}: give 1 or more (each side timed that many times)")
    if (tune or tune_k) and not levels:
        raise SpecopsError("--tune times the draft's settings against the verifier alone: give --speedup levels "
                           "(not none)")
    bad = [m for m in str(baselines or "").split(",") if m.strip() not in ("", "none", *METHODS)]
    if bad:
        raise SpecopsError(f"--baselines {baselines}: the training-free methods are {', '.join(METHODS)} (or none)")
    if baselines not in (None, "", "none") and not levels:
        raise SpecopsError(f"--baselines {baselines} are timed: give --speedup levels (not none)")
    if speedup_tokens is not None and int(speedup_tokens) < 1:
        raise SpecopsError(f"--speedup-tokens {speedup_tokens}: give 1 or more")
    requests = None
    if speedup_requests is not None:
        try:
            requests = requests_of(speedup_requests)
        except SpecopsError as e:
            raise SpecopsError(f"--speedup-requests {speedup_requests}: {e}") from None
        try:  # (the levels it names: the host's own check, before anything connects)
            requests_given(speedup_requests, levels)
        except HostRefused as e:
            raise SpecopsError(str(e)) from None
    out = ["--repeats", str(int(repeats))]
    if tune:  # (--tune: k and async scheduling; --tune-k alone: k only)
        ks = ",".join(map(str, drafts.KINDS[kind]["tune_k"])) if kind in drafts.KINDS else TUNE_K
        out += ["--tune-k", str(tune_k or ks), "--tune-async"]
    elif tune_k:
        out += ["--tune-k", str(tune_k)]
    if baselines not in (None, "", "none"):
        out += ["--baselines", str(baselines)]
    if requests:
        out += ["--speedup-requests", requests]
    if speedup_tokens:
        out += ["--speedup-tokens", str(int(speedup_tokens))]
    if side_by_side is not None and int(side_by_side) < 1:
        raise SpecopsError(f"--side-by-side {side_by_side}: give how many servers are up at once (1 or more)")
    if side_by_side:
        out += ["--side-by-side", str(int(side_by_side))]
    rates = ceilings.rates(ceiling)
    if rates and not levels:
        raise SpecopsError(f"--ceiling {ceiling} is timed against the verifier alone: give --speedup levels (not none)")
    return out + (["--ceiling", ",".join(f"{r:g}" for r in rates)] if rates else [])


@dataclasses.dataclass
class Pending:
    """An evaluation started as a job (evaluate(beside=True)); finish() reads it."""
    run_id: str
    eid: str
    result: str
    dest: str
    write: bool


def finish(t: Transport, p: Pending, code: Optional[int] = None) -> dict:
    """The evaluation of a job that ended with `code` (None: waited for here, its log not shown):
    read, checked, beside the run's training accuracy; written (p.write) to dest."""
    if code is None:
        code = jobs.follow(t, p.eid, write=lambda b: None)[1]
    run_id, eid, result, dest, write = p.run_id, p.eid, p.result, p.dest, p.write
    raw = t.read_bytes(result)
    ev = json.loads(raw) if raw else None
    if code != 0 or not ev or not ev.get("ok"):  # (an input that vanished meanwhile: that line alone)
        raise SpecopsError(f"evaluate {run_id} on {t.host.name} failed: "
                           f"{(ev or {}).get('error') or jobs.status(t, eid)[0].describe}",
                           detail="" if (ev or {}).get("vanished") else jobs.tail(t, eid, 15))
    local = Path(dest) / run_id
    local.mkdir(parents=True, exist_ok=True)
    t.sync_down(jobs.run_path(t, run_id, "logs"), str(local / "logs"))  # the run's TensorBoard events
    if ev.get("speedup", {}).get("files"):  # (vllm bench serve's own result files, and its prompts)
        bench = Path(ev["speedup"]["files"][0]).parent
        t.sync_down(jobs.run_path(t, run_id, *bench.parts), str(local / bench))
        ev["speedup"]["local_dir"] = str(local / bench)
    ev["training_accuracy"] = metrics.training_accuracy(local)
    ev["flags"] = gap_flags(ev, ev["training_accuracy"])
    vs = ceilings.of_run(t, run_id, ev)  # (its own --ceiling's, else its dataset's plan's: ops/ceiling.py)
    if vs:
        ev["versus_ceiling"] = vs
    if ev["flags"]:
        ev["likely_causes"] = CAUSES
    if write:
        (local / "evaluation.json").write_text(json.dumps(ev, indent=1))
        ev["plot"] = plot(ev, local / "acceptance.png")
    return ev


def plot(ev: dict, path: Path) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    acc = ev.get("acceptance_by_position") or []
    tr = ev.get("training_accuracy", {}).get("full", {})
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = list(range(len(acc)))
    ax.bar([x - 0.2 for x in xs], acc, width=0.4, label="served: accepted / drafts")
    ax.bar([x + 0.2 for x in xs], [tr.get(x, 0) for x in xs], width=0.4, label="training: val full_acc")
    ax.set_xlabel("draft position")
    ax.set_ylabel("rate")
    ax.set_ylim(0, 1)
    ax.set_xticks(xs)
    ax.legend()
    ax.set_title(f"mean acceptance length {ev.get('mean_acceptance_length', 0):.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def val_accuracy(t: Transport, run_id: str, name: str) -> Optional[dict]:
    """The checkpoint's own validation accuracies (speculators' checkpoints/N/val_metrics.json):
    {"full": [per position], "cond": [...]}, or None when it has none."""
    raw = t.read_bytes(jobs.run_path(t, run_id, "checkpoints", name, "val_metrics.json"))
    try:
        vm = json.loads(raw) if raw else None
    except ValueError:
        vm = None
    if not isinstance(vm, dict):
        return None
    out: dict = {}
    for kind in ("full", "cond"):
        pos = sorted(int(k[len(kind) + 5:-6]) for k in vm
                     if k.startswith(f"{kind}_acc_") and k.endswith("_epoch") and k[len(kind) + 5:-6].isdigit())
        out[kind] = [vm[f"{kind}_acc_{k}_epoch"] for k in pos]
    return out if out["full"] or out["cond"] else None


ENTRY_KEYS = ("mean_acceptance_length", "acceptance_by_position", "conditional_acceptance_by_position", "counters",
              "draft_acceptance_rate", "prompts", "generated_tokens", "speedup", "speedup_at_1", "seconds",
              "by_category")


def evaluate_checkpoints(t: Transport, run_id: str, checkpoints: str = "all", *, pick: bool = False,
                         prompts: Optional[str] = None, num_spec_tokens: int = 3, max_prompts: int = 32,
                         max_tokens: int = 64, dest: str = "runs", vllm_arg: Optional[list] = None,
                         speedup: str = "none", **timing) -> dict:
    """Each checkpoint (`all` or `0,2,...`) served in turn by evaluate(), on the same prompts
    (speedup: as evaluate's, for each checkpoint; default none: a baseline server per checkpoint
    would double the cost, and the baseline is the same every time). The
    result is the best one's evaluation (by mean acceptance length; the first of equals) with
    "best_checkpoint" and "checkpoints" (one entry per checkpoint: its acceptance, its own
    validation accuracy, flags), written to dest/R/evaluation.json, and acceptance.png (mean
    acceptance length per checkpoint). pick=True records the best in the run's record on the host
    ("picked"). A dry run says every checkpoint's servers and job, then stops (what follows reads them)."""
    concurrency_levels(speedup)  # (bad levels: one line, before any server)
    _spec(t, run_id)  # (an unknown run: the same line as evaluate's)
    names = ckpts.several(t, run_id, checkpoints)
    evs: list[tuple[str, dict]] = []
    stopped: Optional[NotDone] = None
    for i, name in enumerate(names, 1):
        t.note(f"evaluate {run_id}: checkpoint {name} ({i} of {len(names)})")
        try:
            ev = evaluate(t, run_id, checkpoint=name, prompts=prompts, num_spec_tokens=num_spec_tokens,
                          max_prompts=max_prompts, max_tokens=max_tokens, dest=dest, vllm_arg=vllm_arg,
                          result_name=f"evaluation/checkpoint-{name}.json", write=False, speedup=speedup,
                          **timing)
        except NotDone as e:  # (a dry run: this checkpoint's plan is said; the next one's too)
            stopped = e
            continue
        except SpecopsError as e:
            raise SpecopsError(f"checkpoint {name}: {e}", detail=e.detail) from None
        evs.append((name, ev))
    if stopped is not None:
        if pick:
            t.would(f"would record the best of checkpoints {', '.join(names)} as `{fetch.PICK}` in "
                    f"{jobs.run_path(t, run_id, fetch.RUN_RECORD)}")
        raise stopped
    entries = []
    for name, ev in evs:
        val = val_accuracy(t, run_id, name)
        flags = gap_flags(ev, {"cond": dict(enumerate(val["cond"]))}) if val else ev.get("flags", [])
        entries.append({"checkpoint": name, "path": ev.get("checkpoint"), **{k: ev.get(k) for k in ENTRY_KEYS},
                        "val_accuracy": val, "flags": flags})
    best = max(range(len(evs)), key=lambda i: evs[i][1].get("mean_acceptance_length") or 0.0)
    name, ev = evs[best]
    res = {**ev, "best_checkpoint": name, "checkpoints": entries}
    if pick:
        res["picked"] = record_pick(t, run_id, {
            "checkpoint": name, "mean_acceptance_length": ev.get("mean_acceptance_length"),
            "acceptance_by_position": ev.get("acceptance_by_position"), "num_spec_tokens": ev.get("num_spec_tokens"),
            "prompts": ev.get("prompts"), "prompt_source": ev.get("prompt_source"), "evaluated": names,
            "at": time.time()})
    local = Path(dest) / run_id
    (local / "evaluation.json").write_text(json.dumps(res, indent=1))
    res["plot"] = plot_checkpoints(res, local / "acceptance.png")
    return res


def record_pick(t: Transport, run_id: str, pick: dict) -> dict:
    """Set the run's record's best_served field on the host: the record is read, then written
    whole (a temporary file beside it, renamed over it). Returns the pick with where it went."""
    path = jobs.run_path(t, run_id, fetch.RUN_RECORD)
    raw = t.read_bytes(path)
    try:
        rec = json.loads(raw) if raw else {}
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        raise SpecopsError(f"evaluate --pick: {path} on {t.host.name} is not a JSON object: the pick was not "
                           f"recorded (fix or move that file, then run --pick again)")
    rec[fetch.PICK] = pick
    t.put_text(json.dumps(rec, indent=1, default=str), path, label="(run record with the pick)", whole=True)
    return {**pick, "record": path}


def plot_checkpoints(res: dict, path: Path) -> Optional[str]:
    """acceptance.png of several checkpoints: mean acceptance length per checkpoint (the best one
    marked), beside the acceptance per draft position of each."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    entries = res.get("checkpoints") or []
    names = [e["checkpoint"] for e in entries]
    k = res.get("num_spec_tokens") or 0
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = list(range(len(entries)))
    mal = [e.get("mean_acceptance_length") or 0.0 for e in entries]
    a1.plot(xs, mal, "o-", label="served: mean acceptance length")
    if res.get("best_checkpoint") in names:
        b = names.index(res["best_checkpoint"])
        a1.plot([b], [mal[b]], "*", markersize=16, label=f"best: checkpoint {names[b]}")
    a1.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    a1.set_xticks(xs)
    a1.set_xticklabels(names)
    a1.set_xlabel("checkpoint")
    a1.set_ylabel("mean acceptance length")
    a1.set_ylim(0.9, max(k + 1, max(mal, default=1.0)) + 0.1)
    a1.legend()
    for e in entries:
        acc = e.get("acceptance_by_position") or []
        a2.plot(range(len(acc)), acc, "o-", label=f"checkpoint {e['checkpoint']}")
    a2.set_xlabel("draft position")
    a2.set_ylabel("accepted / drafts")
    a2.set_ylim(0, 1)
    a2.set_xticks(list(range(k)))
    if entries:
        a2.legend()
    fig.suptitle(f"{Path(path).parent.name}: acceptance per checkpoint ({res.get('prompts')} prompts, "
                 f"{k} draft tokens)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


@dataclasses.dataclass
class Evaluation:
    """evaluate_run(): one checkpoint's evaluation (`ev`), or with several (`several`) the best's
    with every checkpoint's; run_id and dest say where it was written."""
    run_id: str
    dest: str
    ev: dict
    several: bool = False


def check_prompts_file(path: Optional[str]) -> None:
    """A prompts file on the laptop: at least one prompt in it, every line JSON, a category as text (else one
    line)."""
    p = Path(path).expanduser() if path else None
    if p is None or not p.is_file():
        return  # (a host path: the host's --plan checks it, before any server)
    n = 0
    for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise Refused(f"--prompts {path}: line {i} is not JSON (one {{\"prompt\": ...}} per line)") from None
        try:
            categories.category_of(row, f"--prompts {path}: line {i}")
        except HostRefused as e:
            raise Refused(str(e)) from None
        n += bool(categories.prompt_of(row))
    if not n:
        raise Refused(f"--prompts {path}: no prompt in it (one {{\"prompt\": text or token ids}} per line)")


def _evaluate_flags(run_id: Optional[str] = None, checkpoint: str = "best", checkpoints: Optional[str] = None,
                    pick: bool = False, speedup: Optional[str] = None, prompts: Optional[str] = None,
                    tune: bool = False, **kw) -> None:
    jobs.needs_run_id("evaluate")(run_id=run_id)
    if checkpoints is not None:
        for name in (x.strip() for x in checkpoints.split(",")):
            if name:
                ckpts.spelling("--checkpoints", name, run_id, words=("all",))
    ckpts.spelling("--checkpoint", checkpoint, run_id)
    if checkpoints is not None and checkpoint != "best":
        raise Refused(f"evaluate takes --checkpoint {checkpoint} (one) or --checkpoints {checkpoints} (several), "
                      f"not both")
    if pick and checkpoints is None:
        raise Refused("--pick chooses among checkpoints: add --checkpoints all (or names such as 0,2)")
    if (tune or kw.get("tune_k")) and checkpoints is not None:
        raise Refused("--tune measures one checkpoint's serving settings: drop --checkpoints (or --tune)")
    try:
        levels = concurrency_levels(speedup or ("none" if checkpoints is not None else "1,16"))
        timing_args(levels, tune=tune, **{k: kw[k] for k in TIMING if kw.get(k) is not None})
    except SpecopsError as e:
        raise Refused(str(e)) from None
    check_prompts_file(prompts)


@refusing(_evaluate_flags)
def evaluate_run(t: Transport, run_id: str, *, checkpoint: str = "best", checkpoints: Optional[str] = None,
                 pick: bool = False, speedup: Optional[str] = None, **kw) -> Evaluation:
    """`inv evaluate`: evaluate() of one checkpoint (speedup default 1,16; baselines default
    DEFAULT_BASELINES), or evaluate_checkpoints() of several (speedup and baselines default none);
    kw: evaluate()'s (prompts, num_spec_tokens, ..., dest, and timing_args()'s). With --controls:
    ops/controls.py evaluate_run()."""
    speedup = speedup or ("none" if checkpoints is not None else "1,16")
    if kw.get("baselines") is None:  # (default: beside one checkpoint's timing; not per checkpoint)
        kw["baselines"] = DEFAULT_BASELINES if checkpoints is None and concurrency_levels(speedup) else "none"
    kw = {k: v for k, v in kw.items() if v is not None}
    if checkpoints is not None:
        ev = evaluate_checkpoints(t, run_id, checkpoints, pick=pick, speedup=speedup, **kw)
    else:
        ev = evaluate(t, run_id, checkpoint=checkpoint, speedup=speedup, **kw)
    return Evaluation(run_id, kw.get("dest", "runs"), ev, checkpoints is not None)
