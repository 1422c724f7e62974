"""fetch over the real sshd: incremental, resumable after a kill, verified by sha256."""

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, inv
from specops import fetch, jobs
from specops.errors import SpecopsError
from specops.connection import connect

pytestmark = pytest.mark.integration


def make_run(t, run_id, big_mib=0):
    d = jobs.run_path(t, run_id)
    cmd = (f"mkdir -p {d}/checkpoints/1 && echo hello > {d}/output.log && "
           f"head -c 300000 /dev/urandom > {d}/checkpoints/1/model.safetensors")
    if big_mib:
        cmd += f" && head -c {big_mib}M /dev/urandom > {d}/checkpoints/1/big.bin"
    t.check(cmd, "make run")
    return d


def sha(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def test_fetch_verified_and_incremental(light_host, tmp_path):
    rid = jobs.new_run_id("t") + "-fetch"
    with connect(light_host) as t:
        d = make_run(t, rid)
        res = fetch.fetch_run(t, rid, str(tmp_path))
        local = tmp_path / rid
        assert res["attempts"] == 1 and (local / "checkpoints/1/model.safetensors").stat().st_size == 300000
        remote_sha = t.run(f"sha256sum {d}/checkpoints/1/model.safetensors").stdout.split()[0]
        assert sha(local / "checkpoints/1/model.safetensors") == remote_sha
        t.check(f"echo more >> {d}/output.log", "append")
        t0 = time.time()
        fetch.fetch_run(t, rid, str(tmp_path))
        print(f"incremental re-fetch: {time.time() - t0:.2f}s")
        assert (local / "output.log").read_text() == "hello\nmore\n"


def test_mismatch_is_refetched(light_host, tmp_path):
    """A local file that differs from the host's checksum (same size and mtime, so rsync's
    quick check would skip it) is detected and fetched again."""
    rid = jobs.new_run_id("t") + "-mismatch"
    with connect(light_host) as t:
        make_run(t, rid)
        fetch.fetch_run(t, rid, str(tmp_path))
        f = tmp_path / rid / "checkpoints/1/model.safetensors"
        st = f.stat()
        data = bytearray(f.read_bytes())
        data[1000] ^= 0xFF
        f.write_bytes(bytes(data))
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        res = fetch.fetch_run(t, rid, str(tmp_path))
        assert res["attempts"] == 2
        assert fetch.diff(fetch.remote_manifest(t, jobs.run_path(t, rid)), fetch.local_manifest(tmp_path / rid)) == []


def test_fetch_killed_midway_resumes(light_host, tmp_path):
    rid = jobs.new_run_id("t") + "-resume"
    with connect(light_host) as t:
        make_run(t, rid, big_mib=48)
    hosts = str(Path(light_host.key).parent / "hosts-light.yaml")
    p = subprocess.Popen([sys.executable, "-m", "invoke", "fetch", "--host", "light", "--hosts", hosts,
                          "--run-id", rid, "--dest", str(tmp_path), "--bwlimit", "8000"],
                         cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    part = tmp_path / rid / "checkpoints" / "1"
    t0 = time.time()
    while time.time() - t0 < 30:
        partial = [*part.glob(".big.bin.*"), *part.glob(".specops-part.big.bin")] if part.exists() else []
        if partial and partial[0].stat().st_size > 4 << 20:
            break
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGKILL)  # laptop side and its streams die mid-transfer
    p.wait()
    kept = [*part.glob(".big.bin.*"), *part.glob(".specops-part.big.bin"), *part.glob("big.bin")]
    assert kept and kept[0].stat().st_size < 48 << 20, "nothing partial was left to resume from"
    r = inv("fetch", "--host", "light", "--hosts", hosts, "--run-id", rid, "--dest", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "verified (sha256)" in r.stdout
    assert (part / "big.bin").stat().st_size == 48 << 20


def test_fetch_unknown_run_and_unwritable_dest(light_host, tmp_path):
    with connect(light_host) as t:
        with pytest.raises(SpecopsError, match="unknown run id 'no-such-run'"):
            fetch.fetch_run(t, "no-such-run", str(tmp_path))
        rid = jobs.new_run_id("t") + "-ro"
        make_run(t, rid)
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        with pytest.raises(SpecopsError, match="local destination .* is not writable"):
            fetch.fetch_run(t, rid, str(blocker / "runs"))
        if os.geteuid() != 0:  # permission bits bind only non-root users
            ro = tmp_path / "ro"
            ro.mkdir(mode=0o500)
            with pytest.raises(SpecopsError, match="not writable"):
                fetch.fetch_run(t, rid, str(ro / "runs"))
