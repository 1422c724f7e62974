"""The plan's arithmetic (`inv plan`): what a whole run will take, extrapolated from the stages
measured briefly on a sample of its rows. Pure functions on numbers; the measuring is
specops/ops/plan.py, the table specops/views.py.

The model, a stage at a time (each figure keeps the measurement it rests on):
- data (prepare + extract, one job and one vLLM server, as `inv pipeline` runs them): the job's
  fixed part (its wall less the rows' own time as speculators logs it: prepare-data's
  preprocessing, generate-offline-data's elapsed; the rest is the server's start and stop and each
  command's own start) once, plus the rows' time scaled by the rows (full / sample).
  Online runs prepare only (its server renders conversations; none for pre-tokenised rows).
- train: the run's start (job start to its first logged step), then per epoch the training tokens
  (the full data's tokens x train_data_ratio) at the median step's tokens/s (each step's tokens over
  the wall between it and the step before, from the TensorBoard events), the checkpoint save, the
  validation (its tokens at 3x the training tokens/s: a forward only), then the job's end.
- disk: the bytes per token the sample's hidden states took, times the full data's tokens
  (offline); online stores none.
- GPU-hours: hours x the host's GPUs; cost: price_per_hour (per host, or per GPU x GPU-hours).
"""

from __future__ import annotations

import datetime
import math
import re
import statistics
from typing import Optional

#: stages of a run, in order, per hidden-states mode
STAGES = {"offline": ("prepare + extract", "train"), "online": ("prepare", "train")}
#: validation runs a forward only: this many times the training's tokens/s (an assumption, said so)
VAL_SPEEDUP = 3.0
#: auto's disk budget: the free space less 10% (remote/specops_host/train/online.py's HEADROOM)
HEADROOM = 1.10
#: speculators' default train_data_ratio (the rest of the rows is held out for validation)
TRAIN_RATIO = 0.9


def spread(xs: list[float]) -> Optional[dict]:
    """{n, min, median, max} of xs (None when empty)."""
    xs = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    if not xs:
        return None
    return {"n": len(xs), "min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def step_times(records: list[dict]) -> list[dict]:
    """Training steps from the run's metric records (specops.metrics: train records with
    global_step, wall_time and speculators' profile/tokens_per_s, profile/step_ms): one
    {step, seconds, tokens, tokens_per_s} per logged step after the first, seconds = the wall
    between it and the logged step before, per step (log-freq > 1: the gap divided by the steps)."""
    tr = sorted((r for r in records if r.get("split") == "train" and r.get("wall_time") is not None),
                key=lambda r: r.get("global_step", 0))
    out = []
    for prev, r in zip(tr, tr[1:]):
        gap = int(r.get("global_step", 0)) - int(prev.get("global_step", 0))
        dt = (float(r["wall_time"]) - float(prev["wall_time"])) / max(gap, 1)
        tps, ms = r.get("profile/tokens_per_s"), r.get("profile/step_ms")
        tokens = float(tps) * float(ms) / 1000 if tps is not None and ms is not None else None
        out.append({"step": int(r.get("global_step", 0)), "seconds": dt, "tokens": tokens,
                    "tokens_per_s": tokens / dt if tokens is not None and dt > 0 else None})
    return out


def train_measurement(records: list[dict], *, started: float, ended: float, tokens: int,
                      train_ratio: float = TRAIN_RATIO) -> dict:
    """One short training run's figures: startup (job start to the first logged step), its steps
    (step_times) and their spread, tokens/s (median step), the epoch's end (last step to the
    validation record: checkpoint + validation), the tail (to the job's end), the validation
    tokens (the sample's held-out share)."""
    tr = sorted((r for r in records if r.get("split") == "train" and r.get("wall_time") is not None),
                key=lambda r: r.get("global_step", 0))
    if not tr:
        raise ValueError("the run logged no training step")
    val = [r for r in records if r.get("split") == "val" and r.get("wall_time") is not None]
    steps = step_times(records)
    first, last = float(tr[0]["wall_time"]), float(tr[-1]["wall_time"])
    vwall = max(float(r["wall_time"]) for r in val) if val else last
    rates = [s["tokens_per_s"] for s in steps if s["tokens_per_s"]]
    return {"steps": len(tr), "timed_steps": len(steps), "startup_s": max(first - started, 0.0),
            "step_s": spread([s["seconds"] for s in steps]), "tokens_per_s": spread(rates),
            "epoch_end_s": max(vwall - last, 0.0), "tail_s": max(ended - vwall, 0.0),
            "wall_s": max(ended - started, 0.0), "val_tokens": tokens * (1 - train_ratio)}


def train_hours(m: dict, *, tokens_full: float, epochs: int, train_ratio: float = TRAIN_RATIO) -> dict:
    """The full training from one short run's measurement (train_measurement): seconds, and the
    parts: startup, epochs x (training tokens / median tokens/s + save + validation), tail."""
    tps = (m.get("tokens_per_s") or {}).get("median")
    if not tps:
        raise ValueError("no step with a measured tokens/s")
    val_tps = tps * VAL_SPEEDUP
    save = max(m["epoch_end_s"] - m["val_tokens"] / val_tps, 0.0)
    per_epoch = tokens_full * train_ratio / tps + save + tokens_full * (1 - train_ratio) / val_tps
    secs = m["startup_s"] + epochs * per_epoch + m["tail_s"]
    return {"seconds": secs, "startup_s": m["startup_s"], "epoch_s": per_epoch, "save_s": save,
            "tokens": tokens_full * epochs, "tokens_per_s": tps}


#: speculators' own timings in a data job's log: prepare-data's preprocessing (python logging
#: timestamps around it) and generate-offline-data's "Timing: 2.4s elapsed" (its requests)
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - [\w.]+ - INFO - \s*"
PREP_START = re.compile(_STAMP + r"Starting dataset preprocessing")
PREP_END = re.compile(_STAMP + r"Dataset preprocessing complete")
EXTRACT_ELAPSED = re.compile(r"Timing: ([\d.]+)s elapsed")


def _stamp(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def datagen_work(log: str) -> dict:
    """The seconds a data job's log says its rows took, less the commands' own start: prepare_work_s
    (speculators' preprocessing: first start to last end), extract_work_s (generate-offline-data's
    elapsed); None where the log does not say."""
    starts, ends = PREP_START.findall(log), PREP_END.findall(log)
    prep = _stamp(ends[-1]) - _stamp(starts[0]) if starts and ends else None
    ex = EXTRACT_ELAPSED.findall(log)
    return {"prepare_work_s": prep, "extract_work_s": sum(float(x) for x in ex) if ex else None}


def data_hours(m: dict, *, scale: float, mode: str) -> dict:
    """prepare (+ extract offline) for the full rows from the sample's data job: its fixed part
    once (the job's wall less the rows' own time: the server's start and stop, each command's
    start), the rows' time x scale. m: {wall_s, prepare_s, extract_s} (the commands' walls) and,
    where the log said, prepare_work_s / extract_work_s (the rows' time inside them)."""
    prep: float = m["prepare_work_s"] if m.get("prepare_work_s") is not None else m["prepare_s"]
    ex: float = m["extract_work_s"] if m.get("extract_work_s") is not None else m["extract_s"]
    fixed = max(m["wall_s"] - prep - ex, 0.0)
    if mode != "offline":  # (no generate-offline-data: its command's own start goes too)
        fixed = max(fixed - (m["extract_s"] - ex), 0.0)
    variable = prep + (ex if mode == "offline" else 0.0)
    return {"seconds": fixed + variable * scale, "fixed_s": fixed, "variable_s": variable * scale}


def auto_choice(need_bytes: float, *, free_bytes: Optional[float], disk_budget: Optional[float],
                hours: dict) -> dict:
    """What `--hidden-states auto` picks (remote/specops_host/train/online.py's rule: offline when the hidden states
    fit the disk budget, else online) and why, with both numbers; plus which mode is faster."""
    if disk_budget is not None:
        budget, what = float(disk_budget), "--disk-budget"
    else:
        budget, what = (free_bytes or 0) / HEADROOM, f"{size(free_bytes or 0)} free at the data dir, less 10%"
    fits = need_bytes <= budget
    faster = min(hours, key=lambda k: hours[k]) if hours else None
    mode = "offline" if fits else "online"
    reason = (f"the hidden states need {size(need_bytes)}, {'within' if fits else 'over'} the disk budget of "
              f"{size(budget)} ({what})")
    if faster:
        other = "online" if faster == "offline" else "offline"
        reason += (f"; {faster} is faster ({hours[faster] / 3600:.2f} h vs {hours[other] / 3600:.2f} h)"
                   if other in hours else "")
    return {"mode": mode, "reason": reason, "need_bytes": need_bytes, "budget_bytes": budget, "fits": fits,
            "faster": faster}


def price(hours: float, *, gpus: int, price_per_hour: Optional[float], per: str = "host") -> Optional[float]:
    """The cost of `hours` on the host: price_per_hour x hours (per host) or x GPU-hours (per gpu);
    None without a price."""
    if price_per_hour is None:
        return None
    return hours * price_per_hour * (max(gpus, 1) if per == "gpu" else 1)


def size(b: float) -> str:
    for unit, k in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):.2f} {unit}"
    return f"{int(b)} B"


def rows(m: dict, *, epochs: int, gpus: int, price_per_hour: Optional[float] = None, per: str = "host",
         disk_budget: Optional[float] = None, train_ratio: float = TRAIN_RATIO) -> dict:
    """The plan from the measurements (specops/ops/plan.py's `measured`): per mode its rows
    {stage, tokens, seconds, hours, disk_bytes, gpu_hours, cost, basis} and a total; auto's choice;
    the extrapolation's scale. m: {rows_total, rows_sample, tokens_sample, data{wall_s, prepare_s,
    extract_s, tokens}, bytes_per_token, train{offline, online}, free_bytes}."""
    scale = m["rows_total"] / m["rows_sample"]
    tokens_full = m["tokens_sample"] * scale
    disk = m["bytes_per_token"] * tokens_full
    out: dict = {"scale": scale, "tokens_full": tokens_full, "epochs": epochs, "modes": {}}
    for mode in ("offline", "online"):
        t = m["train"].get(mode)
        if t is None:
            continue
        d = data_hours(m["data"], scale=scale, mode=mode)
        tr = train_hours(t, tokens_full=tokens_full, epochs=epochs, train_ratio=train_ratio)
        dm = m["data"]
        pw = dm.get("prepare_work_s") if dm.get("prepare_work_s") is not None else dm["prepare_s"]
        ew = dm.get("extract_work_s") if dm.get("extract_work_s") is not None else dm["extract_s"]
        data_basis = (f"{m['rows_sample']} rows in {dm['wall_s']:.0f} s (prepare {pw:.1f} s"
                      + (f", extract {ew:.1f} s at {dm['tokens'] / max(ew, 1e-9):.0f} tokens/s"
                         if mode == "offline" else "")
                      + f"; {d['fixed_s']:.0f} s fixed) x {scale:.1f}")
        stages = [
            {"stage": STAGES[mode][0], "tokens": tokens_full, "seconds": d["seconds"],
             "disk_bytes": disk if mode == "offline" else 0.0, "basis": data_basis, "parts": d},
            {"stage": "train", "tokens": tr["tokens"], "seconds": tr["seconds"], "disk_bytes": 0.0,
             "basis": train_basis(t, epochs), "parts": tr}]
        for s in stages:
            s["hours"] = s["seconds"] / 3600
            s["gpu_hours"] = s["hours"] * gpus if gpus else None
            s["cost"] = price(s["hours"], gpus=gpus, price_per_hour=price_per_hour, per=per)
        total = sum(s["seconds"] for s in stages)
        out["modes"][mode] = {"stages": stages, "seconds": total, "hours": total / 3600,
                              "gpu_hours": total / 3600 * gpus if gpus else None,
                              "cost": price(total / 3600, gpus=gpus, price_per_hour=price_per_hour, per=per),
                              "disk_bytes": disk if mode == "offline" else 0.0}
    out["auto"] = auto_choice(disk, free_bytes=m.get("free_bytes"), disk_budget=disk_budget,
                              hours={k: v["seconds"] for k, v in out["modes"].items()})
    return out


def train_basis(t: dict, epochs: int) -> str:
    """What a training's price rests on: the short run's steps (train_measurement), their spread, its start and end."""
    ts, tk = t["step_s"] or {}, t["tokens_per_s"] or {}
    return (f"{t['timed_steps']} steps: {ts.get('min', 0):.2f}/{ts.get('median', 0):.2f}/"
            f"{ts.get('max', 0):.2f} s per step (min/median/max), {tk.get('min', 0):.0f}/"
            f"{tk.get('median', 0):.0f}/{tk.get('max', 0):.0f} tokens/s; start {t['startup_s']:.0f} s, "
            f"save + validation {t['epoch_end_s']:.0f} s; {epochs} epoch(s)")


def bakeoff(out: dict, kinds: dict, *, mode: str, gpus: int, price_per_hour: Optional[float] = None,
            per: str = "host") -> dict:
    """A bake-off priced (`inv plan --drafts`): the data stage of `mode` once (rows()' own row: the kinds share the
    prepared rows and their hidden states), then each kind's training in that mode, and the total. out: rows()'s
    plan; kinds: kind -> {train (its train_measurement in `mode`), epochs, train_ratio, config}. Returns {mode,
    rows: [{stage, kind, config, epochs, tokens, seconds, hours, disk_bytes, gpu_hours, cost, basis}], total}."""
    data = dict(out["modes"][mode]["stages"][0], kind=None, config=None, epochs=None)
    rows = [data]
    for kind, k in kinds.items():
        tr = train_hours(k["train"], tokens_full=out["tokens_full"], epochs=k["epochs"], train_ratio=k["train_ratio"])
        rows.append({"stage": "train", "kind": kind, "config": k["config"], "epochs": k["epochs"],
                     "tokens": tr["tokens"], "seconds": tr["seconds"], "disk_bytes": 0.0,
                     "basis": train_basis(k["train"], k["epochs"]), "parts": tr})
    for r in rows[1:]:
        r["hours"] = r["seconds"] / 3600
        r["gpu_hours"] = r["hours"] * gpus if gpus else None
        r["cost"] = price(r["hours"], gpus=gpus, price_per_hour=price_per_hour, per=per)
    secs = sum(r["seconds"] for r in rows)
    total = {"seconds": secs, "hours": secs / 3600, "gpu_hours": secs / 3600 * gpus if gpus else None,
             "cost": price(secs / 3600, gpus=gpus, price_per_hour=price_per_hour, per=per),
             "disk_bytes": data["disk_bytes"]}
    return {"mode": mode, "kinds": list(kinds), "rows": rows, "total": total}


#: a training past this many hours gets one line saying so, with what would shorten it
LONG_HOURS = 3.0


def too_long(seconds: float, tokens_per_s: float, *, epochs: int, draft_vocab=None,
             basis: str = "measured") -> Optional[str]:
    """The line that warns of a training past LONG_HOURS (None when shorter): its hours at the tokens/s,
    and what shortens it (a draft vocabulary sized to the data, fewer epochs, shorter or fewer rows)."""
    hours = seconds / 3600
    if hours <= LONG_HOURS:
        return None
    vocab = (f"a draft vocabulary sized to the data (--draft-vocab-size auto; now {draft_vocab}), "
             if draft_vocab not in (None, "auto") else "")
    return (f"the training takes about {hours:.1f} h at {tokens_per_s:.0f} tokens/s ({basis}, {epochs} epoch(s)): "
            f"{vocab}fewer epochs (--epochs), shorter rows (--seq-length) or fewer rows shorten it")


def error(planned: float, actual: float) -> Optional[float]:
    """(planned - actual) / actual; None without an actual."""
    return (planned - actual) / actual if actual else None
