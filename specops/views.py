"""The one place that renders: results for a terminal (rich) and for a pipe (plain lines, nothing cut), JSON where
asked; the connection's notes and followed logs through specops.terminal (its names are this module's too). Library
modules return data and hand progress lines to their connection; only these two modules write to the screen."""

from __future__ import annotations

import json as _json
import math
import sys
from typing import Any, Callable, Iterable, Optional, Sequence

from pydantic_core import to_jsonable_python
from rich.markup import escape
from rich.table import Table

from specops.host.transport import Plan
from specops.terminal import (console, err_console, is_terminal, job_log, line, live_line, log, note,  # noqa: F401
                              progress_to_stderr, set_dry, set_verbose, transfer_progress, verbose)


def as_json(obj: Any) -> None:
    """Any result (pydantic models, dataclasses, dicts of them) as JSON on stdout."""
    print(_json.dumps(to_jsonable_python(obj, fallback=str), indent=1), flush=True)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A table: rich on a terminal; on a pipe, a '# title' line then one tab-separated line per
    row, header first, nothing cut or wrapped (so `inv status | grep RUN` finds the row)."""
    rows = [["" if c is None else str(c) for c in r] for r in rows]
    if is_terminal():
        tab = Table(title=escape(title))
        for col in columns:
            tab.add_column(escape(col), overflow="fold")
        for r in rows:
            tab.add_row(*[escape(c) for c in r])
        return console.print(tab)
    print(f"# {title}\n" + "\t".join(columns))
    for r in rows:
        print("\t".join(c.replace("\t", " ").replace("\n", " ") for c in r))
    sys.stdout.flush()


def mark(ok: Optional[bool], hard: bool = True) -> str:
    return {True: "✓", False: "✗" if hard else "!", None: "·"}[ok]


# -- results ------------------------------------------------------------------------------
def hosts(inv, json_: bool = False) -> None:
    rows = []
    for name in inv.names():
        h = inv.hosts[name]
        rows.append([name, h.target, h.profile, "" if h.gpus is None else h.gpus, h.venv_path, h.workdir_path,
                     h.verifier or ""])
    if json_:
        as_json({"hosts": [dict(zip(("name", "target", "profile", "gpus", "venv", "workdir", "verifier"), r))
                           for r in rows], "groups": inv.groups})
        return
    table(f"hosts ({inv.where})", ("name", "target", "profile", "gpus", "venv", "workdir", "verifier"), rows)
    for g, members in sorted(inv.groups.items()):
        line(f"group @{g}: {', '.join(members)}")


def age(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def status(host: str, jobs: list) -> None:
    """One row per run, then one per job it started itself (`RUN/server`: an online run's vLLM server)."""
    def row(j, name):
        pid = j.pid or (f"job {j.slurm_job_id}" if getattr(j, "slurm_job_id", None) else "")  # (Slurm's job id)
        return [name, j.kind, j.describe, age(j.age_s), pid, "" if j.gpu_mib is None else j.gpu_mib, j.last_line]

    table(f"runs on {host}", ("run id", "kind", "state", "age", "pid", "GPU MiB", "last line"),
          [r for j in jobs for r in [row(j, j.run_id), *(row(s, f"{j.run_id}/{s.run_id}") for s in j.subjobs)]])


def stopped(r) -> str:
    if r.already:  # (an ended or lost run: stop signalled nothing)
        return (f"not running ({r.state}{f': {r.detail}' if r.detail else ''}): nothing was signalled"
                + ("; marked stopped, as no process carrying its tag is left (`inv clean` can remove it now)"
                   if r.marked else ""))
    return f"{r.state}{f' after {r.seconds}s' if r.seconds is not None else ''}{' (SIGKILL needed)' * r.sigkill}"


def outcomes(title: str, outs: list, describe: Callable[[Any], str] = str) -> None:
    """One row per host of a group operation (a failing host is a row, not an exception)."""
    def said(o):
        return (o.error.split("\n")[0] if not o.ok else f"DRY-RUN: {plan_summary(o.value)}" if isinstance(o.value, Plan)
                else "" if o.value is None else describe(o.value))
    table(title, ("host", "", "result"), [[o.host, mark(o.ok), said(o)] for o in outs])


def check(name: str, res) -> None:
    table(f"check {name}", ("", "check", "value", "hint"),
          [[mark(r.ok, r.hard), r.name, r.value, r.hint] for r in res.rows])


def deep(name: str, res: dict) -> None:
    rows = []
    for i, r in enumerate(res["results"]):
        s = r["settings"]
        what = f"loss {r['loss']:.4g}" if r["ok"] and r.get("loss") is not None else (r.get("error") or "")
        rows.append([mark(r["ok"]), s["draft-attn-impl"] + (" (configured)" if i == 0 else ""),
                     s["loss-implementation"], "on" if s.get("compile") else "off", r["seconds"], what])
    table(f"check {name} --deep: {res.get('steps')} training step(s) on a tiny fixture "
          f"({res.get('gpu') or res.get('kind')}; torch {res['versions'].get('torch')}, "
          f"speculators {res['versions'].get('speculators')})",
          ("", "attention", "loss", "compile", "seconds", "result"), rows)


def inspect(res: dict) -> None:
    line(f"{res['path']}: format {res.get('format') or 'unknown'}, {res.get('rows', '?')} rows, "
         f"{res.get('files', 0)} files, {res.get('bytes', 0) / 2**20:.1f} MiB, {res.get('tokens', '?')} tokens, "
         f"hidden {res.get('hidden_size')} (verifier {res.get('verifier_hidden_size')}), "
         f"stored layers {res.get('stored_layers')} (expected {res.get('expected_layers')}); {res.get('seconds')}s",
         "bold")
    if res.get("keys"):
        table("tensors", ("key", "dtype", "ndim", "files"),
              [[k["key"], k["dtype"], k["ndim"], k["files"]] for k in res["keys"]])
    if res.get("sampled") and isinstance(res["sampled"][0], dict):
        table(f"{len(res['sampled'])} of {res.get('files')} file(s) fully loaded (seed {res.get('seed')}: "
              f"--seed {res.get('seed')} loads the same ones)", ("row", "file", "seq", "loss_mask sum", "|h| mean"),
              [[s["row"], s["file"], s["seq"], s["loss_mask_sum"], s["abs_mean"]] for s in res["sampled"]])
    for w in res.get("warnings", []):
        line(f"! {w['file']}: {w['what']}", "yellow")
    for v in res.get("violations", [])[:20]:
        line(f"✗ {v['file']}: {v['what']}", "red")
    line("verdict: OK" if res["ok"] else f"verdict: {res['n_violations']} violation(s)",
         "green" if res["ok"] else "red")


def inspect_brief(res: dict) -> None:
    """inspect-data inside the pipeline or the demo: its summary and verdict on one line, a
    violation a line each (-v: the whole report, as `inv inspect-data` shows it)."""
    if verbose() or not res["ok"]:
        return inspect(res)
    line(f"inspect-data {res['path']}: {res.get('rows', '?')} rows, {res.get('files', 0)} files, "
         f"{res.get('tokens', '?')} tokens, stored layers {res.get('stored_layers')} of hidden "
         f"{res.get('hidden_size')}; {len(res.get('sampled') or [])} file(s) fully loaded; verdict: OK")


def evaluation(run_id: str, ev: dict, causes: str) -> None:
    acc = ev.get("acceptance_by_position") or []
    cond = ev.get("conditional_acceptance_by_position") or []
    tr = ev.get("training_accuracy") or {}

    def f(x):
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"

    table(f"acceptance of {run_id} served by vLLM ({ev['prompts']} prompts, {ev['num_spec_tokens']} "
          f"speculative tokens)",
          ("position", "accepted (of drafts)", "conditional", "train val full_acc", "train val cond_acc"),
          [[k, f(acc[k]), f(cond[k] if k < len(cond) else None), f(tr.get("full", {}).get(k)),
            f(tr.get("cond", {}).get(k))] for k in range(len(acc))])
    c = ev["counters"]
    line(f"mean acceptance length {ev.get('mean_acceptance_length', float('nan')):.3f} "
         f"(drafts {c['drafts']:.0f}, draft tokens {c['draft_tokens']:.0f}, accepted {c['accepted']:.0f})")
    free = {m: x for m, x in (ev.get("free_acceptance") or {}).items() if "error" not in x}  # (ngram, suffix: on the
    # same prompts, greedy: tokens a verifier step; one that failed there is said below)
    if ev.get("by_category"):  # (each category's share of the spec-decode counters; a speedup times all prompts)
        table("acceptance by category (the prompts' \"category\")", ("category", "prompts", "tokens", "mean acceptance "
              "length", *[f"accepted at {i}" for i in range(len(acc))], *[f"{m}: tokens a step" for m in free]),
              [[c, e["prompts"], e["generated_tokens"], f(e.get("mean_acceptance_length")),
                *map(f, e.get("acceptance_by_position") or []),
                *[f((x if c == "all" else (x.get("by_category") or {}).get(c) or {}).get("tokens_per_step"))
                  for x in free.values()]]
               for c, e in [*ev["by_category"].items(), ("all", ev)]])
    for m, x in (ev.get("free_acceptance") or {}).items():  # (its mean acceptance length: its drafted steps alone)
        if "error" in x:
            line(f"{m} on the same prompts: not measured ({x['error']})", "yellow")
            continue
        line(f"{m} on the same prompts, greedy: {f(x.get('tokens_per_step'))} tokens a verifier step (it drafted at "
             f"{x['counters']['drafts']:.0f} steps, mean acceptance length {f(x.get('mean_acceptance_length'))} there)")
    for fl in ev.get("flags", []):
        line(f"! large gap at {fl}", "red")
    if ev.get("flags"):
        line(f"check: {causes}", "yellow")
    if ev.get("speedup"):
        speedup(ev["speedup"])


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def ratio_range(v: dict) -> str:
    """A speedup with its spread across repeats: 1.23x (1.20-1.26)."""
    r = v.get("ratio") or {}
    if r.get("median") is None:
        return ""
    return f"{r['median']:.2f}x" + (f" ({r['min']:.2f}-{r['max']:.2f})" if r.get("n", 1) > 1 else "")


def speedup(sp: dict) -> None:
    """evaluation.json's `speedup`: every side's output tokens/s per concurrency (median of the
    repeats, its spread), TPOT, TTFT, acceptance, and its ratio to the verifier alone."""
    def f(x, d=1):
        return "" if x is None else f"{x:.{d}f}"

    rows = []
    for name, s in (sp.get("sides") or {}).items():
        for c, v in s["by_concurrency"].items():
            tps = v.get("output_tokens_per_s") or {}
            rows.append([name, c, f(tps.get("median")), f((v.get("baseline_tokens_per_s") or {}).get("median")),
                         _pct(tps.get("spread")), f((v.get("tpot_ms") or {}).get("median"), 2),
                         f((v.get("ttft_ms") or {}).get("median")), f(v.get("acceptance_length"), 2), ratio_range(v),
                         "noisy" if v.get("noisy") else ""])
    req = sp.get("requests") or {}
    base = f"baseline tokens/s ({'its paired runs; the baseline row pools all' if sp.get('paired') else 'median'})"
    table(f"speedup: output tokens/s of the verifier with the draft over without it (vllm bench serve: "
          f"{', '.join(f'{n} requests at {c}' for c, n in req.items())}; {sp.get('repeats')} repeat(s), "
          f"{'paired' if sp.get('paired') else 'ratio of medians'}; {sp.get('settings')})",
          ("side", "concurrent requests", "output tokens/s", base, "spread", "TPOT ms", "TTFT ms", "acceptance length",
           "speedup (min-max)", f"spread > {100 * sp.get('noisy_above', 0.05):.0f}%"), rows)
    spreads(sp)
    inexact(sp)
    lost = sum(v.get("unstreamed") or 0 for s in (sp.get("sides") or {}).values() for v in s["by_concurrency"].values())
    if lost:
        line(f"TTFT and TPOT leave out {lost} run(s) whose answers reached the benchmark's client in one piece "
             "(the time to the first token was the whole request's: a host too busy to stream); their tokens/s "
             "is counted", "yellow")
    for sk in sp.get("skipped") or []:
        line(f"not measured: {sk.get('method') or sk.get('side')}: {sk.get('why')}", "yellow")
    for c, b in (sp.get("best") or {}).items():
        if c != "overall":
            line(f"best at {c} concurrent: {b['side']}, {f(b.get('ratio'), 2)}x")
    if sp.get("deploy"):
        line(f"deploy (best over all levels): {sp['deploy']}", "green")
    if sp.get("note"):
        line(f"note: {sp['note']}", "yellow")
    elif not sp.get("cuda_graphs"):
        line("note: vLLM ran eager (CUDA graphs off): both throughputs are below what a served model reaches", "yellow")


def preflight(name: str, res: dict) -> None:
    check(name, res["check"])
    if res.get("deep") is not None:
        deep(name, res["deep"])


def preflight_summary(res: dict) -> str:
    return "all hard checks pass; " + ", ".join(f"{x.name}: {x.value}" for x in res["check"].rows
                                                if x.name in ("version torch", "version speculators"))


def fetched(r: dict) -> None:
    m = r.get("metrics") or {}
    tr = r.get("transfer") or {}
    if tr.get("streams"):
        line(f"[specops] transfer: {tr['streams']} stream(s) ({tr.get('why', '')})")
    line(f"fetch {r['run_id']}: {r['files']} file(s), {r['bytes'] / 2**20:.1f} MiB verified (sha256) in {r['dest']}"
         + (f"; {m['records']} metric records" if m else "") + (f", plot {m['plot']}" if m.get("plot") else "")
         + (f"; metrics need {m['missing']['package']}: pip install '{m['missing']['install']}'"
            if m.get("missing") else ""))


def fetched_summary(r: dict) -> str:
    return f"{r['files']} files, {r['bytes'] / 2**20:.1f} MiB verified in {r['dest']}"


def extracted(r: dict) -> str:
    ex = r.get("extract", {})
    return (f"rows {r['rows'][0]}:{r['rows'][1]}, " if r.get("rows") else "") + \
        f"{ex.get('tokens')} tokens in {ex.get('seconds')}s ({ex.get('tokens_per_s')} tokens/s)"


def extract_group(res: dict) -> None:
    outcomes(f"extract ({len(res['outcomes'])} hosts)", res["outcomes"], extracted)
    for n in (res.get("completion") or {}).get("notes", []):
        line(n, "yellow")
    if res.get("completion") or res.get("stopped"):  # (stopped: a dry run's)
        line(f"extract: every host now holds all shards ({res['completion']['mode']})" if res.get("completion")
             else "extract: then every host would get every shard (DRY-RUN: nothing was changed)")


def extract_array(res: dict) -> None:
    """A Slurm job array's extraction: one row per task, then where the shards are."""
    outcomes(f"extract {res['run_id']} (Slurm job array {res['job_id']}, {len(res['outcomes'])} tasks)",
             res["outcomes"], extracted)
    if res.get("completion"):
        line(f"extract: every row has its hidden states, the tasks' shards in one data dir "
             f"({res['completion']['mode']})")


def trained(host: str, res: dict, hint) -> None:
    rid = res["run_id"]
    if res.get("states"):
        line(f"train {rid}: every node succeeded ({res['states']})")
    elif res.get("nodes"):
        line(f"train {rid}: started on every node (`{hint(f'logs -f --run-id {rid}')}` follows rank 0)")
    elif res["exit_code"] is None:
        line(f"train {rid} on {host}: started (`{hint(f'logs -f --run-id {rid}')}` follows it)")
    else:  # (a run `inv stop` ended may exit 0: stopped, as `inv status` says)
        end = "stopped (`inv stop`), not finished" if res.get("stopped") else f"finished (exit {res['exit_code']})"
        line(f"train {rid} on {host}: {end}; `{hint(f'fetch --run-id {rid}')}` brings it back")


def dry_run_done(host: str, plan=None) -> None:
    """The dry run's last line: nothing was changed, and what the plan (a connection's Plan) holds."""
    line(f"DRY-RUN {host}: nothing was changed" + (f"; {plan_summary(plan)}" if plan is not None else ""))


def plan_summary(plan) -> str:
    """'would: 3 command(s), 1 transfer(s) (2 host file(s)), 2 other step(s)' of a Plan."""
    if not plan:
        return "would: nothing"
    files = f" ({len(plan.files)} host file(s))" if plan.files else ""
    parts = [f"{len(plan.commands)} command(s)" if plan.commands else "",
             f"{len(plan.transfers)} transfer(s){files}" if plan.transfers else "",
             f"{len(plan.steps)} other step(s)" if plan.steps else ""]
    return "would: " + ", ".join(p for p in parts if p)


def _span(v: Optional[dict]) -> str:
    """A level's speedup spread across repeats: 1.20-1.26 (one repeat: none)."""
    v = v or {}
    if v.get("ratio_min") is None or v.get("ratio_min") == v.get("ratio_max"):
        return ""
    return f"{v['ratio_min']:.2f}-{v['ratio_max']:.2f}" + (" noisy" if v.get("noisy") else "")


def spreads(sp: dict) -> None:
    """Per level, what its spread across repeats means. Where both sides' tokens/s moved more than the
    noise mark and the paired ratio did not: the machine's speed moved, not the draft's worth (the
    ratio stands). Where the speedup itself is marked noisy: not a result yet, and what narrows it."""
    mark = sp.get("noisy_above", 0.05)
    for c, v in (sp.get("by_concurrency") or {}).items():
        if v.get("short"):
            line(f"at {c} concurrent: a timed run lasted {v.get('seconds') or 0:.1f} s (under "
                 f"{sp.get('short_below', 5):g} s): mostly its start and end, not the steady state; more requests "
                 f"(`--speedup-requests`) or tokens (`--speedup-tokens`) make it a figure", "yellow")
        wide = max(v.get("draft_spread") or 0, v.get("baseline_spread") or 0)
        if v.get("noisy"):
            moved = v.get("ratio_spread") if sp.get("paired") and v.get("ratio_spread") is not None else wide
            line(f"at {c} concurrent: the speedup moved {100 * moved:.1f}% across {sp.get('repeats', 1)} repeats "
                 f"(over {100 * mark:.0f}%): not a result yet; more repeats or longer runs (`inv evaluate --repeats`, "
                 "`--speedup-requests`, `--speedup-tokens`) or a machine with cores to spare narrow it", "yellow")
        elif sp.get("paired") and wide > mark and v.get("ratio_spread") is not None:
            line(f"at {c} concurrent: tokens/s moved up to {100 * wide:.1f}% between repeats on both sides (the "
                 f"machine's speed drifted); the paired speedup held within {100 * v['ratio_spread']:.1f}%")


def inexact(sp: dict) -> None:
    """Prompts whose text (the benchmark's dataset) does not tokenize back to their ids."""
    if sp.get("prompts_inexact"):
        line(f"{sp['prompts_inexact']} of {sp.get('prompts')} prompts do not tokenize back to their ids through the "
             "verifier's tokenizer: the speedup's runs saw other prompts than acceptance's (and its acceptance "
             "length may differ)", "yellow")


def demo_acceptance(res: dict, speed: bool = True) -> None:
    """The demo's last word: the trained draft served by vLLM beside its controls, same prompts (speed: its speedup)."""
    acc, k = res["acceptance"], res.get("num_spec_tokens", 3)

    def f(x):
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"

    what = {"trained": "the trained draft", "untrained": "untrained (speculators' step 0)",
            "wrong_layers": "trained, fed other layers"}
    sp = acc["trained"].get("speedup") or {}
    levels = list((sp.get("by_concurrency") or {}))
    rows = []
    for key, a in ((key, acc.get(key)) for key in ("trained", "untrained", "wrong_layers") if acc.get(key)):
        pos, by = a.get("acceptance_by_position") or [], (a.get("speedup") or {}).get("by_concurrency") or {}
        rows.append([what[key], f(a.get("mean_acceptance_length")),
                     *[f(pos[i]) if i < len(pos) else "" for i in range(k)],
                     *[x for c in levels for x in (f(by.get(c, {}).get("ratio")), _span(by.get(c)))], a["run_id"]])
    n = acc["trained"].get("prompts")  # (the controls: on the first few of the same prompts)
    few = ", ".join(map(str, sorted({a.get("prompts") for a in acc.values() if a} - {n})))
    table(f"drafts served by vLLM with the verifier ({n} held-out prompts"
          f"{'; the controls on the first ' + few + ' of them' if few else ''}, {k} draft tokens)",
          ("draft", "mean acceptance length", *[f"accepted @{i}" for i in range(k)],
           *[x for c in levels for x in (f"speedup @{c} concurrent", f"min-max @{c}")], "run"), rows)
    m = acc["trained"].get("mean_acceptance_length") or 0.0
    line(f"mean acceptance length {m:.2f}: each verifier step emits {m:.2f} tokens on average (1.00: no draft token "
         f"accepted; at most {k + 1}).")
    for v in res.get("controls_verdict") or []:
        line(f"control: {v}")
    if levels and speed:
        by = sp["by_concurrency"]
        req = sp.get("requests")
        req = ", ".join(f"{n} at {c}" for c, n in req.items()) if isinstance(req, dict) else req
        line(f"speedup of the trained draft (output tokens/s with it / without it, the same requests: {req}; "
             f"{sp.get('settings')}): "
             + ", ".join(f"{f(by[c].get('ratio'))}x{' (' + _span(by[c]) + ')' if _span(by[c]) else ''} at {c} "
                         f"concurrent ({by[c].get('draft_tokens_per_s', 0):.1f} vs "
                         f"{by[c].get('baseline_tokens_per_s', 0):.1f} tokens/s)" for c in levels)
             + f"; {sp.get('repeats', 1)} repeat(s) by vllm bench serve")
        spreads(sp)
        inexact(sp)
        if sp.get("note"):
            line(f"note: {sp['note']}", "yellow")


def demo_stages(st: dict) -> None:
    """The demo's stage table: the time each stage took, its share, the whole (and `make setup`
    when it ran just now), the machine's cores and load."""
    setup = st.get("setup_seconds")
    whole = st["seconds"] + (setup or 0)
    rows = ([["make setup (system packages, the laptop's .venv)", f"{setup:.1f}", f"{100 * setup / whole:.0f}%"]]
            if setup else [])
    rows += [[r["stage"], f"{r['seconds']:.1f}", f"{100 * r['seconds'] / whole:.0f}%"] for r in st["stages"]]
    table("time each stage took", ("stage", "seconds", "share"), rows)
    line(f"demo: {age(whole)} in all" + (f" ({age(setup)} make setup, {age(st['seconds'])} inv demo)" if setup else "")
         + f" on {st.get('cores')} cores, load {st['load_before'][0]:.1f} before, {st['load_after'][0]:.1f} after"
         + (f"; stage table in {st['path']}" if st.get("path") else ""))


def evaluation_checkpoints(run_id: str, res: dict, dest: str, causes: str, hint: Callable[[str], str]) -> None:
    """`inv evaluate --checkpoints`: one row per checkpoint served, the best, the pick."""
    k = res.get("num_spec_tokens") or 0

    def f(x):
        return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"

    timed = any(e.get("speedup") for e in res.get("checkpoints", []))
    rows = []
    for e in res.get("checkpoints", []):
        acc, val = e.get("acceptance_by_position") or [], e.get("val_accuracy") or {}
        full = val.get("full") or []
        rows.append([e["checkpoint"] + (" *" if e["checkpoint"] == res.get("best_checkpoint") else ""),
                     f(e.get("mean_acceptance_length")), *[f(acc[i]) if i < len(acc) else "" for i in range(k)],
                     " ".join(f(x) for x in full), f"{(e.get('counters') or {}).get('drafts', 0):.0f}",
                     *([f(e.get("speedup_at_1"))] if timed else []), "; ".join(e.get("flags") or [])])
    table(f"acceptance of {run_id} per checkpoint, served by vLLM ({res.get('prompts')} prompts, {k} speculative "
          f"tokens)",
          ("checkpoint", "mean acceptance length", *[f"accepted @{i}" for i in range(k)],
           "train val full_acc by position", "drafts", *(["speedup @1"] if timed else []), "flags"), rows)
    m = res.get("mean_acceptance_length") or float("nan")
    line(f"best served: checkpoint {res.get('best_checkpoint')} (mean acceptance length {m:.3f}; 1.000 = no draft "
         f"token accepted, at most {k + 1})")
    if res.get("speedup"):
        speedup(res["speedup"])
    p = res.get("picked")
    if p:
        line(f"picked checkpoint {p['checkpoint']}: recorded as best_served in {p['record']} "
             f"(`{hint(f'fetch --run-id {run_id} --checkpoint best-served')}` brings it)")
    line(f"evaluation written to {dest}/{run_id}/evaluation.json (each checkpoint's on the host: "
         f"runs/{run_id}/evaluation/)" + (f"; plot {res['plot']}" if res.get("plot") else ""))
    if any(e.get("flags") for e in res.get("checkpoints", [])):
        line(f"check: {causes}", "yellow")


def fetched_checkpoint(r: dict) -> None:
    """`inv fetch --checkpoint`: the usual line, then which checkpoint came and which stayed."""
    fetched(r)
    p, left = r.get("picked"), ", ".join(r.get("left") or []) or "none"
    line(f"checkpoint {r['checkpoint']}" + (f" (best served: mean acceptance length "
                                            f"{p.get('mean_acceptance_length') or float('nan'):.3f} over "
                                            f"{p.get('prompts')} prompts)" if p else "")
         + f" in {r['dest']}/checkpoints/{r['checkpoint']}; left on the host: {left}")


def next_step(command: str, why: str = "") -> None:
    """The command a stage's user types next, after its result."""
    line(f"next: {command}" + (f"  ({why})" if why else ""))


# -- inv plan -----------------------------------------------------------------------------
def _hours(s: Optional[float]) -> str:
    return "" if s is None else f"{s / 3600:.3f}"


def plan(p: dict) -> None:
    """`inv plan`: one table per hidden-states mode (stage | tokens | hours | disk | GPU-hours |
    cost | measured on), what auto would take and why, and the whole run's wall time."""
    from specops.estimate import size

    m = p["measured"]
    line(f"plan {p['host']}: {m['rows_sample']} of {m['rows_total']} row(s) measured ({m['tokens_sample']} tokens, "
         f"x {p['scale']:.1f} to the file's {p['tokens_full']:.0f} tokens), {p['epochs']} epoch(s), "
         f"config {p['config']}; the plan took {p['plan_seconds']:.0f} s")
    line(f"  bytes per token stored: {m['bytes_per_token']:.0f} B ({m['bytes_per_token_basis']})")
    priced = p.get("price_per_hour") is not None
    cols = ["stage", "tokens", "hours", "disk", "GPU-hours", "cost", "measured on"]
    for mode, r in p["modes"].items():
        rows = [[s["stage"], f"{s['tokens']:.0f}", _hours(s["seconds"]), size(s["disk_bytes"]),
                 "" if s["gpu_hours"] is None else f"{s['gpu_hours']:.3f}",
                 f"{s['cost']:.2f}" if priced else "(no price_per_hour)", s["basis"]] for s in r["stages"]]
        rows.append(["total", "", _hours(r["seconds"]), size(r["disk_bytes"]),
                     "" if r["gpu_hours"] is None else f"{r['gpu_hours']:.3f}",
                     f"{r['cost']:.2f}" if priced else "", ""])
        table(f"plan {mode} on {p['host']}" + (f" ({p['gpus']} GPU(s), {p['price_per_hour']:g}/h per "
                                              f"{p['price_per']})" if priced else ""), cols, rows)
    a = p["auto"]
    line(f"auto would take: {a['mode']} ({a['reason']})")
    chosen = p["modes"].get(a["mode"]) or next(iter(p["modes"].values()))
    line(f"total wall time ({a['mode'] if a['mode'] in p['modes'] else next(iter(p['modes']))}): "
         f"{chosen['hours']:.3f} h ({chosen['seconds']:.0f} s); plan kept in {p['path']}")


def plan_versus(v: Optional[dict]) -> None:
    """Planned against actual hours per stage of a run whose dataset has a plan."""
    if not v:
        return
    table(f"planned vs actual ({v['mode']}; plan {v['plan']})", ["stage", "planned h", "actual h", "error", "runs"],
          [[r["stage"], _hours(r["planned_s"]), _hours(r["actual_s"]),
            "" if r["error"] is None else f"{r['error'] * 100:+.0f}%", ",".join(r["runs"])] for r in v["rows"]])
