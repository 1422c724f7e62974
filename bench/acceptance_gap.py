"""Why does `vllm bench serve` report a lower acceptance length than `inv evaluate`'s acceptance?

    .venv/bin/python bench/acceptance_gap.py --hosts H.yaml --run-id R [--host local] [--prompts 32]
        [--tokens 64] [--long 256] [--vllm-arg=--enforce-eager] [--out bench/results/acceptance-gap.md]

`inv evaluate` measures acceptance on the run's held-out prompts sent as token ids, greedy, at most
--max-tokens each and stopping at the end of the answer; its speedup runs (`vllm bench serve`) send
the same prompts decoded to text (the custom dataset), with `--ignore-eos` and 256 tokens each on a
GPU. On an H200 the two figures differed: 3.62 against 2.79 (the 8B class), 3.81 against 3.57 (the
1B). This starts the draft's server (the one `inv evaluate --dry-run` says it starts), sends the
prompts one at a time in four ways, reading vLLM's spec-decode counters before and after each:
ids (evaluate's way), text (the benchmark's prompts file), ids with ignore_eos, ids with ignore_eos
and --long tokens; and counts the prompts whose text the server tokenizes back to other ids. Needs
one `inv evaluate --run-id R --speedup 1` first (it writes the benchmark's prompts file).
"""

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from bench import agreement  # noqa: E402  (its inv, free_port, healthy, server_env, stop_servers)
from specops_host.serve import counters, evaluate  # noqa: E402  (counters: the acceptance pass's parts)


def main():
    ap = agreement.box_parser("acceptance-gap.md")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--long", type=int, default=256)
    a = ap.parse_args()
    cmd = agreement.planned_servers(a, "--speedup", "1", "--baselines", "none")[0]
    text_file = agreement.bench_prompts(cmd, a.run_id, "acceptance_gap", 1)
    work = agreement.host_work(cmd)
    spec = json.loads((work / "runs" / a.run_id / "train-spec.json").read_text())
    ids = [p["prompt"] for p in evaluate.held_out_prompts(spec, a.prompts)[0]]
    texts = [json.loads(x)["prompt"] for x in text_file.read_text().splitlines() if x.strip()][:len(ids)]
    logs = Path(tempfile.mkdtemp(prefix="acceptance-gap-"))
    srv, port = agreement.start_server(cmd, agreement.server_env(cmd, work), logs / "server.log")
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        print(f"server healthy after {agreement.healthy(port, srv):.0f}s", flush=True)
        differ = sum(counters.post(f"{base}/tokenize", {"model": "verifier", "prompt": t})["tokens"] != list(i)
                     for i, t in zip(ids, texts))
        ways = [("ids, stop at the answer's end (inv evaluate's acceptance)", ids, a.tokens, False),
                ("text from the benchmark's prompts file, stop at the end", texts, a.tokens, False),
                ("ids, ignore_eos", ids, a.tokens, True),
                (f"ids, ignore_eos, {a.long} tokens (the speedup's runs on a GPU)", ids, a.long, True)]
        for name, prompts, tokens, ignore in ways:
            before, made, t0 = counters.parse_metrics(counters.get(f"{base}/metrics")), 0, time.time()
            for p in prompts:
                r = counters.post(f"{base}/v1/completions", {"model": "verifier", "prompt": p, "max_tokens": tokens,
                                                             "temperature": 0.0, "ignore_eos": ignore})
                made += r["usage"]["completion_tokens"]
            time.sleep(1)
            acc = counters.acceptance(before, counters.parse_metrics(counters.get(f"{base}/metrics")))
            rows.append((name, tokens, made / len(prompts), acc.get("mean_acceptance_length", 0.0),
                         acc.get("acceptance_by_position", [])))
            print(f"{name}: acceptance length {rows[-1][3]:.3f}, {rows[-1][2]:.1f} tokens a prompt "
                  f"({time.time() - t0:.0f}s)", flush=True)
    finally:
        agreement.stop_servers([srv])
    lines = [f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: run {a.run_id} on `{a.host}` "
             f"({os.cpu_count()} cores), {len(ids)} held-out prompts one at a time, greedy\n",
             f"`{' '.join(shlex.quote(x) for x in sys.argv)}`. Prompts whose text the server tokenizes back "
             f"to other ids: {differ} of {len(ids)}.\n",
             "| prompts sent as | max tokens | tokens a prompt | acceptance length | by position |",
             "|---|---|---|---|---|"]
    for name, tokens, made, acc, pos in rows:
        lines.append(f"| {name} | {tokens} | {made:.1f} | {acc:.3f} | {' / '.join(f'{x:.3f}' for x in pos)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(a.out, "a") as f:
        f.write(text)


if __name__ == "__main__":
    main()
