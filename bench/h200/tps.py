"""Training throughput from speculators' per-step profile figures (log-freq 1), for one or more runs.

    python3 bench/h200/tps.py [--warmup 5] [--world N] NAME=RUN_DIR_OR_LOG [NAME=... ...]

A run folder (a specops run, or a by-hand run's output folder holding `logs/`) is read from its
TensorBoard event files (every step: specops' console lines wrap at 120 columns, so its log
misses some); a file is read as a console log (`profile/tokens_per_s=` lines). Run from the repo
root (the event files are read with specops.metrics: PYTHONPATH=. and tensorboard installed).

Per log: steps logged, median and mean `profile/tokens_per_s` over steps >= warmup (each
logged step is timed with a device synchronize, the same in every run), and the aggregate
(sum of tokens / sum of step time) over those steps; with two logs, the ratio first/second;
with three (order-balanced A, B, A), the mean of the first and third over the second.
speculators logs rank 0's own tokens and step time: with --world N (N data-parallel ranks,
each its own batch of the same size), the run's tokens/s are N times rank 0's.
"""

import argparse
import json
import os
import re
import statistics
import sys

PAIR = re.compile(r"([A-Za-z_][\w/]*)=(-?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))", re.I)


def steps(path):
    if os.path.isdir(path):
        from specops import metrics

        recs = metrics.from_events(metrics.event_files(path))
        return [r for r in recs if "profile/tokens_per_s" in r and "profile/step_ms" in r]
    out = []
    for line in open(path, errors="replace"):
        if "profile/tokens_per_s=" not in line:
            continue
        rec = {k: float(v) for k, v in PAIR.findall(line)}
        if "global_step" in rec:
            out.append(rec)
    return out


def summary(path, warmup, world=1):
    recs = steps(path)
    use = [r for r in recs if r["global_step"] >= warmup]
    if not use:
        return {"log": path, "steps": len(recs), "error": "no profiled steps past the warm-up"}
    tps = [r["profile/tokens_per_s"] * world for r in use]
    ms = [r["profile/step_ms"] for r in use]
    toks = sum(t * m / 1000 for t, m in zip(tps, ms))
    return {"log": path, "world": world, "steps": len(recs), "measured_steps": len(use), "median_tokens_per_s": round(statistics.median(tps)),
            "mean_tokens_per_s": round(statistics.mean(tps)), "aggregate_tokens_per_s": round(toks / (sum(ms) / 1000)),
            "median_step_ms": round(statistics.median(ms), 1), "tokens_per_step": round(toks / len(use)),
            "last_loss": use[-1].get("train/loss")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--world", type=int, default=1, help="data-parallel ranks of every run given")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    res = {}
    for item in a.logs:
        name, _, path = item.partition("=")
        res[name] = summary(path, a.warmup, a.world)
    names = list(res)
    if len(names) == 2 and all("median_tokens_per_s" in res[n] for n in names):
        x, y = res[names[0]], res[names[1]]
        res["ratio"] = {k: round(x[k] / y[k], 4) for k in ("median_tokens_per_s", "aggregate_tokens_per_s")}
        res["ratio"]["of"] = f"{names[0]} / {names[1]}"
    if len(names) == 3 and all("median_tokens_per_s" in res[n] for n in names):  # order-balanced: A, B, A
        a1, b, a2 = (res[n] for n in names)
        res["ratio"] = {k: round((a1[k] + a2[k]) / 2 / b[k], 4) for k in ("median_tokens_per_s", "aggregate_tokens_per_s")}
        res["ratio"]["of"] = f"mean({names[0]}, {names[2]}) / {names[1]}"
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
