"""The layers of the suite (tests/conftest.py): every test is marked by the fixtures it uses, the
fast layer (`make test-fast`, -m fast) is what uses none of the rigs, and never starts one."""

import os
import re
import subprocess
import sys

import pytest

import conftest
from conftest import NEEDS, REPO, InstallInFastLayer, RigInFastLayer


def test_every_collected_test_is_marked_by_the_fixtures_it_uses(request):
    items = request.session.items
    assert items
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        for fixture, mark in NEEDS.items():
            if fixture in item.fixturenames:
                assert mark in marks and "fast" not in marks, item.nodeid
        if not marks & conftest.LAYERS_OUT:
            assert "fast" in marks, item.nodeid
        if "fast" in marks:
            assert not set(NEEDS) & set(item.fixturenames), item.nodeid


def test_a_fast_test_that_starts_a_rig_fails_loudly():
    from netrig import NetRig
    from rig import Rig
    from slurmrig import SlurmRig

    for start in (Rig.start, SlurmRig.start, NetRig.start):
        with pytest.raises(RigInFastLayer, match=r"is in the fast layer \(no rig fixture\) but starts"):
            start(None)


def test_a_fast_test_that_starts_an_installer_fails_loudly(tmp_path):
    """apt, sudo, pip or uv (by name, in a shell string, `python -m pip`) and .ci/system-deps without
    --check are refused before they start; the check, and system-deps with a PATH of stand-ins, run."""
    for argv in (["apt-get", "install", "-y", "munge"], ["/usr/bin/sudo", "true"], ["bash", "-c", "pip install x"],
                 [sys.executable, "-m", "pip", "install", "x"], "uv pip install x", ["pip3.11", "--version"],
                 [sys.executable, "-c", "import sys\nfrom pip._internal.cli.main import main\nmain()", "install", "x"],
                 ["bash", str(REPO / ".ci/system-deps"), "test"]):
        with pytest.raises(InstallInFastLayer, match=r"is in the fast layer, which changes nothing on the machine"):
            subprocess.run(argv, shell=isinstance(argv, str), capture_output=True)
    r = subprocess.run(["bash", str(REPO / ".ci/system-deps"), "--check", "foo"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    (tmp_path / "apt-get").write_text("#!/bin/sh\n")
    assert conftest.installer(["bash", ".ci/system-deps", "demo"], {"PATH": str(tmp_path)}) is None
    assert conftest.installer(["grep", "-r", "uvicorn", "pipeline.py"]) is None
    # (an `inv` of the fast layer, forked by the warm server, is held to the same: `inv wheelhouse` drives pip
    # through `python -c`)
    r = conftest.inv("wheelhouse", "--profile", "cpu", "--dest", str(tmp_path / "wh"))
    assert r.returncode != 0 and "an `inv` of the fast layer is in the fast layer, which changes nothing on the " \
        "machine, but starts " in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "wh").exists() or not any((tmp_path / "wh").rglob("*.whl"))


def test_a_fast_layer_inv_is_a_process_of_its_own_forked_by_the_warm_server(tmp_path):
    """conftest.inv in the fast layer: the warm server (tests/warminv.py) forks each call, which
    gets the call's working directory, environment, exit code and output; a call that changes a
    variable read at import time (COLUMNS) gets a fresh `inv` instead."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  warmbox:\n    address: 10.0.0.9\n")
    r = conftest.inv("-r", str(REPO), "hosts", "--hosts", "hosts.yaml", cwd=tmp_path)  # (relative: the cwd's)
    server = conftest._warm["server"]
    assert server is not None and server.proc.poll() is None
    assert r.returncode == 0 and "warmbox\troot@10.0.0.9:22" in r.stdout, r.stdout + r.stderr
    r = conftest.inv("hosts", env={"SPECOPS_HOSTS": str(tmp_path / "hosts.yaml")})
    assert r.returncode == 0 and "warmbox" in r.stdout, r.stdout + r.stderr
    r = conftest.inv("status", "--host", "")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "specops: --host '': no host given: pass --host NAME (an unset variable in a script?)"], r.stderr
    assert not server.fits({**os.environ, **conftest.INV_ENV, "COLUMNS": "77"})
    r = conftest.inv("status", "--host", "", env={"COLUMNS": "77"})
    assert r.returncode == 2 and conftest._warm["server"] is server and server.proc.poll() is None


def test_an_inv_made_while_another_runs_gets_a_fresh_process():
    """The warm server takes one call at a time (every layer's `inv`): a call made while it is busy (a test's own
    thread) runs as a fresh `python -m invoke`, with the same result."""
    import threading

    conftest.inv("--list")  # (the server started)
    server = conftest._warm["server"]
    got: dict = {}
    with conftest._warm["busy"]:  # (as while another thread's call runs)
        t = threading.Thread(target=lambda: got.update(r=conftest.inv("status", "--host", "")))
        t.start()
        t.join(120)
    r = got["r"]
    assert r.returncode == 2 and "no host given" in r.stderr and r.args[0] == sys.executable, (r.args, r.stderr)
    assert conftest._warm["server"] is server and server.proc.poll() is None


def test_make_test_fast_is_the_fast_marker():
    r = subprocess.run(["make", "-n", "test-fast"], cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "MAKEFLAGS": ""})
    assert r.returncode == 0, r.stderr
    assert re.search(r"pytest -q -ra -m fast", r.stdout), r.stdout


def test_the_lanes_give_the_light_worker_light_files_and_pipeline_runs_readers_one_unit(request):
    """tests/lanes.py under -n 3: the last worker takes light files only (then ends), the others heavy ones first,
    then light ones left over; every reader of pipeline_run is in one unit. Its scheduling decisions on a queue
    shaped as the suite's, xdist's own bookkeeping aside (`make test` runs it for real); and the lists it reads
    (conftest.HEAVY, PIPELINE_RUN) hold what this collection holds."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from lanes import PIPELINE_UNIT, Lanes

    lanes = Lanes.__new__(Lanes)
    lanes.heavy, lanes.grouped, lanes.numnodes = {"test_learnable", "test_slurm"}, {"test_slurm", "test_train"}, 3
    ids = ["tests/test_learnable.py::a", "tests/test_slurm.py::b", "tests/test_fetch.py::c", "tests/test_train.py::d",
           "tests/test_trust.py::e"]
    assert [lanes._split_scope(x) for x in ids] == ["tests/test_learnable.py", PIPELINE_UNIT, "tests/test_fetch.py",
                                                     PIPELINE_UNIT, "tests/test_trust.py"]
    lanes.workqueue = OrderedDict((s, {}) for s in dict.fromkeys(lanes._split_scope(x) for x in ids))
    node = {w: SimpleNamespace(gateway=SimpleNamespace(id=w)) for w in ("gw0", "gw1", "gw2")}
    assert lanes.pick(node["gw2"]) == "tests/test_fetch.py"  # (the light lane: light files alone)
    assert lanes.pick(node["gw0"]) == "tests/test_learnable.py"  # (a heavy lane: heavy first)
    lanes.workqueue.pop("tests/test_learnable.py")
    lanes.workqueue.pop(PIPELINE_UNIT)
    assert lanes.pick(node["gw1"]) == "tests/test_fetch.py"  # (then what is left)
    lanes.workqueue.pop("tests/test_fetch.py")
    lanes.workqueue.pop("tests/test_trust.py")
    lanes.workqueue["tests/test_learnable.py"] = {}
    assert lanes.pick(node["gw2"]) is None  # (only heavy work left: the light lane ends)
    lanes.numnodes = 2  # (two workers: no light lane)
    assert lanes.pick(node["gw1"]) == "tests/test_learnable.py"
    assert not conftest.lanes_misfiled(request.session.items)
