"""Where a small verifier's one-request figure moves on a GPU machine (issue 47's item 4): the machine's own speed
over seconds, from the torch venv alone (no vLLM, no model), in three alternating modes:

  cpu    a fixed pure-Python workload (the kind of work a server's scheduler and sampler do each step)
  eager  a batch-1 decode-shaped step launched op by op (16 layers x 4 bf16 matmuls of a 1B's width, synchronised
         each step): bound by the host's launch speed, as a 1B's step at one request is
  graph  the same step replayed as one CUDA graph: the GPU's own speed, the host nearly out of it

Each mode runs for WINDOW seconds at a time, the modes in turn, for TOTAL seconds; every window's rate is kept with
/proc/stat's deltas over it (user, system, idle, iowait, steal: a virtual machine's stolen time is its neighbours')
and the GPU's SM clock. Prints one JSON object (the windows and, per mode, median/min/max and the spread of
10 s means, the length of a timed side).

    /opt/torch/.venv/bin/python3 bench/gpu/noise.py --total 60 --window 1 > $OUT/noise.json
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch


def stat():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return {"user": v[0] + v[1], "system": v[2], "idle": v[3], "iowait": v[4], "steal": v[7] if len(v) > 7 else 0}


def sm_clock():
    try:
        return int(subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-i", "0"],
                                  capture_output=True, text=True, timeout=5).stdout.split()[0])
    except Exception:  # noqa: BLE001 - a probe: the clock is extra
        return None


def cpu_work():
    d = {}
    for i in range(2000):
        d[i % 97] = d.get(i % 97, 0) + i * 3 // 7
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--total", type=float, default=60)
    ap.add_argument("--window", type=float, default=1.0)
    a = ap.parse_args()
    dev = torch.device("cuda")
    w = [torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(4)]
    x0 = torch.randn(1, 2048, device=dev, dtype=torch.bfloat16)

    def step(x):
        for _ in range(16):
            for m in w:
                x = torch.tanh(x @ m)
        return x

    for _ in range(3):
        step(x0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    xs = x0.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(xs)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        ys = step(xs)
    del ys

    def run(mode):
        if mode == "cpu":
            cpu_work()
        elif mode == "eager":
            step(x0)
            torch.cuda.synchronize()
        else:
            g.replay()
            torch.cuda.synchronize()

    windows = []
    modes = ["cpu", "eager", "graph"]
    t_end = time.perf_counter() + a.total
    i = 0
    while time.perf_counter() < t_end:
        mode = modes[i % 3]
        i += 1
        s0, c0, n = stat(), time.perf_counter(), 0
        while time.perf_counter() - c0 < a.window:
            run(mode)
            n += 1
        dt = time.perf_counter() - c0
        s1 = stat()
        windows.append({"mode": mode, "t": round(c0, 3), "rate": n / dt,
                        "stat": {k: s1[k] - s0[k] for k in s0}, "sm_mhz": sm_clock() if mode != "cpu" else None})
    out = {"nproc": os.cpu_count(), "loadavg": open("/proc/loadavg").read().split()[:3],
           "gpu": torch.cuda.get_device_name(0), "window_s": a.window, "modes": {}, "windows": windows}
    per10 = max(1, round(10 / (3 * a.window)))  # a mode's windows in about 10 s of the run (one timed side)
    for m in modes:
        r = [x["rate"] for x in windows if x["mode"] == m]
        chunks = [statistics.fmean(r[j:j + per10]) for j in range(0, len(r) - per10 + 1, per10)]
        steal = sum(x["stat"]["steal"] for x in windows if x["mode"] == m)
        tot = sum(sum(x["stat"].values()) for x in windows if x["mode"] == m)
        out["modes"][m] = {"windows": len(r), "median": statistics.median(r), "min": min(r), "max": max(r),
                           "spread": (max(r) - min(r)) / min(r),
                           "chunk_means": chunks,
                           "chunk_spread": (max(chunks) - min(chunks)) / min(chunks) if len(chunks) > 1 else None,
                           "steal_share": steal / tot if tot else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
