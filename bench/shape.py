"""The code's shape before and after a change, measured on two checkouts side by side.

    .venv/bin/python bench/shape.py --old 03e81d1 [--rounds 3] [--steps 2] [--dataset DIR]

For the working tree and for a git worktree of --old (made under /tmp, removed after): import
cycles in specops/ (strongly connected components of the import graph, lazy imports included,
TYPE_CHECKING blocks not), `dry_run` mentions in specops/ + tasks.py (and in specops/ without
the CLI glue and the connection), lines of tasks.py; then `inv train --follow` on a `local`-
transport host of its own (workdir under /tmp, the `local` host's venv), alternating old and
new --rounds times on the same extracted dataset (default: the first dataset under the local
host's workdir): calls of specops.host.push.push per task (cProfile) and wall seconds, with the
job's own seconds (job.json start to exit_code) so the laptop's overhead shows apart.
Needs the local host bootstrapped and an extracted dataset (`inv demo` makes one).
"""

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROFILE = r'''
import cProfile, pstats, sys, time
sys.argv = ["inv"] + sys.argv[1:]
from invoke import Collection, Program
import tasks
prog = Program(namespace=Collection.from_module(tasks))
pr = cProfile.Profile(); t0 = time.time(); pr.enable()
try:
    prog.run(sys.argv, exit=False)
finally:
    pr.disable()
    st = pstats.Stats(pr)
    n = sum(v[1] for k, v in st.stats.items() if k[0].endswith(("specops/push.py", "specops/host/push.py"))
            and k[2] == "push")
    print(f"SHAPE-RESULT {n} {time.time() - t0:.2f}", file=sys.stderr)
'''


def lib_files(root: Path) -> dict:
    """The package's modules by dotted name under specops (flat or in layer packages)."""
    lib = root / "specops"
    return {".".join(p.relative_to(lib).with_suffix("").parts): p for p in lib.rglob("*.py")
            if p.name != "__init__.py"}


def import_graph(root: Path) -> dict:
    mods = lib_files(root)
    graph = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        here = m.split(".")[:-1]
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, ast.ImportFrom):
                continue
            if node.level:  # relative: from the module's own package up
                base = here[:len(here) - node.level + 1] + ((node.module or "").split(".") if node.module else [])
            elif (node.module or "").startswith("specops"):
                base = node.module.split(".")[1:]
            else:
                continue
            for a in node.names:
                full = ".".join(base + [a.name])
                deps.add(full if full in mods else ".".join(base))
        graph[m] = {d for d in deps if d in mods and d != m}
    return graph


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def mentions(root: Path, files) -> int:
    return sum(p.read_text().count("dry_run") for p in files)


def static(root: Path) -> dict:
    files = lib_files(root)
    lib = sorted(files.values())
    glue = {"cli.py", "transport.py", "connection.py"}
    sizes = {m: len(p.read_text().splitlines()) for m, p in files.items()}
    big = max(sizes, key=sizes.get)
    return {"modules": len(files), "packages": sorted({m.split(".")[0] for m in files if "." in m}),
            "largest_module": [big, sizes[big]], "modules_over_500_lines": sorted(m for m, n in sizes.items() if n > 500),
            "import_cycles": cycles(import_graph(root)),
            "dry_run_mentions": mentions(root, lib + [root / "tasks.py"]),
            "dry_run_files": sum(1 for p in lib + [root / "tasks.py"] if "dry_run" in p.read_text()),
            "dry_run_mentions_library": mentions(root, [p for p in lib if p.name not in glue]),
            "tasks_py_lines": len((root / "tasks.py").read_text().splitlines()),
            **contract_figures(root, lib)}


def contract_figures(root: Path, lib: list) -> dict:
    """The contract and dry-run figures of issue 23: `.dry_run` checks and "None under --dry-run"
    docstrings (specops/ + tasks.py), run_script calls that name the reply's model (of all), bare
    `.run(` calls on a connection in the library (a read that forgets changes=False is planned),
    hand-indexed train-spec fields on the host (`spec["..."]` / `spec.get(` in the host's train
    launcher and online.py, read before or after the checked reader), and the ways several hosts are opened."""
    import re

    both = lib + [root / "tasks.py"]
    text = {p: p.read_text() for p in both}
    calls = with_model = 0
    for p in lib:
        for node in ast.walk(ast.parse(text[p])):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "run_script":
                calls += 1
                with_model += any(k.arg == "model" for k in node.keywords)
    bare = sum(len(re.findall(r"\b(?:t|self\.t|ts\[\d\])\.run\(", text[p])) for p in lib
               if p.name not in ("transport.py", "ssh.py", "local.py"))
    return {"dot_dry_run_mentions": sum(t.count(".dry_run") for t in text.values()),
            "none_under_dry_run_docstrings": sum(t.count("None under --dry-run") for t in text.values()),
            "run_script_calls_with_model": [with_model, calls],
            "bare_connection_run_calls": bare,
            "train_spec_checked_on_read": any((root / f).is_file()
                                              for f in ("remote/trainspec.py", "specops_host/train/spec.py")),
            "several_host_idioms": {k: sum(t.count(k) for t in text.values())
                                    for k in ("connect_all(", "run_on(", "Group.open(", "is_multi(")}}


def train_once(root: Path, hosts: Path, dataset: str, steps: int, rid: str, workdir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(root), "NO_COLOR": "1"}
    p = subprocess.run([sys.executable, "-c", PROFILE, "train", "--host", "shape", "--hosts", str(hosts),
                        "--dataset", dataset, "--config", "configs/demo.yaml", "--max-steps", str(steps),
                        "--run-id", rid, "--follow"], cwd=root, env=env, capture_output=True, text=True)
    line = next((ln for ln in p.stderr.splitlines() if ln.startswith("SHAPE-RESULT")), None)
    if p.returncode != 0 or line is None:
        raise SystemExit(f"inv train failed in {root}: {(p.stderr or p.stdout)[-2000:]}")
    _, pushes, wall = line.split()
    job = json.loads((workdir / "runs" / rid / "job.json").read_text())
    job_s = (workdir / "runs" / rid / "exit_code").stat().st_mtime - job["started"]
    return {"pushes": int(pushes), "wall_s": float(wall), "job_s": round(job_s, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, help="the commit to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--json", default=None, help="write the figures there too")
    a = ap.parse_args()
    local_work = Path("~/.cache/specops/work").expanduser()
    dataset = a.dataset or str(next(d for d in sorted((local_work / "data").iterdir())
                                    if (d / "specops-data.json").is_file()))
    with tempfile.TemporaryDirectory(prefix="specops-shape-") as tmp:
        tmp = Path(tmp)
        old = tmp / "old"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(old), a.old], check=True)
        try:
            res = {"old": {"commit": a.old, **static(old)}, "new": {"commit": "working tree", **static(REPO)}}
            for side, root in (("old", old), ("new", REPO)):
                res[side]["train"] = []
            for i in range(a.rounds):
                for side, root in (("old", old), ("new", REPO)):
                    wd = tmp / f"work-{side}"
                    hosts = tmp / f"hosts-{side}.yaml"
                    hosts.write_text(f"hosts:\n  shape:\n    transport: local\n    profile: cpu\n"
                                     f"    venv: ~/.cache/specops/ml-env\n    workdir: {wd}\n")
                    res[side]["train"].append(train_once(root, hosts, dataset, a.steps, f"shape-{side}-{i}", wd))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False)
    for side in ("old", "new"):
        tr = res[side]["train"]
        res[side]["train_median"] = {k: statistics.median(x[k] for x in tr) for k in ("pushes", "wall_s", "job_s")}
        res[side]["train_median"]["laptop_s"] = round(statistics.median(x["wall_s"] - x["job_s"] for x in tr), 2)
    for side in ("old", "new"):
        r = res[side]
        print(f"{side} ({r['commit']}): import cycles {r['import_cycles'] or 'none'}; dry_run mentions "
              f"{r['dry_run_mentions']} in {r['dry_run_files']} files ({r['dry_run_mentions_library']} in the "
              f"library without CLI glue/connection); tasks.py {r['tasks_py_lines']} lines; inv train: "
              f"pushes {r['train_median']['pushes']}, wall {r['train_median']['wall_s']} s (job "
              f"{r['train_median']['job_s']} s, laptop {r['train_median']['laptop_s']} s), median of {a.rounds}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
