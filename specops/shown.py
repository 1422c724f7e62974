"""How each task's value is shown: a registry mapping result types to their views.

The CLI's executor (cli.on_hosts) runs an operation and hands its value here; `view_of(value)`
finds the value's View by its type (the first of its classes registered): how one host's value
is shown (`show(where, value)`), a group's row for it (`describe`), whether it fails the task
(`judge(host, value)` raises), what --json prints, and whether it is shown under --dry-run too
(`dry`: a value a dry run reads whole, such as `inv clean`'s). Nothing here runs an operation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from specops import views
from specops.errors import SpecopsError
from specops.group.distcheck import DistCheck
from specops.group.extract import ExtractedArray, ExtractedGroup
from specops.group.fanout import Outcomes, verdict
from specops.host.transport import Transport
from specops.ops import check, fetch, inspect_data, jobs, plan, wheelhouse
from specops.ops.bakeoff import Bakeoff, verdict as bakeoff_verdict
from specops.ops.bootstrap import Outcome as Bootstrapped, Pushed
from specops.ops.data import Extracted, Prepared, Verifier
from specops.ops.evaluate import CAUSES, Evaluation
from specops.ops.pipeline import Demo
from specops.ops.regenerate import Regenerated
from specops.ops.synthesize import Synthesized
from specops.ops.train import Trained
from specops.payloads import Inspection, Stopped


@dataclass
class Where:
    """Where a value came from, for its view: the host's name ("" for a group), the hint maker
    (`inv TASK` with the user's --host/--hosts), and the open connection (one host's; else None)."""
    name: str
    hint: Callable[[str], str]
    t: Optional[Transport] = None


@dataclass
class View:
    show: Optional[Callable[[Where, Any], None]] = None
    describe: Callable[[Any], str] = str
    judge: Optional[Callable[[str, Any], None]] = None
    json: Callable[[Any], Any] = lambda v: v
    dry: bool = False
    #: after a group's table: each host's value, shown (host, value)
    each: Optional[Callable[[str, Any], None]] = None


def _preflight(w: Where, r) -> None:
    views.preflight(w.name, r)
    if r.get("serve") and r["serve"].get("ok"):
        views.line(check.serve_line(r["serve"]))


def _pushed(w: Where, sent) -> None:
    views.line(f"push {w.name}: " + _sent(sent))


def _sent(sent) -> str:
    return f"{len(sent)} file(s) sent" if sent else "already in sync"


def _runs(w: Where, rows) -> None:
    views.status(w.name, rows)
    if w.t is not None and rows.run_id and rows and rows[0].kind == "train" and rows[0].ended:  # (its plan, if any)
        views.plan_versus(plan.versus(w.t, rows.run_id))


def _fetched(w: Where, r) -> None:
    views.fetched(r)
    if w.t is not None:
        views.plan_versus(plan.versus(w.t, r["run_id"]))
    views.next_step(w.hint(f"evaluate --run-id {r['run_id']}"),
                    "serve the draft with the verifier: acceptance and speedup")


def _converted(w: Where, c) -> None:
    res = c.converted
    views.line(f"converted {res.rows} rows to {res.dst} in {res.seconds}s")
    views.inspect(c.inspection)


def _prepared(w: Where, res) -> None:
    ds = f" --dataset {res['dataset']}" if res.get("dataset") else ""
    views.line(f"prepare-data: {res.get('data_dir', '')} ready (run {res['run_id']})")
    views.next_step(w.hint("extract" + ds), "the verifier's hidden states for these rows; or train online: "
                    + w.hint("train --hidden-states online"))


def _extracted(w: Where, res) -> None:
    ds = f" --dataset {res['dataset']}" if res.get("dataset") else ""
    views.line(f"extract ({res['backend']}): {views.extracted(res)}, layers {res.get('layer_ids')} (run "
               f"{res['run_id']})")
    views.next_step(w.hint(f"inspect-data{ds}"), f"then {w.hint(f'train{ds}')}")


def _array(w: Where, res) -> None:
    if not res["outcomes"]:  # (detached: submitted, nothing to show yet)
        return
    views.extract_array(res)
    verdict("extract", res["outcomes"])
    if res["left"] != 0:
        raise SpecopsError(f"extract {res['run_id']}: every task succeeded but {res['left']} row(s) of the dataset "
                           f"still have no hidden states: run the same command again (extraction resumes)")
    _extracted_next(w, res)


def _extracted_next(w: Where, res) -> None:
    ds = f" --dataset {res['dataset']}" if res.get("dataset") else ""
    views.next_step(w.hint(f"inspect-data{ds}"), f"then {w.hint(f'train{ds}')}")


def _group_extract(w: Where, res) -> None:
    views.extract_group(res)
    verdict("extract", res["outcomes"])


def _cleaned(host: str, res: dict) -> None:
    """`inv clean`: what went (or would go: res["said"]) and what stayed, with why."""
    gone = res.get("removed") or []
    views.line(f"clean {host}: {res.get('said') or 'removed'} {len(gone)} run(s)"
               + (": " + ", ".join(gone) if gone else ""))
    for rid, why in res.get("kept") or []:
        views.line(f"  kept {rid}: {why}")


def _learnable(r) -> str:
    lang = r.get("language") or {}
    return (f"learnable verifier at {r['path']}: {r['layers']} layers, hidden {r['hidden']}, "
            f"vocab {r['vocab']}, {r['params']} parameters; {r['steps']} steps in {r.get('train_seconds', 0):.0f} s, "
            f"greedy agreement with the language {r['greedy_agreement']:.2f} (language {lang.get('fingerprint', '?')})")


def _verifier(w: Where, v) -> None:
    res = v.built
    if v.real:
        views.line(f"{res.model} at {res.path} ({'cached: nothing converted' if res.cached else 'built'} from "
                   f"{res.source}): {res.layers} layers, hidden {res.hidden}, vocab {res.vocab}, {res.positions} "
                   f"positions, {res.params} parameters; greedy answer to {res.question!r}: {res.answer!r}")
    else:
        views.line(_learnable(res) if v.learnable else
                   f"tiny verifier at {res.path}: {res.layers} layers, hidden {res.hidden}, vocab {res.vocab}, "
                   f"{res.params} parameters")
    views.next_step(w.hint(f"pipeline --verifier {res.path} --data FILE.jsonl"),
                    "or set `verifier:` for the host in hosts.yaml")


def _regenerated(w: Where, res) -> None:
    views.line(f"regenerate: {res['rows']} row(s) of verifier responses for {res['prompts']} prompt(s) -> {res['out']}"
               + (f" ({res['errors']} failed: {res['errors_file']})" if res["errors"] else "")
               + f" (run {res['run_id']}); next: `{res['next']}`")
    if res.get("quality"):
        views.line(f"regenerate: {res['quality']}", "yellow")


def _synthesized(w: Where, res) -> None:
    drops = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in (res.get("dropped") or {}).items() if v) or "none"
    short = f" (asked {res['rows'] + res['short']}: --attempts spent)" if res.get("short") else ""
    views.line(f"synthesize: {res['rows']} conversation(s){short} -> {res['out']} in {res.get('synthesize_seconds')}s, "
               f"{res.get('rows_per_s')} rows/s (run {res['run_id']})")
    for line in res.get("sampling") or []:
        views.line(f"  sampling: {line}")
    views.line(f"  {res.get('candidates')} candidate(s); dropped: {drops}"
               + (f"; first failed request: {res['first_error']}" if res.get("first_error") else ""))
    views.next_step(res["next"], "tokenise the conversations for training")


def _priced(w: Where, p) -> None:
    views.plan(p.plan)
    if p.plan.get("long"):  # (a training past estimate.LONG_HOURS, with what shortens it)
        views.line(f"plan: {p.plan['long']}", "yellow")
    if p.plan.get("bakeoff"):
        _plan_bakeoff(p.plan)
    if p.plan.get("ceiling"):
        _ceiling(p.plan["ceiling"], p.plan["created"])
    views.next_step(p.next, p.why)


def _plan_bakeoff(p: dict) -> None:
    """`inv plan --drafts`: the whole bake-off in one table (the shared data stage, each kind's training in the mode
    the plan takes, the total), then what it does not price."""
    b, priced = p["bakeoff"], p.get("price_per_hour") is not None

    def cells(r: dict, unpriced: str = "(no price_per_hour)") -> list:
        return [f"{r['seconds'] / 3600:.3f}", "" if r["gpu_hours"] is None else f"{r['gpu_hours']:.3f}",
                f"{r['cost']:.2f}" if priced else unpriced]
    rows = [[r["stage"], r["kind"] or "(shared)", r["config"] or "", r["epochs"] or "", f"{r['tokens']:.0f}",
             *cells(r), r["basis"]] for r in b["rows"]]
    rows.append(["total", ",".join(b["kinds"]), "", "", "", *cells(b["total"], ""), ""])
    views.table(f"plan of the bake-off {','.join(b['kinds'])} on {p['host']} ({b['mode']})",
                ["stage", "draft", "config", "epochs", "tokens", "hours", "GPU-hours", "cost", "measured on"], rows)
    views.line(f"bake-off total ({b['mode']}): {b['total']['hours']:.3f} h ({b['total']['seconds']:.0f} s) for "
               f"{len(b['kinds'])} kinds; not priced: each kind's serving and timing (the plan serves no trained "
               "draft)")


def _ceiling(c: dict, created: float) -> None:
    """The plan's ceiling (ops/ceiling.py): per acceptance rate its mean acceptance length (aimed at, and as the
    benchmark counted it per level) and the speedup over the verifier alone per level, with its min-max."""
    if c.get("error"):
        views.line(f"ceiling: not measured: {c['error']}", "yellow")
        return
    levels = list(dict.fromkeys(lv for r in c["rows"] for lv in r["by_concurrency"]))

    def ratio(v: dict) -> str:
        span = f" ({v['ratio_min']:.2f}-{v['ratio_max']:.2f})" if v.get("ratio_min") != v.get("ratio_max") else ""
        return "" if v.get("ratio") is None else f"{v['ratio']:.2f}x{span}" + (" noisy" if v.get("noisy") else "")

    rows = [[f"{r['rate']:g}", f"{r['acceptance_length']:.2f}",
             *[x for lv in levels for x in (f"{(r['by_concurrency'].get(lv) or {}).get('acceptance_length') or 0:.2f}",
                                            ratio(r["by_concurrency"].get(lv) or {}))]] for r in c["rows"]]
    earlier = f"; measured by an earlier plan, {views.age(created - c['measured'])} before" \
        if c.get("measured", created) < created - 60 else ""
    views.table(f"ceiling on {c['host']}: the speedup a draft of each acceptance buys ({c['kind']}, k={c['k']}: the "
                f"plan's draft, its proposals accepted at that rate by vLLM's synthetic rejection sampling; "
                f"{c.get('repeats')} repeat(s), {'paired' if c.get('paired') else 'ratio of medians'}; "
                f"{c.get('settings')}{earlier})",
                ("acceptance per position", "mean acceptance length",
                 *[x for lv in levels for x in (f"counted @{lv}", f"speedup @{lv} concurrent (min-max)")]), rows)
    views.line("ceiling: a trained draft's `inv evaluate` (same verifier, host, kind and k) is said against it")


def _demo(w: Where, res) -> None:
    if res.get("acceptance"):
        views.demo_acceptance(res)
        _controls_by_category(res["acceptance"])
    if res.get("stages"):
        views.demo_stages(res["stages"])


def _controls_by_category(acc: dict) -> None:
    """Each draft's mean acceptance length per prompt category (prompts carrying one), the controls beside the
    trained draft (the controls on the first of the same prompts: each category's prompts counted)."""
    names = [k for k in ("trained", "untrained", "wrong_layers") if (acc.get(k) or {}).get("by_category")]
    cats = list(dict.fromkeys(c for k in names for c in acc[k]["by_category"]))
    if not cats or "trained" not in names:
        return

    def cell(k: str, c: str) -> str:
        e = acc[k]["by_category"].get(c) or {}
        m = e.get("mean_acceptance_length")
        return "" if m is None else f"{m:.2f} ({e.get('prompts')})"

    views.table("mean acceptance length by category (prompts)", ("category", *[k.replace("_", " ") for k in names]),
                [[c, *[cell(k, c) for k in names]] for c in cats])


def _evaluation(w: Where, e) -> None:
    if e.several:
        views.evaluation_checkpoints(e.run_id, e.ev, e.dest, CAUSES, w.hint)
        return
    views.evaluation(e.run_id, e.ev, CAUSES)
    if e.ev.get("versus_ceiling"):
        _versus_ceiling(e.ev["versus_ceiling"])
    if e.ev.get("controls"):
        views.demo_acceptance(e.ev["controls"], speed=False)
        _controls_by_category(e.ev["controls"]["acceptance"])
    views.line(f"evaluation written to {e.dest}/{e.run_id}/evaluation.json (on the host: runs/{e.run_id}/)"
               + (f"; plot {e.ev['plot']}" if e.ev.get("plot") else ""))


def _versus_ceiling(vs: dict) -> None:
    """A draft's speedup against the ceiling's at its own mean acceptance length, per level (ops/ceiling.py)."""
    if vs.get("why"):
        views.line(f"ceiling: not compared with {vs['where']}: {vs['why']}", "yellow")
        return
    for lv, v in vs["by_concurrency"].items():
        best = f"the best measured, acceptance {v['best_rate']:g} per position, buys {v['best_ratio']:.2f}x"
        if v.get("ceiling") is None:
            views.line(f"ceiling @{lv} concurrent ({vs['where']}, k={vs['k']}): the draft's {v['ratio']:.2f}x at mean "
                       f"acceptance length {v['acceptance_length']:.2f} lies outside the ceiling's measured lengths "
                       f"{v['range'][0]:.2f}-{v['range'][1]:.2f}; {best}")
            continue
        views.line(f"ceiling @{lv} concurrent ({vs['where']}, k={vs['k']}): draft {v['ratio']:.2f}x of ceiling "
                   f"{v['ceiling']:.2f}x at its acceptance (mean acceptance length {v['acceptance_length']:.2f}, "
                   f"between rates {v['between'][0]:g} and {v['between'][1]:g}): {100 * v['share']:.0f}%; {best}")


def _dist(w: Where, res) -> None:
    r0 = res["ranks"][0]
    views.line(f"dist-check {res['run_id']}: world {r0['world']}, all-reduce sum {r0['sum']} (want {r0['want']}) on "
               f"every rank: " + ", ".join(f"rank {x['rank']}@node {x['ranks'][x['rank']]['node_rank']}"
                                           for x in res["ranks"]))


def _wheelhouse(w: Where, man) -> None:
    for ln in wheelhouse.summary_lines(man):
        views.line(ln)


def _outcomes(w: Where, outs) -> None:
    views.outcomes(f"{outs.title} ({len(outs)} hosts)", outs, lambda v: view_of(v).describe(v))
    verdict(outs.title, outs)
    for o in outs:  # (then each host's whole value, where its type says so: `inv status`'s tables)
        each = view_of(o.value).each
        if each is not None:
            each(o.host, o.value)


def _bakeoff(w: Where, b: dict) -> None:
    """The bake-off's table (a kind a row: acceptance, the speedup at each level with its min-max, a failed kind's
    why), with --ceiling the draft's share of its kind's best synthetic acceptance; then the winner per level and
    its `vllm serve` line."""
    def at(r: dict, c: str) -> str:
        v = r["by_concurrency"][c]
        return "" if v.get("ratio") is None else f"{v['ratio']:.2f}x" + (
            f" ({v['ratio_min']:.2f}-{v['ratio_max']:.2f})" if v.get("ratio_min") is not None else "") + (
            f" {v['side']}" if v.get("side") not in (None, "draft") else "") + (" short" if v.get("short") else "")

    def ceil(r: dict, c: str) -> str:
        v = (r.get("ceiling") or {}).get(c) or {}
        share = v.get("share")  # (above 100% at acceptance 1: a draft beat every-proposal-accepted, so the timing's
        # noise is larger than the gap: bench/results/bakeoff-gpu.md, the third run's EAGLE-3)
        return "" if not v.get("ceiling_ratio") else (f"{v['ceiling_ratio']:.2f}x at acceptance {v['rate']:g}"
                                                      + (f" ({share:.0%}" + (": above it, so noise" if share > 1
                                                                             and v.get("rate") == 1 else "") + ")"
                                                         if share else ""))
    levels = [str(c) for c in b["levels"]]
    ceilings = [c for c in levels if any((r.get("ceiling") or {}).get(c) for r in b["rows"])]
    views.table(f"bake-off {b['bakeoff']} on {w.name}: each kind against the verifier alone",
                ["draft", "run", "k", "mean acceptance length", "untrained control", "acceptance by position",
                 *[f"speedup @{c} concurrent" for c in levels],
                 *[f"ceiling @{c} (draft's share)" for c in ceilings]],
                [[r["kind"], r["run_id"], "" if r.get("num_spec_tokens") is None else str(r["num_spec_tokens"]),
                  "" if r.get("mean_acceptance_length") is None else f"{r['mean_acceptance_length']:.2f}",
                  "" if r.get("untrained_mean_acceptance_length") is None else
                  f"{r['untrained_mean_acceptance_length']:.2f}",
                  r["error"] if r.get("error") else " ".join(f"{x:.2f}" for x in r["acceptance_by_position"] or []),
                  *[at(r, c) for c in levels], *[ceil(r, c) for c in ceilings]]
                 for r in b["rows"]])
    for c in levels:
        win = b["winners"].get(c)
        if win:
            views.line(f"winner at {c} concurrent: {win['kind']} ({win['ratio']:.2f}x, run {win['run_id']}): "
                       f"{win.get('deploy') or ''}")
    views.line(f"bake-off written to {b.get('file')}" + (f", its plot {b['plot']}" if b.get("plot") else ""))


VIEWS: dict[type, View] = {
    Bootstrapped: View(describe=lambda o: f"venv {'created' if o.venv_created else 'present'}, {len(o.pushed)} "
                       f"file(s) pushed, profile {o.install.action}"),
    check.Preflight: View(_preflight, views.preflight_summary, check.judge,
                          json=lambda r: r["check"] if r["deep"] is None and r["serve"] is None else r),
    Pushed: View(_pushed, _sent),
    jobs.Runs: View(_runs, lambda rows: f"{len(rows)} run(s), running: "
                    + (", ".join(j.run_id for j in rows if not j.ended) or "none"), each=views.status),
    jobs.Cleaned: View(lambda w, r: _cleaned(w.name, r), dry=True),
    jobs.LogTail: View(lambda w, b: views.log(bytes(b))),
    Stopped: View(lambda w, r: views.line(f"stop {r.run_id}: {views.stopped(r)}"), views.stopped),
    fetch.Fetched: View(_fetched, views.fetched_summary),
    fetch.FetchedCheckpoint: View(lambda w, r: views.fetched_checkpoint(r), views.fetched_summary),
    Inspection: View(lambda w, r: views.inspect(r), judge=lambda name, r: inspect_data.verdict(r)),
    inspect_data.Conversion: View(_converted, judge=lambda name, c: inspect_data.verdict(c.inspection)),
    Prepared: View(_prepared),
    Extracted: View(_extracted),
    ExtractedArray: View(_array),
    ExtractedGroup: View(_group_extract, dry=True),
    Verifier: View(_verifier),
    Trained: View(lambda w, r: views.trained(w.name, r, w.hint)),
    Regenerated: View(_regenerated),
    Synthesized: View(_synthesized),
    plan.Priced: View(_priced, json=lambda p: p.plan),
    Demo: View(_demo),
    Bakeoff: View(_bakeoff, judge=bakeoff_verdict),
    Evaluation: View(_evaluation, json=lambda e: e.ev),
    DistCheck: View(_dist),
    wheelhouse.Wheelhouse: View(_wheelhouse),
    Outcomes: View(_outcomes, dry=True),
}


def view_of(value: Any) -> View:
    """The View of a value: its type's, or the first of its base classes registered (none: not shown)."""
    for cls in type(value).__mro__:
        if cls in VIEWS:
            return VIEWS[cls]
    return View()
