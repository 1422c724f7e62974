"""The SSH transport against a real OpenSSH sshd on loopback: operations and host-key policy."""

from pathlib import Path

import pytest

from conftest import inv
from specops import inventory
from specops.errors import SpecopsError
from specops.inventory import Host
from specops.host.connection import connect


def host(rig, **over) -> Host:
    return Host.model_validate({"name": "t", **rig.host(**over)})


def test_run_put_get_sync(rig, tmp_path):
    with connect(host(rig)) as t:
        r = t.run("id -un; printf %s \"$HOME\"")
        assert r.ok and r.stdout.splitlines()[0] == rig.user
        assert t.home() == rig.home
        assert t.expand("~/x") == f"{rig.home}/x"
        assert not t.run("exit 3").ok and t.run("exit 3").exited == 3
        src = tmp_path / "a b.txt"
        src.write_text("hello; $(touch /tmp/pwned)")
        remote = f"{rig.home}/specops-test-xfer"
        t.check(f"rm -rf {remote} && mkdir -p {remote}", "mkdir")
        t.put(str(src), f"{remote}/a b.txt")
        t.get(f"{remote}/a b.txt", str(tmp_path / "back.txt"))
        assert (tmp_path / "back.txt").read_text() == src.read_text()
        tree = tmp_path / "tree"
        (tree / "sub dir").mkdir(parents=True)
        for i in range(5):
            (tree / "sub dir" / f"f{i}").write_bytes(bytes([i]) * 1000)
        assert t.rsync_ok()
        t.sync_up(str(tree), f"{remote}/up")
        t.sync_down(f"{remote}/up", str(tmp_path / "down"))
        assert sorted(p.name for p in (tmp_path / "down" / "sub dir").iterdir()) == [f"f{i}" for i in range(5)]
        assert (tmp_path / "down" / "sub dir" / "f3").read_bytes() == bytes([3]) * 1000
    assert not Path("/tmp/pwned").exists()


@pytest.mark.skipif("not __import__('os').geteuid() == 0", reason="root login needs tests run as root")
def test_root_and_non_root_users(rig):
    with connect(host(rig, user="root")) as t:
        assert t.run("id -u").stdout.strip() == "0"
    with connect(host(rig)) as t:
        assert t.run("id -u").stdout.strip() != "0"


def test_unknown_host_key_refused(rig, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with pytest.raises(SpecopsError) as e:
        connect(host(rig, known_hosts=str(kh)))
    msg = str(e.value)
    assert "unknown host key for [127.0.0.1]:" in msg and "SHA256:" in msg and "accept_new_host_key" in msg
    assert kh.read_text() == ""


def test_accept_new_records_then_strict(rig, tmp_path):
    kh = tmp_path / "ssh" / "known_hosts"
    with connect(host(rig, known_hosts=str(kh), accept_new_host_key=True)) as t:
        assert t.run("true").ok
    line = kh.read_text().strip()
    assert line.startswith(f"[127.0.0.1]:{rig.port} ssh-ed25519 ")
    with connect(host(rig, known_hosts=str(kh))) as t:  # now known: strict mode accepts it
        assert t.run("true").ok
        t.sync_up(str(tmp_path / "ssh"), "~/specops-kh-test")  # OpenSSH honours the same file


def test_changed_host_key_refused_even_with_accept_new(rig, tmp_path):
    stranger = Path(f"{rig.other_key}.pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{rig.port} {stranger[0]} {stranger[1]}\n")
    before = kh.read_text()
    for accept in (False, True):
        with pytest.raises(SpecopsError) as e:
            connect(host(rig, known_hosts=str(kh), accept_new_host_key=accept))
        msg = str(e.value)
        assert "CHANGED" in msg and msg.count("SHA256:") == 2 and "ssh-keygen -R" in msg
    assert kh.read_text() == before


def test_rsync_refuses_unknown_key_too(rig, tmp_path):
    """The OpenSSH side (bulk transfer) gets the same strict policy."""
    with connect(host(rig)) as t:
        t.host = host(rig, known_hosts=str(tmp_path / "empty"))
        (tmp_path / "empty").write_text("")
        (tmp_path / "d").mkdir()
        with pytest.raises(SpecopsError, match="rsync .* failed"):
            t.sync_up(str(tmp_path / "d"), "~/specops-rsync-strict")


def test_nothing_listening(rig):
    from rig import free_port
    port = free_port()
    with pytest.raises(SpecopsError, match=f"nothing listening at 127.0.0.1:{port}"):
        connect(host(rig, port=port))


def test_auth_refused(rig):
    with pytest.raises(SpecopsError, match="authentication refused for .*check 'user'/'key'"):
        connect(host(rig, key=str(rig.other_key)))


def test_missing_key_file(rig, tmp_path):
    with pytest.raises(SpecopsError, match="key file .*nope for host .t. not found"):
        connect(host(rig, key=str(tmp_path / "nope")))


def test_cli_errors_are_one_line(rig, tmp_path):
    bad = tmp_path / "hosts.yaml"
    bad.write_text("hosts:\n  gpu1: {address: 127.0.0.1, port: nope}\n")
    r = inv("check", "--host", "gpu1", "--hosts", str(bad))
    assert r.returncode != 0
    assert r.stderr.strip().count("\n") == 0 and "field 'port'" in r.stderr
    bad.write_text("hosts:\n  gpu1: {address: 127.0.0.1}\n")
    r = inv("check", "--host", "gpu9", "--hosts", str(bad))
    assert r.returncode != 0 and "known hosts: gpu1, local" in r.stderr


def test_hosts_task(rig, hosts_file):
    r = inv("hosts", "--hosts", str(hosts_file))
    assert r.returncode == 0 and "box" in r.stdout and "local" in r.stdout


def test_push_by_content_hash(rig, hosts_file):
    r = inv("push", "--host", "box", "--hosts", str(hosts_file))
    assert r.returncode == 0, r.stderr
    r2 = inv("push", "--host", "box", "--hosts", str(hosts_file))
    assert r2.returncode == 0 and "already in sync" in r2.stdout
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        assert t.exists(f"{t.workdir}/specops_host/check/preflight.py", "-f")


def test_proxy_jump_with_strict_keys(rig, tmp_path):
    """Through a jump host (the same sshd), both hops checked against known_hosts."""
    jump = f"{rig.user}@127.0.0.1:{rig.port}"
    with connect(host(rig, proxy_jump=jump)) as t:
        assert t.run("echo via-jump").stdout.strip() == "via-jump"
        t.sync_up(str(tmp_path), "~/specops-jump-test")  # OpenSSH -J with the same options
    kh = tmp_path / "kh"
    kh.write_text("")
    with pytest.raises(SpecopsError, match="unknown host key"):
        connect(host(rig, proxy_jump=jump, known_hosts=str(kh)))


def test_host_default_resolution(monkeypatch):
    from specops.cli import host_name

    class C:
        def __init__(self, cfg):
            self.config = {"specops": cfg}

    monkeypatch.delenv("SPECOPS_HOST", raising=False)
    assert host_name(C({"host": None}), None) == "local"
    assert host_name(C({"host": "gpu1"}), None) == "gpu1"
    monkeypatch.setenv("SPECOPS_HOST", "gpu2")
    assert host_name(C({"host": "gpu1"}), None) == "gpu2"
    assert host_name(C({"host": "gpu1"}), "gpu3") == "gpu3"
