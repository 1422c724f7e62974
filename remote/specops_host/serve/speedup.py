"""The speedup, measured by vLLM's own benchmark (`vllm bench serve`, through vllm_bench.py).

The sides: the verifier served without speculation (`baseline`), with the run's draft (`draft`),
with the draft at other settings (--tune: num_speculative_tokens and async scheduling, `tune`),
with vLLM's training-free methods (--baselines ngram,suffix, `free`), and with the draft's proposals accepted
at a chosen rate per position whatever they are (--ceiling: vLLM's synthetic rejection sampling, `ceiling`:
serve/synthetic.py). Every side is timed on
the same prompts (written once as the benchmark's custom dataset: {"prompt": text} per line, the
chat template already in them), at every concurrency level asked, `repeats` times: each repeat
runs the sides one after the other at each level (their order alternates between repeats), so
that drift of the machine falls on both sides of a ratio.

Which servers are up at once (batches(), `together`): on a cpu host two by default: the baseline
stays up beside each other side in turn (two tiny servers; a ratio is then the median of its
per-repeat ratios against the baseline timed just before or after it: `paired`); on a cuda host one
at a time by default (a ratio is then the ratio of the medians, `paired` false), or N with
--side-by-side N: the baseline beside N - 1 other sides at a time, the GPU's memory split between
the N servers (a sweep of k sides costs about k / (N - 1) server starts).

What is kept (record()): per side and level the median, min, max and relative spread
((max - min) / median) of output tokens/s, and the medians of TPOT, ITL and TTFT, the
benchmark's acceptance length; the ratio to the baseline (median of the per-repeat ratios, with
its min and max); `noisy` where the figure's spread exceeds NOISY (noisy()); the benchmark's result files and command
lines. With tune: the best side per level and its ready `vllm serve` line.
"""

import dataclasses
import json
import shlex
import statistics
from pathlib import Path
from typing import Optional

from specops_host.contract import Refused

NOISY = 0.05  # a figure whose spread across repeats exceeds this is marked
SHORT_S = 5.0  # on a GPU, a timed run under this many seconds is marked `short`: one wave of 16 requests lasted
# 1 s on an H100 (the third GPU bake-off, bench/results/bakeoff-gpu.md), mostly its start and end
METHODS = ("ngram", "suffix")
PERCENTILES = "ttft,tpot,itl,e2el"
ASYNC = "--async-scheduling"


def default_requests(kind, level):
    """Requests per level and side: a GPU's run lasts tens of seconds at every level (32 waves of
    `level` requests of 256 tokens: with 8 waves an 8B draft's run at 16 lasted 6 s on an H200 and
    its repeats spread 10%); a CPU's stays short (the tiny verifier; the demo's time goal)."""
    return 32 * level if kind == "cuda" else max(8, 2 * level)


def request_counts(text):
    """--speedup-requests's form, one parser for laptop and host: N for every level ({None: N}) or LEVEL:N,... for
    some ({level: N}); "" or "0": {} (the defaults). ValueError where it is neither, a level or count is under 1, or a
    level is named twice."""
    text = str(text or "").replace(" ", "")
    if text in ("", "0"):
        return {}
    if ":" not in text:
        n = int(text)
        if n < 1:
            raise ValueError(text)
        return {None: n}
    pairs = [(int(a), int(b)) for a, _, b in (x.partition(":") for x in text.split(","))]
    if any(c < 1 or n < 1 for c, n in pairs) or len(dict(pairs)) < len(pairs):
        raise ValueError(text)
    return dict(pairs)


def requests_given(text, levels):
    """{level: N} for the timed levels --speedup-requests sets (the others take default_requests); a bad form or a
    level not timed: Refused in one line."""
    try:
        counts = request_counts(text)
    except ValueError:
        raise Refused(f"--speedup-requests {text}: give N (every level) or LEVEL:N,... (e.g. 1:16,16:64), each 1 "
                      f"or more") from None
    off = [c for c in counts if c is not None and c not in levels]
    if off:
        raise Refused(f"--speedup-requests {text}: level {', '.join(map(str, off))} is not timed (--speedup "
                      f"{','.join(map(str, levels)) or 'none'}): name the levels timed")
    return {c: counts[None] for c in levels} if None in counts else counts


def default_tokens(kind, max_tokens):
    return 256 if kind == "cuda" else max_tokens


@dataclasses.dataclass
class Side:
    name: str
    role: str  # baseline | draft | tune | free
    spec: Optional[dict] = None  # the --speculative_config (None: no speculation)
    args: tuple = ()  # more vLLM arguments (the scheduler setting swept)

    def serve_args(self):
        return (["--speculative_config", json.dumps(self.spec)] if self.spec else []) + list(self.args)

    def describe(self):
        return {"name": self.name, "role": self.role, "speculative_config": self.spec, "vllm_args": list(self.args)}


def suffix_unavailable(vllm_dir):
    """Why the installed vLLM cannot serve `suffix` (None: it can): the method unknown to it, or
    its package arctic-inference missing."""
    import importlib.util

    try:
        text = (Path(vllm_dir) / "config" / "speculative.py").read_text()
    except OSError:
        text = ""
    if '"suffix"' not in text:
        return "this vLLM has no suffix method (vLLM 0.11 or later serves it)"
    if importlib.util.find_spec("arctic_inference") is None:
        return "vLLM serves it with the arctic-inference package, not installed in the host's venv " \
               "(pip install arctic-inference)"
    return None


def has_async(vllm_dir):
    """The installed vLLM has --async-scheduling (its engine arguments name it)."""
    try:
        return "async_scheduling" in (Path(vllm_dir) / "engine" / "arg_utils.py").read_text()
    except OSError:
        return False


def vllm_dir():
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else Path(".")


def free_spec(method, k):
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    return {"method": "suffix", "num_speculative_tokens": 32}  # (vLLM's documented setting: a tree's depth)


def sides(draft_spec, *, baselines=(), tune_k=(), tune_async=False, vdir=None, kind="eagle3"):
    """The sides of a measurement: baseline, draft, then the tune sweep (each k of tune_k, with
    async scheduling off and on where tune_async; without, the draft's own k is the draft side), then the free
    methods; and the methods skipped with why ([{"method", "why"}])."""
    out = [Side("baseline", "baseline"), Side("draft", "draft", draft_spec)]
    for k in tune_k:
        for a in ((False, True) if tune_async else (None,)):
            spec = {**draft_spec, "num_speculative_tokens": k}
            if a is None and spec == draft_spec:  # (the draft's own k: the draft side already times it)
                continue
            args = () if a is None else ((ASYNC,) if a else ("--no-async-scheduling",))
            name = f"{kind} k={k}" + ("" if a is None else f", async {'on' if a else 'off'}")
            out.append(Side(name, "tune", spec, args))
    skipped = []
    for m in baselines:
        why = suffix_unavailable(vdir or vllm_dir()) if m == "suffix" else None
        if why:
            skipped.append({"method": m, "why": why})
        else:
            out.append(Side(m, "free", free_spec(m, draft_spec.get("num_speculative_tokens", 3))))
    return out, skipped


def weights_bytes(*dirs):
    """The bytes of the model weights (safetensors, bin, pt) in these folders, not below."""
    return sum(f.stat().st_size for d in dirs if d and Path(d).is_dir() for f in Path(d).iterdir()
               if f.suffix in (".safetensors", ".bin", ".pt") and f.is_file())


def gpu_total_bytes():
    """GPU 0's memory in bytes by nvidia-smi, or None where it cannot tell."""
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        return int(out[0]) * 2 ** 20 if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def shared_gpu_args(shared, user_args, *, total, weights, tensor_parallel=1):
    """The vLLM arguments of one of `shared` servers on one GPU's memory: --gpu-memory-utilization
    0.9 / shared and an explicit --kv-cache-memory-bytes (its share less the weights, per GPU, and
    3 GiB for activations and graphs; 1 GiB at least), each unless the user's arguments set it.
    The explicit KV size is what lets servers start together: vLLM's memory profiling otherwise
    fails when another process's memory changes meanwhile ("Error in memory profiling", seen on an
    H200 with two 8B servers started at once)."""
    if shared <= 1:
        return []
    given = memory_flags(user_args)
    out = [] if "--gpu-memory-utilization" in given else [f"--gpu-memory-utilization={0.9 / shared:.2f}"]
    if "--kv-cache-memory-bytes" not in given and total:
        out.append(f"--kv-cache-memory-bytes={max(kv_share(shared, total, weights, tensor_parallel), 2 ** 30)}")
    return out


def memory_flags(user_args):
    """The memory settings among the user's vLLM arguments (--flag=v or --flag v, _ or -)."""
    return {x.split("=")[0].replace("_", "-") for x in user_args} & {"--gpu-memory-utilization",
                                                                       "--kv-cache-memory-bytes"}


def kv_share(shared, total, weights, tensor_parallel=1):
    """The KV cache bytes one of `shared` servers gets on a GPU of `total` bytes: 0.9 / shared of it
    less the weights (per GPU) and 3 GiB for activations and graphs."""
    return int(total * 0.9 / shared - weights / max(1, tensor_parallel) - 3 * 2 ** 30)


MIN_KV = 4 * 2 ** 30  # the KV cache each of two servers sharing a GPU needs at least, for the default


def together_default(kind, side_by_side=0, *, total=None, weights=0, tensor_parallel=1, user_args=()):
    """How many servers are up at once: --side-by-side N; else 2 on a cpu host; on a cuda host 2
    where two servers fit GPU 0 (shared_gpu_args' share each: its weights per GPU, 3 GiB and MIN_KV
    of KV cache; an 8B verifier on an H200 does, Kimi-K2.5 on 8 of them does not) and the user's
    vLLM arguments leave the memory to specops, else 1 (one server at a time)."""
    if side_by_side:
        return side_by_side
    if kind == "cpu":
        return 2
    if memory_flags(user_args) or not total:
        return 1
    return 2 if kv_share(2, total, weights, tensor_parallel) >= MIN_KV else 1


def batches(all_sides, together):
    """The servers up at once, batch after batch (see the module's docstring): one at a time, or
    the baseline beside together - 1 other sides at a time (the draft in the first batch)."""
    base, rest = all_sides[0], all_sides[1:]
    if together <= 1:
        return [[rest[0]], [base], *[[s] for s in rest[1:]]]
    n = together - 1
    return [[*rest[i:i + n], base] for i in range(0, len(rest), n)]


def bench_args(*, url, tokenizer, dataset, level, requests, tokens, result_dir, result_file, seed=0,
               trust_remote_code=False, side=""):
    """`vllm bench serve`'s arguments for one timed run: the custom dataset (chat template already
    in the prompts), `tokens` output tokens each (ignore_eos: exactly that many), temperature 0,
    `level` requests in flight, `level` warm-up requests first, the result JSON saved."""
    args = ["--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions", "--model", "verifier",
            "--tokenizer", str(tokenizer), "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--skip-chat-template", "--custom-output-len", str(tokens), "--ignore-eos", "--temperature", "0",
            "--num-prompts", str(requests), "--max-concurrency", str(level), "--request-rate", "inf",
            "--num-warmups", str(level), "--seed", str(seed), "--percentile-metrics", PERCENTILES,
            "--metric-percentiles", "50", "--disable-tqdm", "--save-result", "--result-dir", str(result_dir),
            "--result-filename", result_file]
    if trust_remote_code:
        args.append("--trust-remote-code")
    if side:
        args += ["--metadata", f"side={side}"]
    return args


def command(args):
    """The line a user types for the same run (`vllm bench serve`, where the vllm command works)."""
    return shlex.join(["vllm", "bench", "serve", *args])


def plan(batch, levels, repeats, *, urls, file_for, args_for):
    """One batch's runs in order: per repeat, per level, each side of the batch (order reversed
    every other repeat). [{"name", "side", "level", "repeat", "file", "args"}]."""
    runs = []
    for r in range(repeats):
        order = batch if r % 2 == 0 else list(reversed(batch))
        for c in levels:
            for s in order:
                f = file_for(s, c, r)
                runs.append({"name": f"{s.name} @{c}, repeat {r + 1} of {repeats}", "side": s.name, "level": c,
                             "repeat": r, "file": f, "args": args_for(s, c, urls[s.name], f)})
    return runs


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    med = statistics.median(xs)
    return {"median": round(med, 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
            "spread": round((max(xs) - min(xs)) / med, 4) if med else None, "n": len(xs)}


def streamed(res):
    """False where the benchmark's client received each answer in one piece: a median time to the
    first token of 90% or more of the whole request's, answers of more than one token. Seen on a
    2-core CPU host with two vLLM servers up and runs back to back (in about 1 run of 4: TTFT
    170 ms = the whole request, TPOT 0.001 ms), never one run per process with seconds between;
    never on an H200. Its TTFT, TPOT and ITL then describe the client, not the server; its tokens/s
    (tokens over the run's duration) still holds."""
    ttft, e2el = res.get("median_ttft_ms"), res.get("median_e2el_ms")
    per = (res.get("total_output_tokens") or 0) / max(res.get("completed") or 1, 1)
    return not (per > 1 and ttft and e2el and ttft >= 0.9 * e2el)


def figures(res):
    """The figures kept of one benchmark result JSON (a run not streamed(): no TTFT, TPOT, ITL)."""
    live = streamed(res)
    return {"output_tokens_per_s": res.get("output_throughput"), "streamed": live,
            **{k: res.get(f"median_{k}") if live else None for k in ("tpot_ms", "itl_ms", "ttft_ms")},
            "completed": res.get("completed"), "output_tokens": res.get("total_output_tokens"),
            "seconds": res.get("duration"), "acceptance_length": res.get("spec_decode_acceptance_length"),
            "acceptance_by_position": res.get("spec_decode_per_position_acceptance_rates")}


def noisy(v, base_spread, *, paired):
    """Whether a side's figure at a level moved more than NOISY across repeats. The baseline's
    figure is its tokens/s. Another side's is its ratio to the baseline: paired, the ratio's own
    spread (drift of the machine that moves both sides of a pair cancels in it: an H200 whose
    tokens/s fell 8% on both sides between repeats held a paired ratio within 1.7%); unpaired (one
    ratio of the medians), the wider of the two sides' tokens/s spreads, which it inherits."""
    own = (v.get("output_tokens_per_s") or {}).get("spread") or 0
    if "ratio" not in v:
        return own > NOISY
    if paired:
        return ((v.get("ratio") or {}).get("spread") or 0) > NOISY
    return max(own, base_spread or 0) > NOISY


def record(all_sides, runs, results, levels, *, paired, short_s=0.0):
    """The `sides` record: {name: {..describe(), "by_concurrency": {level: {...}}}} from the runs
    (plan()'s, every batch's) and their results ({file: figures()}); `short` where a side's runs at a level lasted
    under short_s seconds (their median: SHORT_S on a GPU, 0 on a CPU, whose runs are long and kept short)."""
    base = {(r["level"], r["repeat"], r["batch"]): results[r["file"]]["output_tokens_per_s"]
            for r in runs if r["side"] == "baseline"}
    base_at = {c: [x for (lv, _, _), x in base.items() if lv == c] for c in levels}  # (the baseline's runs per level)
    out = {}
    for s in all_sides:
        mine = [r for r in runs if r["side"] == s.name]
        by = {}
        for c in levels:
            at = [r for r in mine if r["level"] == c]
            if not at:
                continue
            figs = [results[r["file"]] for r in at]
            v = {"output_tokens_per_s": spread([f["output_tokens_per_s"] for f in figs]),
                 **{k: spread([f[k] for f in figs]) for k in ("tpot_ms", "itl_ms", "ttft_ms")},
                 "acceptance_length": (spread([f["acceptance_length"] for f in figs]) or {}).get("median"),
                 "seconds": spread([f.get("seconds") for f in figs]),
                 "completed": sum(f["completed"] or 0 for f in figs), "files": [r["file"] for r in at],
                 "unstreamed": sum(f.get("streamed") is False for f in figs)}
            if s.role != "baseline":
                if paired:
                    pairs = [(f["output_tokens_per_s"], base[(c, r["repeat"], r["batch"])]) for r, f in zip(at, figs)
                             if base.get((c, r["repeat"], r["batch"]))]
                    ratios = [x / y for x, y in pairs]
                    # (the baseline's runs this side was paired with: the pooled baseline of every pass is
                    # another figure, and beside a paired ratio it showed 30.3 vs 30.4 tokens/s for 1.09x)
                    v["baseline_tokens_per_s"] = spread([y for _, y in pairs])
                else:
                    ratios = ([v["output_tokens_per_s"]["median"] / statistics.median(base_at[c])]
                              if base_at[c] else [])
                    v["baseline_tokens_per_s"] = spread(base_at[c])
                v["ratio"] = spread(ratios)
            v["noisy"] = noisy(v, (spread(base_at[c]) or {}).get("spread"), paired=paired)
            v["short"] = bool(v["seconds"] and v["seconds"]["median"] < short_s)
            by[str(c)] = v
        out[s.name] = {**s.describe(), "by_concurrency": by}
    return out


def best(sides_rec, levels, deploy_for):
    """Per level the fastest side among the draft's settings (draft, tune), by its ratio to the
    baseline (paired: what drift of the machine moves least), then tokens/s: {level: {"side",
    "ratio", "output_tokens_per_s", "deploy"}}; and the one best over all levels (the highest
    geometric mean of its ratios) as "overall"."""
    mine = {n: s for n, s in sides_rec.items() if s["role"] in ("draft", "tune")}
    out = {}
    for c in map(str, levels):
        have = {n: s["by_concurrency"][c] for n, s in mine.items() if c in s["by_concurrency"]}
        if not have:
            continue
        n = max(have, key=lambda k: ((have[k].get("ratio") or {}).get("median") or 0,
                                     have[k]["output_tokens_per_s"]["median"] or 0))
        out[c] = {"side": n, "ratio": (have[n].get("ratio") or {}).get("median"),
                  "output_tokens_per_s": have[n]["output_tokens_per_s"]["median"], "deploy": deploy_for(mine[n])}

    def score(s):
        rs = [(s["by_concurrency"][c].get("ratio") or {}).get("median") or 0 for c in map(str, levels)
              if c in s["by_concurrency"]]
        return statistics.geometric_mean(rs) if rs and min(rs) > 0 else 0

    if mine:
        n = max(mine, key=lambda k: score(mine[k]))
        out["overall"] = {"side": n, "speculative_config": mine[n]["speculative_config"],
                          "vllm_args": mine[n]["vllm_args"], "deploy": deploy_for(mine[n])}
    return out


def deploy_line(verifier, side, *, tensor_parallel=1, trust_remote_code=False, user_args=()):
    """The `vllm serve` line that serves the verifier as `side` did."""
    argv = ["vllm", "serve", str(verifier)]
    if tensor_parallel > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel)]
    if trust_remote_code:
        argv.append("--trust-remote-code")
    if side.get("speculative_config"):
        argv += ["--speculative-config", json.dumps(side["speculative_config"])]
    return shlex.join(argv + list(side.get("vllm_args") or []) + list(user_args))


def last_error(log):
    """The benchmark's own error line, the last of its log ('...Error: ...' or argparse's '... error: ...')."""
    try:
        lines = Path(log).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for ln in reversed(lines[-200:]):
        if "Error: " in ln or ": error: " in ln or '"error":' in ln:
            return ln.strip()[:300]
    return ""


class SideFailed(RuntimeError):
    """A side's server did not start (its root error): that side is skipped, the rest measured."""


def measure(*, all_sides, levels, repeats, together, up, launch, wait, stop, out_dir, dataset, tokenizer,
            trust_remote_code, requests_for, tokens, python, ready=(), on_ready=None):
    """Every side timed (see the module's docstring): batch after batch, the servers of a batch
    up (`up`: {name: server} already running; launch(side) -> server, wait(server) raising
    SideFailed, stop(server); on_ready(side, server) once a side's server is healthy, before its timing: the
    evaluation's acceptance pass on a training-free method), then one benchmark process runs the batch's plan(). Returns
    (runs, results: {file: figures()}, failed: [{"side", "why"}]); `up` keeps what is still running."""
    import subprocess

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    all_runs, results, failed, ready = [], {}, [], set(ready)  # (ready: names of servers healthy already)
    todo = batches(all_sides, together)
    for bi, batch in enumerate(todo):
        batch = [s for s in batch if s.name not in {f["side"] for f in failed}]
        for s in batch:
            if s.name not in up:
                up[s.name] = launch(s)
        for s in list(batch):
            try:
                if s.name not in ready:
                    wait(up[s.name])
                    ready.add(s.name)
                    if on_ready:
                        on_ready(s, up[s.name])
            except SideFailed as e:
                if s.role in ("baseline", "draft"):
                    raise SystemExit(f"speedup: {s.name}: {e}") from None
                stop(up.pop(s.name))
                failed.append({"side": s.name, "why": str(e)})
                batch.remove(s)
        if any(s.role != "baseline" for s in batch) or together <= 1 and batch:
            slug = {s.name: "".join(ch if ch.isalnum() else "-" for ch in s.name).strip("-") for s in batch}

            def args_for(s, c, server, f):
                return bench_args(url=server.url, tokenizer=tokenizer, dataset=dataset, level=c,
                                  requests=requests_for(c), tokens=tokens, result_dir=out_dir, result_file=f,
                                  trust_remote_code=trust_remote_code, side=s.name)

            runs = plan(batch, levels, repeats, urls=up, args_for=args_for,
                        file_for=lambda s, c, r, bi=bi, slug=slug: f"b{bi}-{slug[s.name]}@{c}-r{r + 1}.json")
            for r in runs:
                r["batch"] = bi
                r["log"] = str(out_dir / "bench.log")
            plan_file = out_dir / f"runs-{bi}.json"
            plan_file.write_text(json.dumps(runs, indent=1))
            print(f"[specops] speedup: {', '.join(s.name for s in batch)} timed by vllm bench serve at concurrency "
                  f"{', '.join(map(str, levels))}, {repeats} repeat(s) ({len(runs)} runs)", flush=True)
            with open(out_dir / "bench.log", "a") as err:  # (vLLM's own noise at exit: its log, not the job's)
                p = subprocess.run([python, "-m", "specops_host.serve.vllm_bench", "--runs", str(plan_file)],
                                   stderr=err)
            if p.returncode != 0:
                why = last_error(out_dir / "bench.log")
                raise SystemExit(f"speedup: vllm bench serve failed (exit {p.returncode})"
                                 f"{': ' + why if why else ''} (its log: {out_dir / 'bench.log'})")
            bad = {}
            for r in runs:
                res = json.loads((out_dir / r["file"]).read_text())
                if res.get("specops_error"):
                    bad.setdefault(r["side"], res["specops_error"])
                else:
                    results[r["file"]] = figures(res)
            for s in batch:  # (a side whose benchmark failed: dropped, said; the baseline's or the draft's: the end)
                if s.name in bad and s.role in ("baseline", "draft"):
                    raise SystemExit(f"speedup: {s.name}: vllm bench serve failed: {bad[s.name]} "
                                     f"(its log: {out_dir / 'bench.log'})")
                if s.name in bad:
                    failed.append({"side": s.name, "why": f"vllm bench serve failed: {bad[s.name]}"})
            all_runs += [r for r in runs if r["side"] not in bad]
        later = {s.name for b in todo[bi + 1:] for s in b}
        for s in batch:
            if s.name not in later and s.name in up:
                stop(up.pop(s.name))
    return all_runs, results, failed
