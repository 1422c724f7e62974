"""Helpers shared by the bench/ scripts (not a benchmark itself).

Every bench script starts with the same three lines that take bench/ off sys.path (a script's
own folder is sys.path[0], and bench/inspect.py would otherwise shadow the stdlib `inspect`)
and put the repository root and tests/ there instead; then `from bench import _common`.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
HOST_PY = Path("~/.cache/specops/ml-env/bin/python3").expanduser()


def drop_caches() -> bool:
    """sync; echo 3 > /proc/sys/vm/drop_caches. True if permitted (the pass is then cold)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))]


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "median": statistics.median(xs), "p90": pct(xs, 90), "min": min(xs), "max": max(xs)}


def fmt(s: dict) -> str:
    return (f"median {s['median'] * 1000:7.1f} ms  p90 {s['p90'] * 1000:7.1f} ms  "
            f"min {s['min'] * 1000:7.1f} ms  max {s['max'] * 1000:7.1f} ms  (n={s['n']})")


def machine() -> str:
    mem = 0
    try:
        for ln in Path("/proc/meminfo").read_text().splitlines():
            if ln.startswith("MemTotal:"):
                mem = int(ln.split()[1]) / 2**20
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {mem:.1f} GiB RAM"


def free_gib(path: str | Path) -> float:
    return shutil.disk_usage(path).free / 2**30


def timed_run(argv: list[str], *, timeout: float, env: dict | None = None, cwd: str | Path | None = None):
    """(seconds, CompletedProcess) of one subprocess; raises on timeout."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    return time.perf_counter() - t0, p


def cli_env() -> dict:
    e = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    e.pop("SPECOPS_HOST", None)
    e.pop("SPECOPS_HOSTS", None)
    return e
