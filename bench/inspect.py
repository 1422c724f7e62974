"""Benchmark: `inv inspect-data` (header-only / sampled) vs fully loading every file.

    .venv/bin/python bench/inspect.py [--files 220] [--seq 2048] [--layers 4] [--hidden 3200]
                                      [--dir /var/tmp] [--keep]

Synthesises a speculators-0.9 dataset with specops.synth (default 220 files of
hidden_states bf16 [2048, 4, 3200] + token_ids, ~52 MB each, ~10.7 GiB; one random bf16
block is reused for every file) in a temp dir under --dir (refused if < size + 1.5 GiB free).
Then, in the same run, each pass after `sync; echo 3 > /proc/sys/vm/drop_caches` (cold, if
permitted; the output says whether it was):
  (a) `inv inspect-data --host local --path DIR --sample 0 --json`: CLI wall time and the
      remote script's own "seconds" (header-only pass over every file); then once more warm;
  (b) the same with `--sample 8` (8 files fully loaded and checked);
  (c) the peer: safetensors.torch.load_file of every file by the host venv's python
      (~/.cache/specops/ml-env), timing only the loads, each tensor materialised (.clone()):
      load_file alone mmaps the file and returns lazy views (it reads ~20 MB of a 52 MB file),
      so it is not a full load; (c') that lazy load_file alone is shown too.
Prints each and the ratios (c)/(a). Targets: (a) <= 2 s and >= 20x faster than (c).
The data is deleted at the end unless --keep.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bench import _common as C  # noqa: E402
from specops import synth  # noqa: E402

# Run by the host venv's interpreter: import first (untimed), then time only the loads.
LOAD_ALL = r"""
import json, sys, time
from pathlib import Path
import torch
from safetensors.torch import load_file
files = sorted(Path(sys.argv[1], "hidden_states").glob("hs_*.safetensors"))
materialise = sys.argv[2] == "materialise"
n = 0
t0 = time.perf_counter()
for p in files:
    t = load_file(str(p))  # safetensors >= 0.4 mmaps the file: tensors are lazy views
    if materialise:
        t = {k: v.clone() for k, v in t.items()}  # every byte read into memory
    n += sum(v.numel() * v.element_size() for v in t.values())
    del t
print(json.dumps({"seconds": time.perf_counter() - t0, "files": len(files), "bytes": n}))
"""


def make_data(root: Path, files: int, seq: int, layers: int, hidden: int) -> int:
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(files):
        rows.append({"input_ids": rng.integers(0, 32000, seq).tolist(),
                     "loss_mask": [0] * (seq // 2) + [1] * (seq - seq // 2)})
    synth.write_dataset(root, rows)
    block = synth.bf16_bytes(rng.standard_normal((seq, layers, hidden), dtype=np.float32))
    hs = root / "hidden_states"
    hs.mkdir()
    for i, r in enumerate(rows):
        synth.write_safetensors(hs / f"hs_{i}.safetensors", {
            "hidden_states": ("BF16", [seq, layers, hidden], block),
            "token_ids": ("I64", [seq], np.asarray(r["input_ids"], np.int64).tobytes())})
    return sum(p.stat().st_size for p in hs.iterdir())


def load_all(root: Path, mode: str) -> dict:
    C.drop_caches()
    _, p = C.timed_run([str(C.HOST_PY), "-c", LOAD_ALL, str(root), mode], timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"full load failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def inspect_cli(path: Path, sample: int) -> tuple[float, dict]:
    argv = [str(C.VENV_BIN / "inv"), "inspect-data", "--host", "local", "--path", str(path),
            "--sample", str(sample), "--json"]
    wall, p = C.timed_run(argv, timeout=600, env=C.cli_env(), cwd=C.REPO)
    out = p.stdout
    try:
        res = json.loads(out[out.index("{"):])
    except ValueError:
        raise SystemExit(f"inspect-data printed no JSON (exit {p.returncode}):\n{out[-2000:]}\n{p.stderr[-2000:]}") from None
    if p.returncode != 0 or not res.get("ok"):
        raise SystemExit(f"inspect-data failed (exit {p.returncode}): {res.get('violations')[:3]}\n{p.stderr[-1000:]}")
    return wall, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=220)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=3200)
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if not C.HOST_PY.exists():
        raise SystemExit(f"no host venv at {C.HOST_PY}: run `.venv/bin/inv bootstrap --host local` first")

    want = a.files * (a.seq * a.layers * a.hidden * 2 + a.seq * 8 + 256)
    need = want / 2**30 + 1.5
    free = C.free_gib(a.dir)
    if free < max(need, 12.0 if want >= 10 * 2**30 else 0):
        raise SystemExit(f"refusing: {a.dir} has {free:.1f} GiB free, this benchmark writes "
                         f"{want / 2**30:.1f} GiB and needs >= {max(need, 12.0):.1f} GiB free (use --dir)")
    print(f"machine: {C.machine()}; {time.strftime('%Y-%m-%d %H:%M:%S')}")
    tmp = Path(tempfile.mkdtemp(prefix="specops-bench-inspect-", dir=a.dir))
    root = tmp / "data"
    try:
        t0 = time.perf_counter()
        size = make_data(root, a.files, a.seq, a.layers, a.hidden)
        os.sync()
        print(f"synthesised {a.files} files, {size / 2**30:.2f} GiB in {time.perf_counter() - t0:.1f}s -> {root}")

        cold = C.drop_caches()
        print(f"drop_caches: {'permitted (passes are cold)' if cold else 'NOT permitted (passes are warm)'}")
        wall_a, res_a = inspect_cli(root, 0)
        print(f"(a) inspect-data --sample 0 [{'cold' if cold else 'warm'}]: CLI {wall_a:.3f}s, script "
              f"{res_a['seconds']:.3f}s (header pass {res_a.get('header_seconds')}s), "
              f"{res_a['files']} files, {res_a['bytes'] / 2**30:.2f} GiB")
        wall_aw, res_aw = inspect_cli(root, 0)
        print(f"(a') same, warm: CLI {wall_aw:.3f}s, script {res_aw['seconds']:.3f}s")

        C.drop_caches()
        wall_b, res_b = inspect_cli(root, 8)
        print(f"(b) inspect-data --sample 8 [{'cold' if cold else 'warm'}]: CLI {wall_b:.3f}s, script "
              f"{res_b['seconds']:.3f}s ({len(res_b['sampled'])} files loaded)")

        full = load_all(root, "materialise")
        print(f"(c) peer: load_file + materialise x {full['files']} [{'cold' if cold else 'warm'}]: "
              f"{full['seconds']:.2f}s ({full['bytes'] / 2**30:.2f} GiB, "
              f"{full['bytes'] / 2**20 / full['seconds']:.0f} MiB/s)")
        lazy = load_all(root, "lazy")
        print(f"(c') load_file alone (lazy mmap views) x {lazy['files']}: {lazy['seconds']:.2f}s")

        r_cli, r_script = full["seconds"] / wall_a, full["seconds"] / res_a["seconds"]
        print("--- summary ---")
        print(f"inspect-data header-only, CLI wall:   {wall_a:.3f}s  (target <= 2 s: "
              f"{'MET' if wall_a <= 2 else 'MISSED'})")
        print(f"full load / inspect-data CLI:         {r_cli:.1f}x  (target >= 20x: "
              f"{'MET' if r_cli >= 20 else 'MISSED'})")
        print(f"full load / inspect script seconds:   {r_script:.1f}x")
        print(f"full load / inspect --sample 8 CLI:   {full['seconds'] / wall_b:.1f}x")
        print(f"lazy load_file / inspect-data CLI:    {lazy['seconds'] / wall_a:.1f}x")
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
