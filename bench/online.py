"""Benchmark: training on online hidden states vs offline ones, the same rows, in the same run (issue 13).

    .venv/bin/python bench/online.py [--rows 48] [--tokens 384] [--epochs 1] [--dir /var/tmp] [--compile] [--keep]

On this machine, through specops' own library with the `local` transport (a hosts file of its own:
workdir under --dir, the `local` host's venv ~/.cache/specops/ml-env): a tiny random Llama verifier
(6 layers, hidden 256; layers 1,3,4,6), --rows pre-tokenised rows of about --tokens tokens each,
prepared once (`prepare-data`) and copied into two datasets, then back to back:
  offline: `extract` (the vLLM backend) writes every row's hidden states into the dataset, then
           `train --hidden-states offline`;
  online:  `train --hidden-states online`: the run's own vLLM extraction server generates each row's
           hidden states when the trainer asks, and the trainer deletes them once loaded.
Both trainings use the same config (configs/demo.yaml's settings with --epochs), the same rows, the
same number of steps. Per mode it prints: the median training tokens/s over the steps (speculators'
profile/tokens_per_s, the first step dropped), the mean share of a step spent fetching data
(profile/fetch_frac), the job's wall time (online: its server's start included; offline: plus the
extraction's wall time), and the bytes each left on disk: the dataset's hidden_states/ and the run's
stage folder after the run; online also the peak bytes staged at once (sampled every 0.2 s). Then
online/offline tokens/s. Every vLLM server runs with --enforce-eager unless --compile (the CPU
server then starts in ~30 s instead of minutes; both modes alike). Removes its workdir at the end
(--keep keeps it). One heavy experiment: run it on an otherwise idle machine.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path[:0] = [os.path.dirname(_HERE), os.path.join(os.path.dirname(_HERE), "tests")]

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from bench import _common as C  # noqa: E402
from specops.ops import data, jobs, train  # noqa: E402
from specops import inventory  # noqa: E402
from specops.host.connection import connect  # noqa: E402

LAYERS = "1,3,4,6"
STEP = re.compile(rb"profile/tokens_per_s=([0-9.e+-]+)")
FETCH = re.compile(rb"profile/fetch_frac=([0-9.e+-]+)")


def du(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rows_file(path: Path, n: int, tokens: int, seed: int = 0) -> Path:
    r = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            k = r.randint(tokens * 3 // 4, tokens * 5 // 4)
            ids = [r.randint(7, 1000) for _ in range(k)]
            f.write(json.dumps({"input_ids": ids, "loss_mask": [0] * (k // 4) + [1] * (k - k // 4)}) + "\n")
    return path


def steps(log: bytes) -> dict:
    tps = [float(x) for x in STEP.findall(log)]
    frac = [float(x) for x in FETCH.findall(log)]
    steady = tps[1:] or tps
    return {"steps": len(tps), "tokens_per_s": statistics.median(steady) if steady else float("nan"),
            "fetch_frac": statistics.mean(frac[1:] or frac) if frac else float("nan")}


class Sampler(threading.Thread):
    """The peak size of a folder while it exists (sampled)."""

    def __init__(self, path: Path, every: float = 0.2):
        super().__init__(daemon=True)
        self.path, self.every, self.peak, self.done = path, every, 0, threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                self.peak = max(self.peak, du(self.path))
            except OSError:
                pass
            time.sleep(self.every)


def run_train(t, cfg, rid, ds, ver, mode, vllm_args, stage=None):
    sampler = Sampler(stage) if stage else None
    if sampler:
        sampler.start()
    t0 = time.perf_counter()
    res = train.train(t, config=str(cfg), run_id=rid, dataset=ds, verifier=ver, hidden_states=mode, layers=LAYERS,
                      vllm_arg=vllm_args, follow=True)
    wall = time.perf_counter() - t0
    if sampler:
        sampler.done.set()
        sampler.join()
    if res["exit_code"] != 0:
        raise SystemExit(f"{mode} training failed:\n{jobs.tail(t, rid, 30)}")
    log = t.read_bytes(jobs.run_path(t, rid, "output.log"), limit=64 << 20) or b""
    return {"wall": wall, **steps(log), "peak_staged": sampler.peak if sampler else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--compile", action="store_true", help="let vLLM compile (default: --enforce-eager)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if not C.HOST_PY.exists():
        raise SystemExit(f"no host venv at {C.HOST_PY}: run `.venv/bin/inv bootstrap --host local` first")
    print(f"machine: {C.machine()}; {time.strftime('%Y-%m-%d %H:%M:%S')}; load {os.getloadavg()[0]:.2f}")
    tmp = Path(tempfile.mkdtemp(prefix="specops-bench-online-", dir=a.dir))
    work = tmp / "work"
    hosts = tmp / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"bench": {"transport": "local", "profile": "cpu", "workdir": str(work),
                                                         "venv": str(C.HOST_PY.parent.parent)}}}))
    cfg_src = yaml.safe_load((C.REPO / "configs" / "demo.yaml").read_text())
    cfg_src["train"]["epochs"] = a.epochs
    cfg = tmp / "bench.yaml"
    cfg.write_text(yaml.safe_dump(cfg_src))
    vargs = [] if a.compile else ["--enforce-eager"]
    try:
        h = inventory.load(str(hosts)).get("bench")
        with connect(h) as t:
            ver = f"{work}/models/tiny-llama"
            data.make_tiny_verifier(t, ver)
            src = rows_file(tmp / "rows.jsonl", a.rows, a.tokens)
            base = f"{work}/data/base"
            data.run_datagen(t, data.Datagen.of(t, data=base, verifier=ver, prepare=str(src), seq_length=2048),
                             kind="prepare", quiet=True)
            for name in ("offline", "online"):
                shutil.copytree(base, f"{work}/data/{name}")
            n_tok = sum(len(json.loads(x)["input_ids"]) for x in src.read_text().splitlines())
            print(f"data: {a.rows} rows, {n_tok} tokens; config demo.yaml, epochs {a.epochs}; vLLM "
                  f"{'compiled' if a.compile else '--enforce-eager'}")

            t0 = time.perf_counter()
            ex = data.run_datagen(t, data.Datagen.of(t, data=f"{work}/data/offline", verifier=ver, extract=True,
                                                       layers=LAYERS, vllm_arg=vargs), kind="extract", quiet=True)
            extract_wall = time.perf_counter() - t0
            print(f"offline: extract {extract_wall:.1f}s ({ex['extract']['tokens']} tokens, "
                  f"{ex['extract']['tokens_per_s']} tokens/s while extracting)")
            off = run_train(t, cfg, "bench-offline", f"{work}/data/offline", ver, "offline", vargs)
            off_bytes = du(work / "data" / "offline" / "hidden_states")
            print(f"offline: train {off['steps']} steps, median {off['tokens_per_s']:.1f} tokens/s, fetch share "
                  f"{off['fetch_frac']:.3f}, job {off['wall']:.1f}s (+ extract {extract_wall:.1f}s = "
                  f"{off['wall'] + extract_wall:.1f}s); left on disk: {off_bytes} B of hidden states")

            stage = work / ".specops" / "hs-stage" / "bench-online"
            on = run_train(t, cfg, "bench-online", f"{work}/data/online", ver, "online", vargs, stage)
            on_bytes = du(work / "data" / "online" / "hidden_states") + du(stage)
            print(f"online:  train {on['steps']} steps, median {on['tokens_per_s']:.1f} tokens/s, fetch share "
                  f"{on['fetch_frac']:.3f}, job {on['wall']:.1f}s (server start included); left on disk: "
                  f"{on_bytes} B (peak staged at once: {on['peak_staged']} B)")
            print("--- summary ---")
            print(f"tokens/s online/offline:        {on['tokens_per_s'] / off['tokens_per_s']:.2f}x "
                  f"({on['tokens_per_s']:.1f} vs {off['tokens_per_s']:.1f})")
            print(f"wall online / (extract+offline): {on['wall'] / (off['wall'] + extract_wall):.2f}x "
                  f"({on['wall']:.1f}s vs {off['wall'] + extract_wall:.1f}s)")
            print(f"bytes left on disk:             online {on_bytes} B, offline {off_bytes} B "
                  f"({off_bytes / 2**20:.1f} MiB); online peak staged {on['peak_staged'] / 2**20:.2f} MiB")
            print(f"load average at the end: {os.getloadavg()[0]:.2f} (other work on the machine skews both modes)")
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
