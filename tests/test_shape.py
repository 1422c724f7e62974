"""The code's shape, checked: no import cycles in specops/, only the views module (and the CLI
glue) writes to the screen, every remote script's entry point is the contract's wrapper, the
connection pushes remote/ at most once, and a failing remote script always answers with a framed
{"ok": false}."""

import ast
import subprocess
import sys
from pathlib import Path

from specops import jobs, push
from specops.connection import connect
from specops.remote_exec import decode_payload, run_script

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "specops"


def imports(path: Path) -> set[str]:
    """specops modules a module imports (lazy imports included, TYPE_CHECKING blocks not)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specops"):
            parts = node.module.split(".")
            out |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
    return out


def test_no_import_cycles():
    mods = {p.stem: p for p in LIB.glob("*.py")}
    graph = {m: {x for x in imports(p) if x in mods and x != m} for m, p in mods.items()}
    cycles = []

    def visit(m, path):
        for n in graph[m]:
            if n in path:
                cycles.append(path[path.index(n):] + [n])
            elif n not in done:
                visit(n, path + [n])
        done.add(m)

    done: set = set()
    for m in sorted(graph):
        if m not in done:
            visit(m, [m])
    assert not cycles, cycles


def test_only_views_write_to_the_screen():
    offenders = []
    for p in LIB.glob("*.py"):
        if p.stem in ("views",):
            continue
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{p.name}:{node.lineno} print")
            if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    a.name in ("Console", "console", "err_console", "Table", "Progress") for a in node.names):
                offenders.append(f"{p.name}:{node.lineno} imports {[a.name for a in node.names]}")
    tree = ast.parse((REPO / "tasks.py").read_text())
    offenders += [f"tasks.py:{n.lineno} print" for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]
    assert not offenders, offenders


def test_every_remote_entry_point_is_the_contract_wrapper():
    scripts = [p for p in (REPO / "remote").glob("*.py") if 'if __name__ == "__main__":' in p.read_text()]
    assert len(scripts) >= 10
    trainers = ("train_cpu.py", "train_online.py")  # (speculators' own CLI in-process: its exit code is the job's)
    bad = [p.name for p in scripts if p.name not in trainers
           and "contract.main(main)" not in p.read_text().split('if __name__ == "__main__":', 1)[1]]
    assert not bad, bad


def test_a_crashing_script_answers_with_a_framed_error(tmp_path):
    """Any failure in main() reaches the laptop as one framed line naming the file and line."""
    (tmp_path / "boom.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nimport contract\n\ndef main():\n    {}['missing']\n\n"
        "contract.main(main)\n" % str(REPO / "remote"))
    p = subprocess.run([sys.executable, str(tmp_path / "boom.py"), "--result", str(tmp_path / "r.json")],
                       capture_output=True, text=True)
    got = decode_payload(p.stdout)
    assert p.returncode == 1 and got["ok"] is False and "KeyError" in got["error"] and "boom.py:6" in got["error"]
    assert '"ok": false' in (tmp_path / "r.json").read_text()


def test_push_once_per_connection_and_reconnect_in_place(light_host, monkeypatch):
    """Several remote calls on one connection push remote/ once; reconnect() keeps the object."""
    calls = []
    real = push.push
    monkeypatch.setattr(push, "push", lambda t: calls.append(1) or real(t))
    with connect(light_host) as t:
        rid = jobs.new_run_id("t") + "-shape"
        jobs.start(t, rid, ["sh", "-c", "echo hi"], kind="test")
        jobs.status(t)
        jobs.status(t, rid)
        run_script(t, "manifest", [jobs.run_path(t, rid)], changes=False)
        t.reconnect()
        assert t.run("true").ok and jobs.status(t, rid)[0].run_id == rid
    assert len(calls) == 1


def test_every_task_help_is_whole_and_has_an_example():
    """`inv --list` shows each docstring's first line: a whole sentence; `inv --help T` an example."""
    import tasks

    for name, t in tasks.ns.tasks.items():
        doc = t.body.__doc__ or ""
        first = doc.strip().splitlines()[0]
        assert first.rstrip().endswith("."), f"{name}: {first!r}"
        assert len(first) <= 110, f"{name}: first line over 110 characters"
        assert "Example: inv " in doc, name
