"""The table of bench/h200/serve_bench.sh: for each side (plain, ngram, eagle3-kN) and concurrency,
the median and spread (min-max) across repeats of output tokens/s, mean TPOT and mean TTFT from
`vllm bench serve`'s own JSON files, and the speedup over plain as the median of per-repeat ratios
(repeat r of a side against repeat r of plain: measured minutes apart, interleaved). A figure whose
spread exceeds 5% of its median is marked `~`.

    python3 bench/h200/bench_table.py OUTDIR   # reads OUTDIR/<side>-c<C>-r<R>.json
"""
import json
import re
import statistics
import sys
from pathlib import Path


def main(out: Path) -> None:
    runs = {}
    for f in sorted(out.glob("*-c*-r*.json")):
        m = re.fullmatch(r"(.+)-c(\d+)-r(\d+)\.json", f.name)
        if m:
            runs.setdefault((m[1], int(m[2])), {})[int(m[3])] = json.loads(f.read_text())
    print("| side | concurrency | output tok/s (median, min-max) | TPOT ms | TTFT ms | acceptance length | "
          "speedup vs plain (median of per-repeat ratios, min-max) | repeats |")
    print("|---|---|---|---|---|---|---|---|")
    for (side, c), reps in sorted(runs.items(), key=lambda kv: (kv[0][1], not kv[0][0].startswith("plain"), kv[0][0])):
        tps = [r["output_throughput"] for r in reps.values()]
        tpot = [r.get("mean_tpot_ms", 0) for r in reps.values()]
        ttft = [r.get("mean_ttft_ms", 0) for r in reps.values()]
        acc = [1 + r["spec_decode_accepted_tokens"] / r["spec_decode_num_drafts"] for r in reps.values()
               if r.get("spec_decode_num_drafts")]  # (the benchmark's counters, read from /metrics around its run)
        peer = "plain" if any(k[0] == "plain" for k in runs) else "plain-sync"  # (ngram_after.sh's peer)
        base = runs.get((peer, c), {})
        ratios = [reps[k]["output_throughput"] / base[k]["output_throughput"] for k in reps if k in base]

        def fig(xs, f="{:.1f}"):
            if not xs:
                return "-"
            med = statistics.median(xs)
            mark = "~" if med and (max(xs) - min(xs)) / med > 0.05 else ""
            return f"{mark}{f.format(med)} ({f.format(min(xs))}-{f.format(max(xs))})"

        print(f"| {side} | {c} | {fig(tps)} | {fig(tpot, '{:.2f}')} | {fig(ttft)} | "
              f"{fig(acc, '{:.2f}')} | {fig(ratios, '{:.2f}x') if side != peer else '1'} | {len(reps)} |")
    print("\n`~`: spread (max-min) above 5% of the median.")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
