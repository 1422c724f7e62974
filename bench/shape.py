"""The code's shape before and after a change, measured on two checkouts side by side.

    .venv/bin/python bench/shape.py --old fee18e4 [--host-root remote[,PKG...]]
        [--demo-log [OLD_FILE,]NEW_FILE] [--ci-seconds OLD,NEW] [--out FILE.md] [--json FILE]
        [--train [--rounds 3] [--steps 2] [--dataset DIR]]

For the working tree and for a git worktree of --old (made under /tmp, removed after), read from
the files alone (a few seconds): README.md lines and characters; `dry_run` mentions in specops/ +
tasks.py, `.dry_run` reads and `planned(` calls; signatures whose return annotation is a union
naming `Plan` (`X | Plan`, `Optional[X | Plan]`, `dict | list[Plan]`); the largest module on each
side (the laptop: specops/ + tasks.py; the host: every .py found recursively under each
--host-root that exists there, default `remote`) and the modules over 500 lines; host modules the
laptop loads by file path (`remote_module(`, `spec_from_file_location`); tasks.py's lines, tasks,
`raise Exit` checks and lambdas; import cycles in specops/ (strongly connected components of the
import graph, lazy imports included, TYPE_CHECKING blocks not).

Two figures come from outside, both optional: `--demo-log` counts the lines of a saved `make demo`
output as `wc -l` does (one file: the new side; `OLD,NEW`: both sides; `OLD,`: the old side),
`--ci-seconds OLD,NEW` the seconds of CI's `make test`. A side left out shows `-`.

--train adds the timed part (off by default: minutes): `inv train --follow` on a `local`-transport
host of its own (workdir under /tmp, the `local` host's venv), alternating old and new --rounds
times on the same extracted dataset (default: the first dataset under the local host's workdir):
calls of specops.host.push.push per task (cProfile) and wall seconds, with the job's own seconds
(job.json start to exit_code) so the laptop's overhead shows apart. Needs the local host
bootstrapped and an extracted dataset (`inv demo` makes one).

Prints a markdown table (figure | old | new); --out writes it with the command, --json the figures.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))  # bench/inspect.py would shadow the stdlib's
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import ast  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

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


def static(root: Path, host_roots=("remote",)) -> dict:
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
            **contract_figures(root, lib), **round3_figures(root, host_roots)}


def _names_plan(node) -> bool:
    return any((isinstance(n, ast.Name) and n.id == "Plan") or (isinstance(n, ast.Attribute) and n.attr == "Plan")
               for n in ast.walk(node))


def _is_union(node) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr) for n in ast.walk(node)) or any(
        isinstance(n, ast.Subscript) and ast.unparse(n.value).split(".")[-1] in ("Union", "Optional")
        for n in ast.walk(node))


def plan_unions(root: Path, files) -> list:
    """Signatures whose return annotation is a union naming Plan: `X | Plan`, `Optional[X | Plan]`,
    `Union[X, Plan]`, `dict | list[Plan]` (a string annotation is parsed first)."""
    out = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
                ann = node.returns
                if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
                    ann = ast.parse(ann.value, mode="eval").body
                if _names_plan(ann) and _is_union(ann):
                    out.append(f"{p.relative_to(root)}:{node.name}")
    return out


def host_files(root: Path, host_roots) -> list:
    """Every .py under each host root that exists in this checkout (recursively)."""
    return sorted({p for h in host_roots if (root / h).is_dir() for p in (root / h).rglob("*.py")
                   if "__pycache__" not in p.parts})


def _lines(p: Path) -> int:
    return len(p.read_text().splitlines())


def calls(texts, name: str) -> int:
    """`name(` written anywhere but its own `def name(`."""
    return sum(len(re.findall(rf"\b{name}\(", t)) - len(re.findall(rf"\bdef {name}\(", t)) for t in texts)


def round3_figures(root: Path, host_roots) -> dict:
    """Issue 32's figures: README, dry-run's two ways, module sizes on each side, tasks.py's logic."""
    laptop = sorted((root / "specops").rglob("*.py")) + [root / "tasks.py"]
    host = host_files(root, host_roots)
    text = {p: p.read_text() for p in laptop}
    rel = lambda p: str(p.relative_to(root))  # noqa: E731
    lap_sizes = {rel(p): _lines(p) for p in laptop}
    host_sizes = {rel(p): _lines(p) for p in host}
    lap_big = max(lap_sizes, key=lap_sizes.get)
    host_big = max(host_sizes, key=host_sizes.get) if host_sizes else None
    readme = root / "README.md"
    rtext = readme.read_text() if readme.is_file() else ""
    tasks_tree = ast.parse(text[root / "tasks.py"])
    n_tasks = sum(1 for n in ast.walk(tasks_tree) if isinstance(n, ast.FunctionDef) and any(
        ast.unparse(d).split("(")[0] in ("task", "invoke.task") for d in n.decorator_list))
    return {"readme_lines": len(rtext.splitlines()), "readme_chars": len(rtext),
            "docs_pages": len(list((root / "docs").glob("*.md"))) if (root / "docs").is_dir() else 0,
            "dot_dry_run_mentions_all": sum(t.count(".dry_run") for t in text.values()),
            "planned_calls": calls(text.values(), "planned"),
            "plan_union_returns": plan_unions(root, laptop),
            "largest_laptop_module": [lap_big, lap_sizes[lap_big]],
            "laptop_modules_over_500": sorted(m for m, n in lap_sizes.items() if n > 500),
            "host_roots": [h for h in host_roots if (root / h).is_dir()],
            "host_modules": len(host_sizes), "host_lines": sum(host_sizes.values()),
            "largest_host_module": [host_big, host_sizes[host_big]] if host_big else None,
            "host_modules_over_500": sorted(m for m, n in host_sizes.items() if n > 500),
            "host_modules_loaded_by_path": calls(text.values(), "remote_module") + sum(
                t.count("spec_from_file_location(") for t in text.values() if "def remote_module(" not in t),
            "tasks_py_tasks": n_tasks,
            "tasks_py_raise_exit": len(re.findall(r"\braise Exit\b", text[root / "tasks.py"])),
            "tasks_py_lambdas": sum(1 for n in ast.walk(tasks_tree) if isinstance(n, ast.Lambda))}


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


def _pair(arg, n_needed=2):
    """'A,B' -> [A, B]; 'B' -> [None, B] (the new side only)."""
    if arg is None:
        return [None, None]
    parts = [x.strip() or None for x in arg.split(",")]
    return parts if len(parts) == 2 else [None, parts[0]]


def _mod(v):
    return f"{v[0]}, {v[1]} lines" if v else "-"


def _list(v):
    return f"{len(v)}" + (f" ({', '.join(v)})" if v else "")


ROWS = [  # (label, how a side's figures render)
    ("README.md lines (characters)", lambda r: f"{r['readme_lines']} ({r['readme_chars']:,})"),
    ("docs/*.md pages", lambda r: r["docs_pages"]),
    ("`dry_run` mentions, specops/ + tasks.py", lambda r: r["dry_run_mentions"]),
    ("`.dry_run` mentions", lambda r: r["dot_dry_run_mentions_all"]),
    ("`planned(` calls", lambda r: r["planned_calls"]),
    ("signatures returning `X \\| Plan` (a union naming Plan)", lambda r: len(r["plan_union_returns"])),
    ("largest module, laptop (specops/ + tasks.py)", lambda r: _mod(r["largest_laptop_module"])),
    ("largest module, host", lambda r: _mod(r["largest_host_module"])),
    ("modules over 500 lines, laptop", lambda r: _list(r["laptop_modules_over_500"])),
    ("modules over 500 lines, host", lambda r: _list(r["host_modules_over_500"])),
    ("host modules (lines), under", lambda r: f"{r['host_modules']} ({r['host_lines']:,}), "
                                               f"{', '.join(h + '/' for h in r['host_roots']) or '-'}"),
    ("host modules loaded by file path (`remote_module(` calls; `spec_from_file_location(` elsewhere)",
     lambda r: r["host_modules_loaded_by_path"]),
    ("tasks.py lines", lambda r: r["tasks_py_lines"]),
    ("tasks.py: tasks / `raise Exit` / lambdas",
     lambda r: f"{r['tasks_py_tasks']} / {r['tasks_py_raise_exit']} / {r['tasks_py_lambdas']}"),
    ("import cycles in specops/", lambda r: "; ".join(" <-> ".join(c) for c in r["import_cycles"]) or "none"),
    ("`make demo` output lines", lambda r: r.get("demo_log_lines", "-")),
    ("CI `make test` seconds", lambda r: r.get("ci_seconds", "-")),
]
TRAIN_ROWS = [
    ("`inv train --follow`: pushes per task", lambda r: r["train_median"]["pushes"]),
    ("`inv train --follow`: wall s (job s, laptop s)",
     lambda r: f"{r['train_median']['wall_s']} ({r['train_median']['job_s']}, {r['train_median']['laptop_s']})"),
]


def table(res: dict, train_rounds: int = 0) -> str:
    old, new = res["old"], res["new"]
    lines = [f"| figure | old ({old['commit']}) | new ({new['commit']}) |", "| --- | --- | --- |"]
    rows = ROWS + ([(f"{k} (median of {train_rounds})", f) for k, f in TRAIN_ROWS] if train_rounds else [])
    for label, f in rows:
        lines.append(f"| {label} | {f(old)} | {f(new)} |")
    return "\n".join(lines) + "\n"


def _describe(rev, cwd: Path) -> str:
    """A commit's short hash; the working tree's HEAD, `-dirty` when it has changes."""
    cmd = ["rev-parse", "--short", rev] if rev else ["describe", "--always", "--dirty"]
    return subprocess.run(["git", "-C", str(cwd), *cmd], capture_output=True, text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the commit to compare with (checked out under /tmp)")
    ap.add_argument("--new", default=None, help="a commit for the new side too (default: the working tree)")
    ap.add_argument("--host-root", default="remote",
                    help="the host side's top-level folders, comma-separated, each searched recursively where it "
                         "exists (default: remote)")
    ap.add_argument("--demo-log", default=None, metavar="[OLD_FILE,]NEW_FILE",
                    help="saved `make demo` output: its lines are counted")
    ap.add_argument("--ci-seconds", default=None, metavar="OLD,NEW", help="CI's `make test` seconds on each side")
    ap.add_argument("--train", action="store_true", help="also time `inv train --follow` on each side (minutes)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dataset", default=None)
    ap.add_argument("--out", default=None, help="write the table there (markdown, with the command)")
    ap.add_argument("--json", default=None, help="write the figures there too")
    a = ap.parse_args()
    host_roots = tuple(h.strip().strip("/") for h in a.host_root.split(",") if h.strip())
    dataset = None
    if a.train:
        local_work = Path("~/.cache/specops/work").expanduser()
        dataset = a.dataset or str(next(d for d in sorted((local_work / "data").iterdir())
                                        if (d / "specops-data.json").is_file()))
    with tempfile.TemporaryDirectory(prefix="specops-shape-") as tmp:
        tmp = Path(tmp)
        roots = {"old": tmp / "old", "new": tmp / "new" if a.new else REPO}
        made = []
        try:
            for side, rev in (("old", a.old), ("new", a.new)):
                if rev:
                    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(roots[side]), rev],
                                   check=True)
                    made.append(roots[side])
            res = {side: {"commit": _describe(rev, REPO) if rev else "working tree " + _describe(None, REPO),
                          **static(roots[side], host_roots)} for side, rev in (("old", a.old), ("new", a.new))}
            for side in ("old", "new"):
                res[side]["train"] = []
            for i in range(a.rounds if a.train else 0):
                for side in ("old", "new"):
                    wd = tmp / f"work-{side}"
                    hosts = tmp / f"hosts-{side}.yaml"
                    hosts.write_text(f"hosts:\n  shape:\n    transport: local\n    profile: cpu\n"
                                     f"    venv: ~/.cache/specops/ml-env\n    workdir: {wd}\n")
                    res[side]["train"].append(train_once(roots[side], hosts, dataset, a.steps, f"shape-{side}-{i}", wd))
        finally:
            for w in made:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(w)], check=False)
    for side, f in zip(("old", "new"), _pair(a.demo_log)):
        if f:
            data = Path(f).read_bytes()  # lines as `wc -l` counts them (a \r redraw is no new line)
            res[side]["demo_log_lines"] = data.count(b"\n") + (not data.endswith(b"\n") and len(data) > 0)
    for side, v in zip(("old", "new"), _pair(a.ci_seconds)):
        if v:
            res[side]["ci_seconds"] = float(v) if "." in v else int(v)
    if a.train:
        for side in ("old", "new"):
            tr = res[side]["train"]
            res[side]["train_median"] = {k: statistics.median(x[k] for x in tr) for k in ("pushes", "wall_s", "job_s")}
            res[side]["train_median"]["laptop_s"] = round(statistics.median(x["wall_s"] - x["job_s"] for x in tr), 2)
    md = table(res, a.rounds if a.train else 0)
    print(md, end="")
    if a.out:
        cmd = ".venv/bin/python bench/shape.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
        Path(a.out).write_text(f"    {cmd}\n\n{md}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
