"""bakeoff: which draft should this verifier get? The draft kinds (eagle3, peagle, dflash: specops_host/serve/
drafts.py) trained on one prepared dataset, each served on the same verifier with the same prompts (the dataset's
held-out rows), settings and concurrency levels, each timed against the verifier alone by `inv evaluate`'s own
paired timing; one table, the winner per level and its `vllm serve` line. Every kind's run is a normal run
(<bakeoff id>-<kind>: status, logs, fetch, evaluate, clean)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Optional

from specops.args import USAGE, Refused, refusing
from specops.config import load_config
from specops.errors import SpecopsError
from specops.host.transport import Transport
from specops.ops import controls as _controls, data, evaluate, jobs, train
from specops.ops.ceiling import read_plan
from specops.ops.evaluate import concurrency_levels
from specops_host.contract import write_json
from specops_host.serve import drafts as kinds_of

DEFAULT = "eagle3,peagle,dflash"


def parse_drafts(spec: Optional[str]) -> list[str]:
    """`--drafts eagle3,peagle,dflash`: two or more kinds specops runs, each once; else one line."""
    kinds = list(dict.fromkeys(x.strip() for x in (spec or DEFAULT).split(",") if x.strip()))
    for k in kinds:
        why = kinds_of.kind_problem(k)
        if why:
            raise Refused(why.replace("--draft", "--drafts", 1), code=USAGE)
    if len(kinds) < 2:
        raise Refused(f"--drafts {spec!r}: a bake-off compares two or more kinds (such as {DEFAULT}); one kind: "
                      f"`inv train --draft K` then `inv evaluate`", code=USAGE)
    return kinds


def check_kinds(drafts: Optional[str], configs: Optional[str]) -> list[str]:
    """parse_drafts(), then each kind's KIND.yaml in --configs FOLDER there (else one line); the kinds."""
    kinds = parse_drafts(drafts)
    missing = [f"{configs}/{k}.yaml" for k in kinds if configs and not (Path(configs) / f"{k}.yaml").is_file()]
    if missing:
        raise Refused(f"--configs {configs}: no {', '.join(missing)}: a bake-off's folder holds each kind's "
                      f"config as KIND.yaml (as configs/ does)", code=USAGE)
    return kinds


def config_of(kind: str, configs: Optional[str]) -> Optional[str]:
    """A kind's training config in a bake-off: --configs FOLDER's KIND.yaml, else None (train's configs/KIND.yaml)."""
    return str(Path(configs) / f"{kind}.yaml") if configs else None


def configs_of(kinds: list, configs: Optional[str], profile: str, overrides: Optional[dict] = None) -> dict:
    """Each kind's training config, loaded (config.load_config: its keys and numbers) before anything runs; one whose
    speculator-type is another kind is refused in one line (else the kinds before it would train first)."""
    out = {}
    for k in kinds:
        cfg = load_config(train.draft_config(k, config_of(k, configs)), profile, overrides or {})
        if train.kind_of(cfg) != k:
            raise SpecopsError(f"{'--configs ' + configs + ': ' if configs else ''}{cfg['path']} trains "
                               f"{train.kind_of(cfg)} (its speculator-type), not {k}: a bake-off's KIND.yaml trains "
                               f"that kind (nothing was started)")
        out[k] = cfg
    return out


def per_kind(text: Optional[str], kinds: list, flag: str, *, many: bool) -> dict:
    """`--num-spec-tokens 5` / `--tune-k 3,5` (every kind) or `eagle3:5,peagle:7` (KIND:K, that kind's own; a bare K
    is every other kind's): {kind: [k, ...]} for the kinds given one (many=False: one k a kind); else one line."""
    out: dict = {}
    bare: list = []
    for item in [x.strip() for x in str(text or "").split(",") if x.strip()]:
        kind, _, k = item.rpartition(":")
        if kind and kind not in kinds:
            raise Refused(f"{flag} {text}: {kind} is not a kind of this bake-off ({', '.join(kinds)})", code=USAGE)
        if not k.isdigit() or not 1 <= int(k) <= 16:
            raise Refused(f"{flag} {text}: {item!r}: give draft tokens from 1 to 16, as K (every kind) or KIND:K "
                          f"(such as eagle3:5,peagle:7)", code=USAGE)
        (out.setdefault(kind, []) if kind else bare).append(int(k))
    if not many and (len(bare) > 1 or any(len(v) > 1 for v in out.values())):
        raise Refused(f"{flag} {text}: one k a kind (K for every kind, or KIND:K each)", code=USAGE)
    return {k: list(dict.fromkeys(out.get(k, bare))) for k in kinds if out.get(k, bare)}


def _flags(drafts: Optional[str] = None, speedup: str = "1,16", repeats: int = 3, tune: bool = False,
           controls: Optional[str] = None, configs: Optional[str] = None, num_spec_tokens: Optional[str] = None,
           tune_k: Optional[str] = None, side_by_side: Optional[int] = None, speedup_requests: Optional[int] = None,
           speedup_tokens: Optional[int] = None, ceiling: Optional[str] = None, **_: Any) -> None:
    kinds = check_kinds(drafts, configs)
    per_kind(num_spec_tokens, kinds, "--num-spec-tokens", many=False)
    per_kind(tune_k, kinds, "--tune-k", many=True)
    if controls is not None:
        _controls.parse_controls(controls)
    levels = concurrency_levels(speedup)
    if not levels:
        raise Refused("--speedup none: a bake-off picks its winner by the speedup at each level: give levels "
                      "such as 1,16", code=USAGE)
    try:
        evaluate.timing_args(levels, repeats=repeats, tune=tune, side_by_side=side_by_side,
                             speedup_requests=speedup_requests, speedup_tokens=speedup_tokens, ceiling=ceiling)
    except SpecopsError as e:
        raise Refused(str(e), code=USAGE) from None


def row(kind: str, rid: str, ev: dict, levels: list) -> dict:
    """One kind's line of the table: its acceptance, and per level its ratio (median, min-max over the repeats: the
    best setting's, --tune's or --tune-k's, else the draft as evaluated) and that setting's `vllm serve` line; with
    --ceiling, per level the best synthetic acceptance's speedup at the draft's k and the draft's share of it."""
    sp = ev.get("speedup") or {}
    by, best, sides = sp.get("by_concurrency") or {}, sp.get("best") or {}, sp.get("sides") or {}
    per = {}
    for c in map(str, levels):
        b, d = best.get(c) or {}, by.get(c) or {}
        r = _ratio(sides.get(b.get("side") or "draft") or {}, c)  # (the min-max of the side the ratio is of)
        per[c] = {"ratio": b.get("ratio", d.get("ratio")),
                  "ratio_min": r["ratio_min"] if r["ratio_min"] is not None else d.get("ratio_min"),
                  "ratio_max": r["ratio_max"] if r["ratio_max"] is not None else d.get("ratio_max"),
                  "side": b.get("side", "draft"),
                  "deploy": b.get("deploy") or sp.get("draft_deploy"), **({"short": True} if d.get("short") else {})}
    settings = {n: {"k": (v.get("speculative_config") or {}).get("num_speculative_tokens"),
                    **{c: _ratio(v, c) for c in map(str, levels)}}
                for n, v in sides.items() if v.get("role") in ("draft", "tune")}
    vs = (ev.get("versus_ceiling") or {}).get("by_concurrency") or {}
    ceiling = {c: {"draft_ratio": v.get("ratio"), "ceiling_ratio": v.get("best_ratio"), "rate": v.get("best_rate"),
                   "share": round(v["ratio"] / v["best_ratio"], 4) if v.get("ratio") and v.get("best_ratio") else None}
               for c, v in vs.items()}
    untrained = (((ev.get("controls") or {}).get("acceptance") or {}).get("untrained") or {})
    return {"kind": kind, "run_id": rid, "mean_acceptance_length": ev.get("mean_acceptance_length"),
            "untrained_mean_acceptance_length": untrained.get("mean_acceptance_length"),
            "acceptance_by_position": ev.get("acceptance_by_position"), "num_spec_tokens": ev.get("num_spec_tokens"),
            "by_concurrency": per, "settings": settings, **({"ceiling": ceiling} if ceiling else {})}


def _ratio(side: dict, c: str) -> dict:
    """A timed side's figures at level c: its ratio to the verifier alone (median, min, max) and acceptance length."""
    v = (side.get("by_concurrency") or {}).get(c) or {}
    r: dict = v["ratio"] if isinstance(v.get("ratio"), dict) else {}
    return {"ratio": r.get("median"), "ratio_min": r.get("min"), "ratio_max": r.get("max"),
            "acceptance_length": v.get("acceptance_length")}


def failed_row(kind: str, rid: str, stage: str, e: SpecopsError, levels: list) -> dict:
    """A kind that failed to train or to be served: its row says where and why (the others are still compared)."""
    return {"kind": kind, "run_id": rid, "error": f"{stage}: {e}", "mean_acceptance_length": None,
            "acceptance_by_position": None, "by_concurrency": {str(c): {"ratio": None} for c in levels}}


def verdict(name: str, b: dict) -> None:
    """After the table: a bake-off where a kind failed fails (one line naming each), its table shown first."""
    bad = [r for r in b["rows"] if r.get("error")]
    if bad:
        raise SpecopsError(f"bake-off {b['bakeoff']} on {name}: {len(bad)} of {len(b['rows'])} kind(s) failed: "
                           + "; ".join(f"{r['kind']} ({r['error']})" for r in bad))


def winners(rows: list, levels: list) -> dict:
    """The kind with the highest speedup at each level (its side and `vllm serve` line); none where none was timed."""
    out = {}
    for c in map(str, levels):
        timed = [r for r in rows if (r["by_concurrency"][c] or {}).get("ratio") is not None]
        if timed:
            w = max(timed, key=lambda r: r["by_concurrency"][c]["ratio"])
            out[c] = {"kind": w["kind"], "run_id": w["run_id"], **w["by_concurrency"][c]}
    return out


@refusing(_flags)
def bakeoff(t: Transport, *, drafts: Optional[str] = None, dataset: Optional[str] = None,
            verifier: Optional[str] = None, run_id: Optional[str] = None, epochs: Optional[int] = None,
            max_steps: Optional[int] = None, hidden_states: str = "auto", speedup: str = "1,16", repeats: int = 3,
            tune: bool = False, baselines: Optional[str] = None, max_prompts: int = 32, max_tokens: int = 64,
            dest: str = "runs", vllm_arg: Optional[list] = None, serve_check: bool = True,
            configs: Optional[str] = None, controls: Optional[str] = None, num_spec_tokens: Optional[str] = None,
            tune_k: Optional[str] = None, side_by_side: Optional[int] = None, speedup_requests: Optional[int] = None,
            speedup_tokens: Optional[int] = None, ceiling: Optional[str] = None) -> "Bakeoff":
    """Train each kind on the dataset (train(), its draft-serves preflight first, followed), then evaluate each
    (evaluate(): the same prompts, levels, repeats and settings, each paired with the verifier alone; the free
    baselines timed beside the first kind only; controls: each also beside its untrained draft, `inv evaluate
    --controls`' own); configs: a folder of KIND.yaml, one per kind (default configs/); num_spec_tokens and tune_k:
    K for every kind or KIND:K each (per_kind()): the k each kind is served at (default 3) and the k its timing
    also sweeps; with the untrained control (and the preflight on, not a Slurm host), each kind's untrained control
    is served before its training and is its draft-serves preflight (controls.untrained_first(): one untrained draft
    built and served a kind, not two); side_by_side, speedup_requests, speedup_tokens, ceiling: evaluate's, for every
    kind. A kind that fails to train or to be served gets a row saying why and the others are still compared
    (verdict() fails the bake-off after its table). Returns {bakeoff, kinds, levels, rows, winners, file}, written to
    dest/<id>.json, also after each kind but the last (record(): the table so far, its `pending` kinds)."""
    kinds, levels = parse_drafts(drafts), concurrency_levels(speedup)
    ks, sweep = (per_kind(num_spec_tokens, kinds, "--num-spec-tokens", many=False),
                 per_kind(tune_k, kinds, "--tune-k", many=True))
    bid = jobs.validate_run_id(run_id or jobs.new_run_id("bakeoff"))
    configs_of(kinds, configs, t.host.profile)
    t.note(priced(t, kinds, dataset))
    rids, failed, early = {}, {}, {}
    first = bool(controls) and "untrained" in _controls.parse_controls(controls) and serve_check and \
        not t.host.is_slurm  # (each kind's untrained control is its preflight: controls.untrained_first())
    for kind in kinds:
        with t.step(f"bake-off: train the {drafts_name(kind)} draft ({bid}-{kind})"):
            try:
                if first:
                    early[kind] = _controls.untrained_first(
                        t, f"{bid}-{kind}", kind=kind, dataset=dataset, verifier=verifier,
                        config=train.draft_config(kind, config_of(kind, configs)), hidden_states=hidden_states,
                        dest=dest, num_spec_tokens=(ks.get(kind) or [3])[0], max_prompts=max_prompts,
                        max_tokens=max_tokens, vllm_arg=vllm_arg)
                res = train.train(t, draft=kind, config=config_of(kind, configs), run_id=f"{bid}-{kind}",
                                  dataset=dataset, verifier=verifier, follow=True, own=True,
                                  hidden_states=hidden_states, vllm_arg=vllm_arg, serve_check=serve_check,
                                  overrides={"epochs": epochs, "max-steps": max_steps},
                                  served_by="its untrained control" if kind in early else None)
                rids[kind] = res["run_id"]
            except SpecopsError as e:
                t.note(f"bake-off: the {drafts_name(kind)} draft did not train: {e}", "warn")
                failed[kind] = failed_row(kind, f"{bid}-{kind}", "training", e, levels)
    if not rids:
        raise SpecopsError(f"bake-off {bid}: no kind trained: "
                           + "; ".join(f"{k}: {r['error']}" for k, r in failed.items()))
    rows: list = []
    for kind in kinds:
        if kind in failed:
            rows.append(failed[kind])
            continue
        with t.step(f"bake-off: serve and time the {drafts_name(kind)} draft against the verifier alone"):
            kw: dict[str, Any] = dict(dest=dest, speedup=",".join(map(str, levels)), repeats=repeats, tune=tune,
                                      max_prompts=max_prompts, max_tokens=max_tokens, vllm_arg=vllm_arg,
                                      baselines=(baselines or evaluate.DEFAULT_BASELINES)
                                      if not any(r["kind"] in rids for r in rows) else "none")
            kw.update({k: v for k, v in dict(num_spec_tokens=(ks.get(kind) or [None])[0],
                                             tune_k=",".join(map(str, sweep.get(kind) or [])) or None,
                                             side_by_side=side_by_side, speedup_requests=speedup_requests,
                                             speedup_tokens=speedup_tokens, ceiling=ceiling).items() if v is not None})
            try:
                ev = (_controls.evaluate_run(t, rids[kind], controls=controls, measured=(
                    {"untrained": early[kind]} if kind in early else None), **kw).ev if controls
                      else evaluate.evaluate(t, rids[kind], **kw))
                rows.append(row(kind, rids[kind], ev, levels))
            except SpecopsError as e:
                t.note(f"bake-off: the {drafts_name(kind)} draft was not served and timed: {e}", "warn")
                rows.append(failed_row(kind, rids[kind], "evaluation", e, levels))
        if len(rows) < len(kinds):  # (a bake-off cut short, by a lost machine say, keeps its table so far)
            record(bid, t.host.name, kinds, levels, rows, dest, final=False)
    return record(bid, t.host.name, kinds, levels, rows, dest, final=True)


def record(bid: str, host: str, kinds: list, levels: list, rows: list, dest: str, *, final: bool) -> "Bakeoff":
    """dest/<bid>.json (and its plot where final): the rows so far, the winners among them, and `pending`, the kinds
    not yet served and timed (none where final). Written whole (contract.write_json), never half."""
    done = {r["kind"] for r in rows}
    out = Bakeoff({"bakeoff": bid, "host": host, "kinds": kinds, "levels": levels, "rows": rows,
                   "winners": winners(rows, levels), "pending": [k for k in kinds if k not in done],
                   "when": time.strftime("%Y-%m-%d %H:%M:%S")})
    Path(dest).mkdir(parents=True, exist_ok=True)
    out["file"] = str(Path(dest) / f"{bid}.json")
    out["plot"] = plot(out, Path(dest) / f"{bid}.png") if final else None
    write_json(out["file"], out)
    return out


def priced(t: Transport, kinds: list, dataset: Optional[str]) -> str:
    """What the dataset's plan.json says this bake-off costs (`inv plan --drafts`' `bakeoff`), or that none did."""
    ddir = data.data_dir(t, dataset)
    b = (read_plan(t, ddir) or {}).get("bakeoff") or {}
    if sorted(b.get("kinds") or []) != sorted(kinds):
        return (f"plan: none prices this bake-off of {', '.join(kinds)} ({ddir}/plan.json): `inv plan --drafts "
                f"{','.join(kinds)} --data FILE` measures it first")
    tot = b["total"]
    return (f"plan: this bake-off priced at {tot['hours']:.2f} h of training and data ({b['mode']}"
            + ("" if tot.get("gpu_hours") is None else f", {tot['gpu_hours']:.2f} GPU-hours")
            + ("" if tot.get("cost") is None else f", cost {tot['cost']:.2f}") + f"; {ddir}/plan.json)")


def plot(out: dict, path: Path) -> Optional[str]:
    """dest/<bakeoff id>.png: per kind its acceptance by draft position (left) and its speedup at each level, the
    bar the median and the whisker the min-max over the repeats, labelled with the k it was served at (right);
    None without matplotlib (specops[plot])."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows, levels = out["rows"], [str(c) for c in out["levels"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in rows:
        acc = r.get("acceptance_by_position") or []
        left.plot(range(len(acc)), acc, marker="o",
                  label=f"{r['kind']}: mean length {r.get('mean_acceptance_length') or 0:.2f}")
    left.set(xlabel="draft position", ylabel="accepted / drafted", ylim=(0, 1), title="acceptance by position")
    left.xaxis.get_major_locator().set_params(integer=True)
    left.legend(fontsize=8)
    width = 0.8 / max(len(rows), 1)
    for j, r in enumerate(rows):
        xs, ys, lo, hi, ks = [], [], [], [], []
        for i, c in enumerate(levels):
            d = r["by_concurrency"].get(c) or {}
            if d.get("ratio") is None:
                continue
            xs.append(i + (j - (len(rows) - 1) / 2) * width)
            ys.append(d["ratio"])
            lo.append(d["ratio"] - (d.get("ratio_min") if d.get("ratio_min") is not None else d["ratio"]))
            hi.append((d.get("ratio_max") if d.get("ratio_max") is not None else d["ratio"]) - d["ratio"])
            ks.append(_k(d.get("deploy")) or r.get("num_spec_tokens"))
        bars = right.bar(xs, ys, width=width, yerr=[lo, hi], capsize=3, label=r["kind"])
        for b, k, up in zip(bars, ks, hi):
            if k:
                right.annotate(f"k={k}", (b.get_x() + b.get_width() / 2, b.get_height() + up), ha="center",
                               va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    right.set_xticks(range(len(levels)))
    right.set_xticklabels(levels)
    right.set(xlabel="requests at once", ylabel="speedup over the verifier alone", title="speedup (median, min-max)")
    right.legend(fontsize=8)
    fig.suptitle(f"bake-off {out['bakeoff']} on {out.get('host', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _k(deploy: Optional[str]) -> Optional[int]:
    """num_speculative_tokens of a `vllm serve ... --speculative-config '{...}'` line, if one is there."""
    m = re.search(r'"num_speculative_tokens":\s*(\d+)', deploy or "")
    return int(m.group(1)) if m else None


def drafts_name(kind: str) -> str:
    return str(kinds_of.KINDS[kind]["name"])


class Bakeoff(dict):
    """bakeoff(): {bakeoff, host, kinds, levels, rows (a kind each), winners (per level), pending (kinds not yet
    timed: none once it ends), file}."""
