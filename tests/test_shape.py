"""The code's shape, checked: in specops/ and specops_host/ alike no import cycle and every import
downwards, only the views (views.py and its terminal.py) write to the screen, every remote script's
entry point is the contract's wrapper, the connection pushes specops_host/ at most once, and a failing
remote script always answers with a framed {"ok": false}."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specops.ops import jobs
from specops.host import push
from specops.host.connection import connect
from specops.host.remote_exec import decode_payload, run_script

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "specops"
HOST = REPO / "remote" / "specops_host"
#: the two packages held to one shape: the laptop's specops/ and the host's specops_host/
PACKAGES = {"specops": LIB, "specops_host": HOST}


def modules(root: Path = LIB) -> dict[str, Path]:
    """Every module of a package by dotted name under it ('ops.train', 'views', ...)."""
    return {".".join(p.relative_to(root).with_suffix("").parts): p for p in root.rglob("*.py")
            if p.name != "__init__.py"}


def imports(path: Path, root: Path = LIB, top: str = "specops") -> set[str]:
    """The package's modules a module imports, by dotted name under it (lazy imports included,
    TYPE_CHECKING blocks not): `from specops.ops import train` and `from specops.ops.train import
    x` are both 'ops.train'; so for specops_host (`from specops_host.serve import vllm_server`)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    mods = modules(root)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name[len(top) + 1:] for a in node.names if a.name.startswith(top + ".")}
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        assert node.level == 0, f"{path}:{node.lineno}: a relative import ({top} imports are absolute)"
        mod = node.module or ""
        if mod != top and not mod.startswith(top + "."):
            continue
        base = mod[len(top) + 1:] if mod != top else ""
        for a in node.names:
            name = f"{base}.{a.name}" if base else a.name
            out.add(name if name in mods else base)
    return {m for m in out if m in mods}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found = []

    def visit(m, path):
        for n in sorted(graph[m]):
            if n in path:
                found.append(path[path.index(n):] + [n])
            elif n not in done:
                visit(n, path + [n])
        done.add(m)

    done: set = set()
    for m in sorted(graph):
        if m not in done:
            visit(m, [m])
    return found


def package_of(m: str) -> str:
    """A module's package ('ops.train' -> 'ops'); a top-level module is its own ('contract')."""
    return m.split(".")[0]


@pytest.mark.parametrize("top", PACKAGES)
def test_no_import_cycles(top):
    """No loop of imports, lazy ones included, between modules or between packages (a top-level
    module counts as a package of its own)."""
    root = PACKAGES[top]
    mods = modules(root)
    graph = {m: {x for x in imports(p, root, top) if x != m} for m, p in mods.items()}
    assert not cycles(graph), cycles(graph)
    packages: dict[str, set[str]] = {}
    for m, used in graph.items():
        packages.setdefault(package_of(m), set()).update(package_of(x) for x in used if package_of(x) != package_of(m))
    assert not cycles(packages), cycles(packages)


#: who may import whom: the host layer knows no stage, the stages no group, the base modules none
LAYERS = {"host": ("host",), "slurm": ("host", "slurm"), "ops": ("host", "slurm", "ops"),
          "group": ("host", "slurm", "ops", "group")}
BASE = ("inventory", "contract", "payloads", "errors", "paths", "config", "profiles", "metrics", "args", "synth",
        "estimate")
#: the host's floors, from the ground: the base modules (the contract, the heavy programs'
#: environment, the data layouts, complete checkpoints) import no package; then jobs/, install/,
#: fetch/, fixtures/ (each only itself); serve/ (a vLLM server is a job); data/ (extraction
#: serves the verifier); train/ (online training serves it and reads the data); check/ on top
HOST_LAYERS = {"jobs": ("jobs",), "install": ("install",), "fetch": ("fetch",), "fixtures": ("fixtures",),
               "serve": ("jobs", "serve"), "data": ("jobs", "serve", "data"),
               "train": ("jobs", "install", "serve", "data", "train"),
               "check": ("jobs", "install", "serve", "data", "train", "check")}
HOST_BASE = ("contract", "hostenv", "datafmt", "ckpt", "lean")


@pytest.mark.parametrize("top", PACKAGES)
def test_layers_import_downwards_only(top):
    """Each package imports only the floors below it (lazy imports included); a base module no
    package. Every module of the host is a base module or in a layer."""
    root = PACKAGES[top]
    layers, base = (LAYERS, BASE) if top == "specops" else (HOST_LAYERS, HOST_BASE)
    bad = []
    for m, p in modules(root).items():
        pkg = m.split(".")[0] if "." in m else None
        for x in imports(p, root, top):
            xpkg = x.split(".")[0] if "." in x else None
            if pkg in layers and xpkg and xpkg not in layers[pkg]:
                bad.append(f"{m} -> {x}")
            if m in base and xpkg:
                bad.append(f"{m} -> {x}")
        if top == "specops_host" and not (m in base or pkg in layers):
            bad.append(f"{m}: neither a base module nor in a layer (HOST_LAYERS, HOST_BASE)")
    assert not bad, bad


def test_every_package_says_what_lives_there():
    for d in ("host", "slurm", "ops", "group"):
        doc = ast.get_docstring(ast.parse((LIB / d / "__init__.py").read_text())) or ""
        assert len(doc.splitlines()) >= 2, d


def test_only_views_write_to_the_screen():
    offenders = []
    for m, p in modules().items():
        if m in ("views", "terminal"):  # (the views, and the screen's primitives and live line they render on)
            continue
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{m}:{node.lineno} print")
            if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    a.name in ("Console", "console", "err_console", "Table", "Progress") for a in node.names):
                offenders.append(f"{m}:{node.lineno} imports {[a.name for a in node.names]}")
    tree = ast.parse((REPO / "tasks.py").read_text())
    offenders += [f"tasks.py:{n.lineno} print" for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]
    assert not offenders, offenders


def test_every_remote_entry_point_is_the_contract_wrapper():
    scripts = [p for p in HOST.rglob("*.py") if 'if __name__ == "__main__":' in p.read_text()]
    assert len(scripts) >= 10
    # (speculators' own CLI in-process, and vLLM's render server: their exit code and log are the job's)
    trainers = ("cpu.py", "online_cli.py", "hooked.py", "render_server.py")
    bad = [p.name for p in scripts if p.name not in trainers
           and "contract.main(main)" not in p.read_text().split('if __name__ == "__main__":', 1)[1]]
    assert not bad, bad


def test_a_crashing_script_answers_with_a_framed_error(tmp_path):
    """Any failure in main() reaches the laptop as one framed line naming the file and line."""
    (tmp_path / "boom.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom specops_host import contract\n\ndef main():\n    {}['missing']\n\n"
        "contract.main(main)\n" % str(REPO))
    p = subprocess.run([sys.executable, str(tmp_path / "boom.py"), "--result", str(tmp_path / "r.json")],
                       capture_output=True, text=True)
    got = decode_payload(p.stdout)
    assert p.returncode == 1 and got["ok"] is False and "KeyError" in got["error"] and "boom.py:6" in got["error"]
    assert '"ok": false' in (tmp_path / "r.json").read_text()


def test_push_once_per_connection_and_reconnect_in_place(light_host, monkeypatch):
    """Several remote calls on one connection push specops_host/ once; reconnect() keeps the object."""
    calls = []
    real = push.push
    monkeypatch.setattr(push, "push", lambda t: calls.append(1) or real(t))
    with connect(light_host) as t:
        rid = jobs.new_run_id("t") + "-shape"
        jobs.start(t, rid, ["sh", "-c", "echo hi"], kind="test")
        jobs.status(t)
        jobs.status(t, rid)
        run_script(t, "fetch.manifest", [jobs.run_path(t, rid)], changes=False)
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


def test_no_module_over_500_lines():
    big = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > 500}
    assert not big, big


def test_every_task_is_its_flags_its_help_and_one_call():
    """tasks.py holds no logic: each task body is its docstring and one call (cli.on_hosts and
    kin); no lambdas, no `raise Exit` (a refused flag is the operation's own check, args.Refused)."""
    import inspect

    import tasks

    for name, t in tasks.ns.tasks.items():
        body = ast.parse(inspect.getsource(t.body)).body[0].body
        calls = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        assert len(calls) == 1 and isinstance(calls[0], ast.Expr) and isinstance(calls[0].value, ast.Call), name
    src = (REPO / "tasks.py").read_text()
    assert "lambda" not in src and "raise Exit" not in src and "Exit" not in src



def test_no_host_module_over_500_lines():
    big = {str(p.relative_to(REPO)): n for p in HOST.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not big, big


def test_host_modules_import_each_other_by_package():
    """A host module imports another by its package (`from specops_host.serve import vllm_server`),
    never flat (`import vllm_server`: that only resolved with the old remote/ folder on sys.path)."""
    flat = {p.stem for p in HOST.rglob("*.py")} - {"__init__"}
    bad = []
    for p in HOST.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            bad += [f"{p.relative_to(REPO)}:{node.lineno} {n}" for n in names if n.split(".")[0] in flat]
    assert not bad, bad


def test_the_laptop_imports_its_host_modules_without_the_host_stack():
    """The laptop (no torch) imports the host modules it shares (the contract, the push manifest,
    the demo's language, the log readers, the serve check's failure line) by an ordinary import:
    the CLI and every ops module load without torch, vLLM, transformers or speculators."""
    code = ("import json, sys, tasks, specops.ops.pipeline, specops.group.distcheck; "
            "print(json.dumps(sorted(sys.modules)))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    loaded = set(json.loads(p.stdout))
    assert not {m.split(".")[0] for m in loaded} & {"torch", "vllm", "transformers", "speculators"}
    assert {"specops_host.contract", "specops_host.fetch.manifest", "specops_host.fixtures.synthlang",
            "specops_host.jobs.errlines", "specops_host.check.serve"} <= loaded


def test_every_task_passes_its_flags_under_their_own_names():
    """A task hands each flag to its operation under the flag's own name (`vllm_arg=vllm_arg`, never
    `vllm_args=vllm_arg`): in tasks.py's AST, a keyword `x=y` of a task's one call, y one of its
    parameters, has x == y; none goes by position; a task of many flags (train) passes them whole,
    `**passed(locals())`. Every flag reaches the call. Where the operation names its parameters (no
    **kw), each name it is given is one of them."""
    import inspect

    import tasks
    from specops import cli

    own = set(inspect.signature(cli.on_hosts).parameters) - {"kw"}
    tree = ast.parse((REPO / "tasks.py").read_text())
    renamed, unpassed, unknown = [], [], []
    for f in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        params = [a.arg for a in f.args.args]
        call = next(s.value for s in f.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call))
        assert not [a for a in call.args[3:] if isinstance(a, ast.Name) and a.id in params], f.name
        given = {a.id for a in call.args[:3] if isinstance(a, ast.Name)}
        for k in call.keywords:
            if k.arg is None:
                assert ast.unparse(k.value) == "passed(locals())", (f.name, ast.unparse(k.value))
                given |= set(params)
            elif isinstance(k.value, ast.Name) and k.value.id in params:
                given.add(k.value.id)
                if k.arg != k.value.id:
                    renamed.append(f"{f.name}: {k.arg}={k.value.id}")
        unpassed += [f"{f.name}: {p}" for p in params if p not in given]
        op = eval(ast.unparse(call.args[3]), vars(tasks)) if len(call.args) > 3 else None
        sig = inspect.signature(op) if callable(op) else None
        if sig and not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            unknown += [f"{f.name}: {op.__name__} has no {k.arg}" for k in call.keywords
                        if k.arg and k.arg not in own and k.arg not in sig.parameters]
    assert not renamed, renamed
    assert not unpassed, unpassed
    assert not unknown, unknown
