"""hosts.yaml parsing and validation (no network)."""

import pytest

from specops import inventory
from specops.errors import SpecopsError


def load_text(tmp_path, text):
    p = tmp_path / "hosts.yaml"
    p.write_text(text)
    return inventory.load(str(p))


def test_defaults_and_local(tmp_path):
    inv = load_text(tmp_path, "hosts:\n  gpu1: {address: 10.0.0.1}\n  u: {address: h, user: bob}\n")
    g = inv.get("gpu1")
    assert (g.user, g.port, g.venv_path, g.workdir_path, g.base_python, g.profile) == (
        "root", 22, "/root/ml-env", "/root/specops", "python3", "cuda")
    assert g.python == "/root/ml-env/bin/python3"
    assert inv.get("u").venv_path == "~/ml-env"
    loc = inv.get("local")
    assert loc.transport == "local" and loc.profile == "cpu" and loc.venv_path.startswith("~/.cache/specops")


def test_shipped_example_parses():
    inv = inventory.load("hosts.yaml")
    assert inv.get("gpu1").profile == "cuda"
    assert [h.name for h in inv.resolve("@pod")] == ["gpu1"]


@pytest.mark.parametrize("text, expect", [
    ("hosts:\n  gpu1: {address: h, colour: red}\n", "host 'gpu1', field 'colour': unknown field"),
    ("hosts:\n  gpu1: {address: h, port: abc}\n", "host 'gpu1', field 'port': Input should be a valid integer"),
    ("hosts:\n  gpu1: {address: h, port: '22'}\n", "field 'port'"),
    ("hosts:\n  gpu1: {address: h, profile: tpu}\n", "field 'profile'"),
    ("hosts:\n  gpu1: {user: root}\n", "host 'gpu1', field 'address': required"),
    ("hosts:\n  gpu1: {address: h\n", "YAML syntax error at line"),
    ("hosts:\n  - gpu1\n", "'hosts' must be a mapping"),
    ("servers: {}\n", "unknown top-level key"),
    ("hosts:\n  gpu1: {address: h}\ngroups:\n  pod: [gpu1, gpu9]\n", "group 'pod' names unknown host 'gpu9'"),
    # issue 45: a host twice ran every task twice at once on it; an empty group said `no host given`
    ("hosts:\n  box: {address: h}\ngroups:\n  g: [box, box]\n", "group 'g' names host 'box' twice: list each host "
                                                            "once"),
    ("hosts:\n  box: {address: h}\ngroups:\n  g: []\n", "group 'g' lists no host: list its hosts (e.g. g: [a, b]) "
                                                      "or remove it"),
])
def test_bad_inventory_one_clear_line(tmp_path, text, expect):
    with pytest.raises(SpecopsError) as e:
        load_text(tmp_path, text)
    msg = str(e.value)
    assert expect in msg and str(tmp_path / "hosts.yaml") in msg and "\n" not in msg


def test_unknown_host_lists_known(tmp_path):
    inv = load_text(tmp_path, "hosts:\n  gpu1: {address: h}\n  gpu2: {address: h}\n")
    with pytest.raises(SpecopsError, match=r"unknown host 'gpu3' in .*; known hosts: gpu1, gpu2, local"):
        inv.get("gpu3")


def test_missing_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECOPS_HOSTS", raising=False)
    inv = inventory.load()
    assert inv.path is None and inv.names() == ["local"]
    with pytest.raises(SpecopsError, match="no hosts.yaml found.*known hosts: local"):
        inv.get("gpu1")
    with pytest.raises(SpecopsError, match="not found \\(given with --hosts\\)"):
        inventory.load(str(tmp_path / "nope.yaml"))
    monkeypatch.setenv("SPECOPS_HOSTS", str(tmp_path / "nope.yaml"))
    with pytest.raises(SpecopsError, match="SPECOPS_HOSTS"):
        inventory.load()


def test_specops_hosts_env(tmp_path, monkeypatch):
    p = tmp_path / "inv.yaml"
    p.write_text("hosts:\n  a: {address: h, port: 2200}\n")
    monkeypatch.setenv("SPECOPS_HOSTS", str(p))
    assert inventory.load().get("a").port == 2200
