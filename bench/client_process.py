"""Does running `vllm bench serve` runs back to back in one process slow the later runs?

    .venv/bin/python bench/client_process.py --hosts H.yaml --run-id R [--host local] [--level 16]
        [--runs 6] [--blocks 2] [--requests 128] [--tokens 128] [--side draft|baseline]
        [--vllm-arg=--enforce-eager] [--out bench/results/client-process.md]

specops times a speedup's runs in one process (`specops_host.serve.vllm_bench --runs`: vLLM imported
once); vLLM's own CLI is one process per run. On the H200 the draft's second run at 16 came out 8-20%
slower than its first on three machines (bench/results/h200-vllm.md), and on a 2-core CPU some runs'
answers reached the client in one piece (docs/failures.md row 148). This starts one server (the one
`inv evaluate --dry-run` says it starts for --side), then times the same run --runs times in one
process ("one") and in --runs processes ("each"), the two arms alternating --blocks times, and reports
per arm and run position: output tokens/s, duration, p90 latency, and runs in one piece (median TTFT
90% or more of the median end-to-end latency). The host must be this machine.
"""

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from bench import agreement  # noqa: E402  (its inv, free_port, healthy)


def ran(p, arm):
    if p.returncode != 0:
        sys.exit(f"client_process: a `{arm}` run failed ({p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")


def main():
    ap = agreement.box_parser("client-process.md")
    ap.add_argument("--level", type=int, default=16)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--side", choices=("draft", "baseline"), default="draft")
    a = ap.parse_args()
    cmd = agreement.planned_servers(a, "--speedup", str(a.level), "--baselines", "none")[0 if a.side == "draft" else 1]
    python = cmd[0]
    work = Path(tempfile.mkdtemp(prefix="client-process-"))
    tok = cmd[cmd.index("--model") + 1]
    prompts = agreement.bench_prompts(cmd, a.run_id, "client_process", a.level)
    env = agreement.server_env(cmd, agreement.host_work(cmd))
    srv, port = agreement.start_server(cmd, env, work / "server.log")
    results = {"one": [], "each": []}
    try:
        print(f"server healthy after {agreement.healthy(port, srv):.0f}s", flush=True)

        def args(name):
            # (e2el asked by name: vLLM 0.26 saves neither it nor the per-request latencies by default)
            return [*agreement.run_args(port, tok, prompts, a.tokens, a.requests, a.level, work / f"{name}.json"),
                    "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90"]

        mod = [python, "-m", "specops_host.serve.vllm_bench"]
        for b in range(a.blocks):
            for arm in (("one", "each") if b % 2 == 0 else ("each", "one")):
                names = [f"{arm}-b{b}-r{i}" for i in range(a.runs)]
                t0 = time.time()
                if arm == "one":
                    spec = work / f"{arm}-b{b}.json"
                    spec.write_text(json.dumps([{"name": n, "args": args(n),
                                                 "log": str(work / f"{n}.log")} for n in names]))
                    ran(subprocess.run([*mod, "--runs", str(spec)], env=env, capture_output=True, text=True), arm)
                else:
                    for n in names:
                        p = subprocess.run([*mod, "serve", *args(n)], env=env, capture_output=True, text=True)
                        (work / f"{n}.log").write_text(p.stdout + p.stderr)
                        ran(p, arm)
                for i, n in enumerate(names):
                    d = json.loads((work / f"{n}.json").read_text())
                    results[arm].append({"block": b, "pos": i, "tok_s": d["output_throughput"], "dur": d["duration"],
                                         "p90": d["p90_e2el_ms"] / 1000,
                                         "piece": d["median_ttft_ms"] >= 0.9 * d["median_e2el_ms"]})
                print(f"block {b} {arm}: " + ", ".join(f"{r['tok_s']:.0f}" for r in results[arm][-a.runs:])
                      + f" tok/s ({time.time() - t0:.0f}s)", flush=True)
    finally:
        agreement.stop_servers([srv])
    lines = [f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: run {a.run_id} on `{a.host}` "
             f"({os.cpu_count()} cores), {a.side} server, {a.requests} requests x {a.tokens} tokens at {a.level}, "
             f"{a.runs} runs an arm, {a.blocks} blocks\n",
             "| arm | tok/s by run position (median over blocks) | first / rest | p90 latency s (median) | runs in one piece |",
             "|---|---|---|---|---|"]
    for arm, rs in results.items():
        by_pos = [statistics.median(r["tok_s"] for r in rs if r["pos"] == i) for i in range(a.runs)]
        first, rest = by_pos[0], statistics.median(by_pos[1:]) if a.runs > 1 else by_pos[0]
        lines.append(f"| {arm} | {', '.join(f'{x:.0f}' for x in by_pos)} | {first / rest:.3f} | "
                     f"{statistics.median(r['p90'] for r in rs):.2f} | {sum(r['piece'] for r in rs)} of {len(rs)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(a.out, "a") as f:
        f.write(text)


if __name__ == "__main__":
    main()
