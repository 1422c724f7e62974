"""specops.host.transfer over the real sshd: several streams, byte ranges, resume after a kill, a file
that changes under the transfer, a host that refuses extra connections, uploads."""

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, end_leases
from rig import Rig
from specops.ops import fetch, jobs
from specops import inventory
from specops.host import transfer
from specops.host.connection import connect

MIB = 1 << 20


@pytest.fixture
def host_dirs(light_host):
    """Host paths a test makes (run dirs, upload targets): removed when it ends."""
    made: list[str] = []
    yield made
    if made:
        with connect(light_host) as t:
            t.run("rm -rf " + " ".join(made))


def sha(p) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def host_sha(t, path: str) -> str:
    return t.check(f"sha256sum {path}", "sha256sum").stdout.split()[0]


def make_run(t, rid: str, sizes_mib: dict, made: list) -> str:
    d = jobs.run_path(t, rid)
    made.append(d)
    cmd = [f"mkdir -p {d}/checkpoints/1", f"echo hello > {d}/output.log", f"echo '{{}}' > {d}/job.json"]
    cmd += [f"head -c {m}M /dev/urandom > {d}/{rel}" for rel, m in sizes_mib.items()]
    t.check(" && ".join(cmd), "make run")
    return d


def check_all(t, d: str, local: Path, rels) -> None:
    for rel in rels:
        assert sha(local / rel) == host_sha(t, f"{d}/{rel}"), rel
    assert not list(local.rglob(".specops-part.*")), "partial files left behind"


# -- the choice of the stream count (no host needed) ------------------------------------------------

def test_stream_count_follows_the_link():
    n, why = transfer.choose_streams(0.0003, None, 1 << 30, 64)
    assert n == 1 and "not window-bound" in why
    n, why = transfer.choose_streams(0.050, 38 * MIB, 1 << 30, 64)  # window-bound: 2 MiB / 50 ms
    assert n == transfer.MAX_STREAMS and "50.0 ms" in why
    n, _ = transfer.choose_streams(0.012, 150 * MIB, 1 << 30, 64)
    assert 1 < n < transfer.MAX_STREAMS
    n, why = transfer.choose_streams(0.050, 5 * MIB, 1 << 30, 64)  # a slow link, not the window
    assert n == 1 and "the link, not the window, is the limit" in why
    assert transfer.choose_streams(0.050, None, 12 * MIB, 64)[0] == 2  # little work: few streams
    assert transfer.choose_streams(0.0003, None, 1 << 30, 64, forced=6)[0] == 6
    assert transfer.choose_streams(0.0003, None, 1 << 30, 3, forced=6)[0] == 3  # only 3 parts


# -- fetch: ranged, several streams, killed midway, resumed --------------------------------------------

KILLED_FETCH = """
import sys
from specops.ops import fetch
from specops import inventory
from specops.host import transfer
from specops.host.connection import connect
transfer.tuning.PIECE = 4 << 20  # small pieces: the kill lands between pieces of one file
h = inventory.load(sys.argv[1]).get("light")
with connect(h) as t:
    fetch.fetch_run(t, sys.argv[2], sys.argv[3], streams=4, bwlimit=8000)
"""


def test_ranged_multistream_fetch_killed_midway_resumes(light_host, tmp_path, host_dirs):
    rid = jobs.new_run_id("t") + "-xresume"
    big = {"checkpoints/1/model-1.safetensors": 24, "checkpoints/1/model-2.safetensors": 20}
    with connect(light_host) as t:
        d = make_run(t, rid, big, host_dirs)
    hosts = str(Path(light_host.key).parent / "hosts-light.yaml")
    p = subprocess.Popen([sys.executable, "-c", KILLED_FETCH, hosts, rid, str(tmp_path)], cwd=REPO,
                         start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    local = tmp_path / rid
    done = 0
    t0 = time.time()
    while time.time() - t0 < 60 and p.poll() is None:
        done = 0
        for side in local.rglob(".specops-part.*.json") if local.exists() else []:
            try:
                done += len(json.loads(side.read_text())["done"])
            except (OSError, ValueError):
                pass
        if done >= 3:
            break
        time.sleep(0.05)
    assert p.poll() is None, p.communicate()
    os.killpg(p.pid, signal.SIGKILL)  # the laptop side and its streams die mid-transfer
    p.wait()
    parts = list(local.rglob(".specops-part.*"))
    assert parts, "nothing partial was left to resume from"
    assert not (local / "checkpoints/1/model-1.safetensors").exists() or \
        not (local / "checkpoints/1/model-2.safetensors").exists()

    notes = []
    with connect(light_host, on_note=notes.append) as t:
        res = fetch.fetch_run(t, rid, str(tmp_path), streams=4)
        tr = res["transfer"]
        assert res["attempts"] == 1 and tr["streams"] == 4
        assert tr["resumed_bytes"] >= 3 * 4 * MIB, tr
        assert tr["bytes"] <= 44 * MIB - tr["resumed_bytes"] + MIB  # only what was missing
        assert any("already here from an interrupted transfer" in n.text for n in notes)
        check_all(t, d, local, [*big, "output.log", "job.json"])
        assert json.loads((local / "fetch-manifest.json").read_text())["checkpoints/1/model-1.safetensors"] == \
            host_sha(t, f"{d}/checkpoints/1/model-1.safetensors")
        assert len(end_leases(t, rid)) == 1  # (the killed fetch's lease, left by design: ended as `inv stop` would)


# -- a file that changes on the host during the fetch ---------------------------------------------------

def test_file_changed_during_fetch_is_detected(light_host, tmp_path, host_dirs):
    rid = jobs.new_run_id("t") + "-xchange"
    rel = "checkpoints/1/model.safetensors"
    with connect(light_host) as t, connect(light_host) as other:
        d = make_run(t, rid, {rel: 32}, host_dirs)
        before = host_sha(t, f"{d}/{rel}")
        changed = threading.Event()

        def on_progress(done, total):  # halfway through, the run rewrites its checkpoint
            if not changed.is_set() and done >= total * 0.4:
                changed.set()
                # in place (the same file, as torch.save does): the streams read the new bytes from here on
                other.check(f"head -c 32M /dev/urandom > {d}/{rel}", "rewrite")

        notes = []
        t.on_note = notes.append
        res = fetch.fetch_run(t, rid, str(tmp_path), streams=2, bwlimit=16000, on_progress=on_progress)
        assert changed.is_set()
        after = host_sha(t, f"{d}/{rel}")
        assert after != before
        warns = [n.text for n in notes if n.kind == "warn"]
        assert res["attempts"] == 2 and any("differ from the host's checksums" in w and rel in w for w in warns), \
            (res, warns)
        assert sha(tmp_path / rid / rel) == after
        check_all(t, d, tmp_path / rid, [rel, "output.log"])


def test_sync_down_refetches_a_file_that_changed(light_host, tmp_path, host_dirs):
    """Without a manifest (sync_down: shard and checkpoint moves), the piece markers catch a file
    that shrinks under the transfer; it is fetched again."""
    with connect(light_host) as t, connect(light_host) as other:
        src = f"{t.home()}/specops-xfer-shrink"
        host_dirs.append(src)
        t.check(f"rm -rf {src} && mkdir -p {src} && head -c 24M /dev/urandom > {src}/hs_0.safetensors", "mk")
        shrunk = threading.Event()

        def on_progress(done, total):
            if not shrunk.is_set() and done >= 6 * MIB:
                shrunk.set()
                other.check(f"head -c 10M /dev/urandom > {src}/hs_0.safetensors", "shrink")  # in place

        t.sync_down(src, str(tmp_path / "hs"), streams=2, on_progress=on_progress, bwlimit=16000)
        assert shrunk.is_set()
        assert (tmp_path / "hs" / "hs_0.safetensors").stat().st_size == 10 * MIB
        assert sha(tmp_path / "hs" / "hs_0.safetensors") == host_sha(t, f"{src}/hs_0.safetensors")


# -- a host that refuses extra connections -------------------------------------------------------------

@pytest.fixture(scope="module")
def strict_rig(light_host):
    """A second sshd (same machine, same user and venv) with MaxStartups 1: it refuses a new
    connection while another one has not logged in yet. (MaxSessions caps the sessions of one
    connection; every stream is a connection of its own, so it never applies to them.)"""
    r = Rig(max_startups="1").start()
    time.sleep(0.5)  # (the start's own probe connection must be gone before it counts none)
    yield r
    r.stop()
    shutil.rmtree(r.root, ignore_errors=True)


def test_streams_fall_back_when_the_host_refuses_connections(light_host, strict_rig, tmp_path, host_dirs):
    with connect(light_host) as t:
        t.ensure_pushed()  # (the second sshd sees the same workdir)
        rid = jobs.new_run_id("t") + "-xrefuse"
        d = make_run(t, rid, {"checkpoints/1/model.safetensors": 64}, host_dirs)
    hf = strict_rig.write_hosts(strict_rig.root / "hosts.yaml",
                                {"strict": strict_rig.host(venv="~/light-venv", workdir="~/specops-light")})
    h = inventory.load(str(hf)).get("strict")
    notes = []
    with connect(h, on_note=notes.append) as t:
        # an unauthenticated connection held open: sshd (MaxStartups 1) refuses every other one
        # until it closes, so all the streams opened at once are refused
        blocker = socket.create_connection(("127.0.0.1", strict_rig.port))
        threading.Timer(1.0, blocker.close).start()
        res = fetch.fetch_run(t, rid, str(tmp_path), streams=4)
        tr = res["transfer"]
        assert res["attempts"] == 1 and tr["refused"] == 3, tr
        said = [n.text for n in notes if "refused" in n.text]
        assert len(said) == 1 and "went on with 1 stream(s)" in said[0] and "MaxStartups" in said[0], notes
        check_all(t, d, tmp_path / rid, ["checkpoints/1/model.safetensors", "output.log", "job.json"])
        res = fetch.fetch_run(t, rid, str(tmp_path / "again"))  # the link's own choice: one stream here
        assert res["attempts"] == 1 and res["transfer"]["streams"] == 1 and res["transfer"]["refused"] == 0


# -- uploads ---------------------------------------------------------------------------------------

def test_ranged_upload_and_put(light_host, tmp_path, host_dirs):
    tree = tmp_path / "wheelhouse"
    (tree / "sub").mkdir(parents=True)
    (tree / "torch-2.9.0-cp311-linux_x86_64.whl").write_bytes(os.urandom(40 * MIB + 12345))
    (tree / "sub" / "small.whl").write_bytes(os.urandom(5000))
    (tree / "index.json").write_text("{}")
    with connect(light_host) as t:
        dest = f"{t.home()}/specops-xfer-up"
        host_dirs.append(dest)
        t.check(f"rm -rf {dest} && mkdir -p {dest} && echo old > {dest}/.specops-up.0123456789abcdef.0", "mk")
        rep = transfer.upload(t, tree, dest, streams=3)
        assert rep["streams"] == 3 and rep["bytes"] == 40 * MIB + 12345 + 5000 + 2
        for rel in ("torch-2.9.0-cp311-linux_x86_64.whl", "sub/small.whl", "index.json"):
            assert host_sha(t, f"{dest}/{rel}") == sha(tree / rel), rel
        left = t.run(f"ls -A {dest}").stdout.split()
        assert not [x for x in left if x.startswith(".specops-up.")], left  # stale and used parts removed
        assert transfer.upload(t, tree, dest, streams=3)["bytes"] == 0  # nothing differs: nothing sent
        # sync_up with --delete: one more rsync pass removes what is gone here
        (tree / "index.json").unlink()
        t.sync_up(str(tree), dest, delete=True)
        assert not t.exists(f"{dest}/index.json")
        # put of a large file: ranged, checked by sha256 on the host
        t.put(str(tree / "torch-2.9.0-cp311-linux_x86_64.whl"), f"{dest}/put/copy.whl.part")
        assert host_sha(t, f"{dest}/put/copy.whl.part") == sha(tree / "torch-2.9.0-cp311-linux_x86_64.whl")


KILLED_UPLOAD = """
import sys
from pathlib import Path
from specops import inventory
from specops.host import transfer
from specops.host.connection import connect
h = inventory.load(sys.argv[1]).get("light")
with connect(h) as t:
    transfer.upload(t, Path(sys.argv[2]), sys.argv[3], streams=3, bwlimit=8000)
"""


def test_ranged_upload_killed_midway_resumes(light_host, tmp_path, host_dirs):
    tree = tmp_path / "up"
    tree.mkdir()
    (tree / "shard.bin").write_bytes(os.urandom(80 * MIB))  # three ranges: 32 + 32 + 16 MiB
    hosts = str(Path(light_host.key).parent / "hosts-light.yaml")
    with connect(light_host) as t:
        dest = f"{t.home()}/specops-xfer-upresume"
        host_dirs.append(dest)
        t.check(f"rm -rf {dest}", "clean")
    p = subprocess.Popen([sys.executable, "-c", KILLED_UPLOAD, hosts, str(tree), dest], cwd=REPO,
                         start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    host_dir = Path(dest)  # (the rig's host is this machine)
    t0 = time.time()
    while time.time() - t0 < 60 and p.poll() is None:
        parts = list(host_dir.glob(".specops-up.*")) if host_dir.exists() else []
        if sum(f.stat().st_size for f in parts) >= 8 * MIB:
            break
        time.sleep(0.05)
    assert p.poll() is None, p.communicate()
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert list(host_dir.glob(".specops-up.*")) and not (host_dir / "shard.bin").exists()
    notes = []
    with connect(light_host, on_note=notes.append) as t:
        rep = transfer.upload(t, tree, dest, streams=3)
        assert rep["resumed_bytes"] >= 8 * MIB and rep["bytes"] == 80 * MIB - rep["resumed_bytes"], rep
        assert any("already on the host from an interrupted upload" in n.text for n in notes)
        assert host_sha(t, f"{dest}/shard.bin") == sha(tree / "shard.bin")
        assert not t.run(f"ls -A {dest} | grep specops-up").stdout.strip()


def test_progress_reaches_the_total(light_host, tmp_path, host_dirs):
    with connect(light_host) as t:
        rid = jobs.new_run_id("t") + "-xprog"
        make_run(t, rid, {"checkpoints/1/a.bin": 20}, host_dirs)
        seen = []
        fetch.fetch_run(t, rid, str(tmp_path), streams=2, on_progress=lambda d, n: seen.append((d, n)))
    assert seen and seen[-1][0] == seen[-1][1] >= 20 * MIB
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
