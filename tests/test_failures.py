"""The failure catalogue (docs/failures.md): each bad input or fault gives one clear line,
a non-zero exit, and loses nothing. Connection cases go through the real loopback sshd."""

import re
import shlex
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import inv
from specops import inventory
from specops.ops import jobs
from specops.errors import SpecopsError
from specops.inventory import Host
from specops.host.connection import connect


def host(rig, **over) -> Host:
    return Host.model_validate({"name": "t", **rig.host(**over)})


def one_line(r):
    err = r.stderr.strip()
    assert r.returncode != 0 and err.startswith("specops: ") and "\n" not in err, (r.returncode, r.stderr)
    return err


def test_unreadable_and_encrypted_keys(rig, tmp_path):
    bad = tmp_path / "garbage"
    bad.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(SpecopsError, match="cannot be read as a private key"):
        connect(host(rig, key=str(bad)))
    enc = tmp_path / "enc"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "pw", "-f", str(enc)], check=True)
    with pytest.raises(SpecopsError, match="is encrypted: load it into ssh-agent"):
        connect(host(rig, key=str(enc)))


def test_timeout_names_host_and_port(rig):
    """Something accepts TCP but never speaks SSH (a hung sshd): timed out, host:port named."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    port = srv.getsockname()[1]
    try:
        t0 = time.time()
        with pytest.raises(SpecopsError, match=f"timed out after 2s .* 127.0.0.1:{port}"):
            connect(host(rig, port=port, connect_timeout=2))
        assert time.time() - t0 < 15
    finally:
        srv.close()


def test_workdir_not_writable(rig, light_host, tmp_path):
    if rig.is_root:
        locked = rig.root / "locked"
        locked.mkdir(exist_ok=True)
        locked.chmod(0o755)  # owned by root: the non-root test user cannot write there
        wd = str(locked / "work")
    else:
        wd = "/proc/specops-work"
    hf = rig.write_hosts(tmp_path / "hosts.yaml", {"ro": rig.host(venv="~/light-venv", workdir=wd)})
    err = one_line(inv("push", "--host", "ro", "--hosts", str(hf)))
    assert f"workdir {wd} on ro is not writable" in err


def test_unknown_run_ids_through_the_cli(light_host):
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    for task in ("stop", "logs", "fetch"):
        err = one_line(inv(task, "--host", "light", "--hosts", hf, "--run-id", "no-such-run"))
        assert "unknown run id 'no-such-run'" in err, (task, err)
    err = one_line(inv("stop", "--host", "light", "--hosts", hf, "--run-id", "bad;id$(x)"))
    assert "invalid run id" in err


def test_shell_metacharacters_pass_intact_and_never_run(light_host, tmp_path):
    """Paths and arguments with spaces, quotes, ;, $(...), backticks and newlines reach the host
    as data; a canary that a successful injection would create never appears."""
    canary = tmp_path / "CANARY"
    evil = f"a b'c\"d;e$(touch {canary})f`touch {canary}`g\nh"
    with connect(light_host) as t:
        rid = jobs.new_run_id("t") + "-evil"
        jobs.start(t, rid, ["printf", "%s", evil], kind="test")
        for _ in range(50):
            if t.read_bytes(jobs.run_path(t, rid, "exit_code")):
                break
            time.sleep(0.1)
        log = t.read_bytes(jobs.run_path(t, rid, "output.log")).decode()
        assert evil in log
        d = tmp_path / "src dir"
        d.mkdir()
        (d / evil.replace("/", "_")).write_text("payload")
        remote = t.expand("~/specops-evil") + "/" + evil.replace("\n", "_")
        t.check(f"mkdir -p {shlex.quote(remote)}", "mkdir")
        t.sync_up(str(d), remote)
        t.put(str(d / evil.replace("/", "_")), remote + "/" + evil.replace("/", "_") + ".2")
        names = t.run(f"ls -1b {shlex.quote(remote)}").stdout
        assert names.count("payload") == 0 and len(names.splitlines()) == 2
    assert not canary.exists()


def test_secrets_never_printed(rig, light_host, tmp_path):
    key_body = "".join(rig.client_key.read_text().splitlines()[1:-1])
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    outs = [inv("check", "--host", "light", "--hosts", hf, "--min-free-gb", "1"), inv("status", "--host", "light", "--hosts", hf),
            inv("push", "--host", "light", "--hosts", hf, "--dry-run")]
    for r in outs:
        for chunk in (key_body[:40], key_body[-40:]):
            assert chunk not in r.stdout and chunk not in r.stderr


def test_logs_follow_survives_sshd_restart(rig, light_host):
    """The connection drops and sshd is down for a while: `follow` reconnects with backoff and
    prints every line exactly once."""
    rid = jobs.new_run_id("t") + "-restart"
    with connect(light_host) as t0:
        jobs.start(t0, rid, ["sh", "-c", "for i in $(seq 1 60); do echo line $i; sleep 0.1; done"], kind="test")
    t = connect(light_host)
    got, errors = [], []

    def run():
        try:
            jobs.follow(t, rid, write=got.append, reconnect=True, tries=6)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    time.sleep(1.5)
    rig.drop_connections()
    rig.stop()
    time.sleep(2.5)
    rig.start()
    th.join(90)
    assert not errors, errors
    lines = [ln for ln in b"".join(got).decode().splitlines() if ln.startswith("line ")]
    assert lines == [f"line {i}" for i in range(1, 61)]


def test_logs_follow_gives_up_with_a_clear_line(rig, light_host):
    rid = jobs.new_run_id("t") + "-giveup"
    with connect(light_host) as t0:
        jobs.start(t0, rid, ["sleep", "30"], kind="test")
    t = connect(light_host)
    try:
        time.sleep(0.5)
        rig.drop_connections()
        rig.stop()
        with pytest.raises(SpecopsError, match=f"gave up following {rid} on light after 2 reconnects"):
            jobs.follow(t, rid, write=lambda b: None, reconnect=True, tries=2)
    finally:
        rig.start()
    with connect(light_host) as t1:
        jobs.stop(t1, rid, grace=5)


def test_killed_job_reported_with_exit_137(light_host):
    """A job whose process is killed by the kernel (SIGKILL, as the OOM killer does)."""
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    with connect(light_host) as t:
        rid = jobs.new_run_id("t") + "-oom"
        jobs.start(t, rid, ["sh", "-c", "echo allocating; sh -c 'kill -9 $$'; exit 137"], kind="test")
        time.sleep(1.5)
        assert jobs.status(t, rid)[0].describe == "killed (137: SIGKILL, e.g. out of memory)"
    r = inv("logs", "--host", "light", "--hosts", hf, "--run-id", rid, "-f")
    assert r.returncode != 0 and "allocating" in r.stdout
    assert f"run {rid} ended: killed (137" in r.stderr


def test_dry_run_changes_nothing(rig, tmp_path):
    hf = rig.write_hosts(tmp_path / "hosts.yaml", {"fresh": rig.host(venv="~/dry-venv", workdir="~/dry-work")})
    r = inv("bootstrap", "--host", "fresh", "--hosts", str(hf), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "DRY-RUN fresh: run: python3 -m venv" in r.stdout and "DRY-RUN fresh: put: " in r.stdout
    assert "-m specops_host.install.profile" in r.stdout and "nothing was changed" in r.stdout
    with connect(Host.model_validate({"name": "fresh", **rig.host(venv="~/dry-venv", workdir="~/dry-work")})) as t:
        assert not t.exists("~/dry-venv") and not t.exists("~/dry-work")


def test_dry_run_on_a_host_never_pushed_says_how_to_preview(rig, light_host, tmp_path):
    """A dry run reads the host with specops' scripts; on a host that has never had them it says
    so in one line (push, then the dry run again) and creates nothing."""
    wd = f"~/specops-fresh-{tmp_path.name}"
    hf = rig.write_hosts(tmp_path / "hosts.yaml", {"fresh": rig.host(venv="~/light-venv", workdir=wd)})
    err = one_line(inv("train", "--host", "fresh", "--hosts", str(hf), "--dry-run"))
    assert re.search(r"specops_host/[\w/]+\.py is not on fresh", err) and "then the dry run again" in err, err
    with connect(inventory.load(str(hf)).get("fresh")) as t:
        assert not t.exists(wd)


# -- the catalogue itself (issue 44 item 7): short rows, each long story and each test it names there ---------------

DOCS = Path(__file__).parent.parent / "docs"
ROW_LIMIT = 400  # (characters: what the header of docs/failures.md asks of a row)


def catalogue_rows() -> list[tuple[str, str]]:
    """Each row of docs/failures.md's table: (its number, the whole line)."""
    rows = []
    for line in (DOCS / "failures.md").read_text().splitlines():
        if m := re.match(r"\| \[?(\d+)\]?", line):
            rows.append((m.group(1), line))
    return rows


def test_each_row_fits_a_screen_and_its_linked_story_is_in_the_notes():
    rows = catalogue_rows()
    assert len(rows) > 200, len(rows)
    long = [f"row {n}: {len(line)}" for n, line in rows if len(line) > ROW_LIMIT]
    assert not long, f"rows over {ROW_LIMIT} characters (the rest goes to failures-notes.md as `## Row N`): {long}"
    sections = set(re.findall(r"(?m)^## Row (\d+)$", (DOCS / "failures-notes.md").read_text()))
    for n, line in rows:
        for target in re.findall(r"failures-notes\.md#row-(\d+)", line):
            assert target in sections, f"row {n} links failures-notes.md#row-{target}: no `## Row {target}` there"
        if line.startswith("| ["):  # (a linked number is the row's own story)
            assert line.startswith(f"| [{n}](failures-notes.md#row-{n}) |"), line[:80]


def test_each_test_a_row_names_exists():
    """`test_x.py::name` (a trailing `*`: a prefix), `::name` (the file named before it in the cell) or a file
    alone: each one is in tests/ (defined or imported there, where pytest collects it)."""
    wrong = []
    for n, line in catalogue_rows():
        cell, file = re.split(r"(?<!\\)\|", line)[-2], None
        for m in re.finditer(r"`(test_\w+\.py)?(?:::(\w+)(\*)?)?`", cell):
            file = m.group(1) or file
            if not m.group(1) and not m.group(2):
                continue
            path = Path(__file__).parent / (file or "")
            if file is None or not path.is_file():
                wrong.append(f"row {n}: {m.group(0)}: no such file")
            elif m.group(2) and not re.search(r"\b" + m.group(2) + ("" if m.group(3) else r"\b"), path.read_text()):
                wrong.append(f"row {n}: {m.group(0)}: not in {file}")
    assert not wrong, wrong
