"""fetch over the real sshd: incremental, resumable after a kill, verified by sha256."""

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, end_leases, inv
from specops.ops import fetch, jobs
from specops.errors import SpecopsError
from specops.host.connection import connect


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
    with connect(light_host) as t:  # (the killed fetch's lease is left, by design: ended here, as `inv stop` would)
        assert len(end_leases(t, rid)) == 1


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


def make_checkpointed_run(t, run_id, pick=None):
    """A run with checkpoints 1 and 2 (and speculators' aliases, symlinks to them), its logs and
    its record (run.json, with a served pick when given)."""
    d = jobs.run_path(t, run_id)
    cmd = f"mkdir -p {d}/checkpoints {d}/logs/{run_id} && cd {d} && echo log > output.log && echo ev > logs/{run_id}/ev"
    for n in ("1", "2"):
        cmd += (f" && mkdir -p checkpoints/{n} && echo '{{}}' > checkpoints/{n}/config.json"
                f" && head -c 200000 /dev/urandom > checkpoints/{n}/model.safetensors")
    cmd += (" && echo cfg > checkpoints/run.yaml && ln -s 2 checkpoints/checkpoint_best"
            " && ln -s 1 checkpoints/epoch0_end && ln -s 2 checkpoints/epoch1_end")
    t.check(cmd, "make run")
    rec = {"run_id": run_id, "config": {"lr": 0.001}}
    if pick:
        rec["best_served"] = pick
    t.check(f"printf %s {shlex.quote(json.dumps(rec))} > {d}/run.json", "run record")
    return d


def local_files(root):
    return sorted(p.relative_to(root).as_posix() for p in Path(root).rglob("*")
                  if (p.is_file() or p.is_symlink()) and not p.name.startswith(".specops"))


def test_fetch_one_checkpoint_best_served_or_named(light_host, tmp_path):
    """--checkpoint best-served brings the pick recorded in run.json (and the run's logs and
    records), not the other checkpoint nor the aliases; each file verified against the host's
    sha256; a plain name brings that one."""
    rid = jobs.new_run_id("t") + "-pick"
    with connect(light_host) as t:
        d = make_checkpointed_run(t, rid, pick={"checkpoint": "1", "mean_acceptance_length": 1.5, "prompts": 4})
        res = fetch.fetch(t, rid, str(tmp_path), checkpoint="best-served")
        local = tmp_path / rid
        assert res["checkpoint"] == "1" and res["left"] == ["2"] and res["picked"]["mean_acceptance_length"] == 1.5
        brought = ["checkpoints/1/config.json", "checkpoints/1/model.safetensors", "checkpoints/run.yaml",
                   f"logs/{rid}/ev", "output.log", "run.json"]
        assert sorted(json.loads((local / "fetch-manifest.json").read_text())) == brought  # each verified
        assert [x for x in local_files(local) if x.startswith("checkpoints/")] == brought[:3]
        assert set(brought) <= set(local_files(local))
        remote_sha = t.run(f"sha256sum {d}/checkpoints/1/model.safetensors").stdout.split()[0]
        assert sha(local / "checkpoints/1/model.safetensors") == remote_sha
        res = fetch.fetch(t, rid, str(tmp_path), checkpoint="2")  # a plain name, beside the first
        assert res["checkpoint"] == "2" and res["picked"] is None
        assert sorted(p.name for p in (local / "checkpoints").iterdir()) == ["1", "2", "run.yaml"]
        assert sha(local / "checkpoints/2/model.safetensors") == t.run(
            f"sha256sum {d}/checkpoints/2/model.safetensors").stdout.split()[0]


def test_fetch_checkpoint_on_the_local_transport(tmp_path):
    """The local host copies only the chosen checkpoint too, verified the same way."""
    from specops import inventory

    h = inventory.Host(name="here", transport="local", profile="cpu", venv=sys.prefix, workdir=str(tmp_path / "work"))
    rid = "t-local-pick"
    with connect(h) as t:
        make_checkpointed_run(t, rid, pick={"checkpoint": "2"})
        res = fetch.fetch(t, rid, str(tmp_path / "runs"), checkpoint="best-served")
        assert res["checkpoint"] == "2" and res["attempts"] == 1
        assert sorted(p.name for p in (tmp_path / "runs" / rid / "checkpoints").iterdir()) == ["2", "run.yaml"]
        assert fetch.fetch(t, rid, str(tmp_path / "runs"), checkpoint="best-served")["attempts"] == 0  # unchanged


def test_fetch_checkpoint_refusals_are_one_line(light_host, tmp_path):
    rid = jobs.new_run_id("t") + "-nopick"
    with connect(light_host) as t:
        make_checkpointed_run(t, rid)
    hosts = str(Path(light_host.key).parent / "hosts-light.yaml")
    no_pick = f"has no served pick recorded: run `inv evaluate --run-id {rid} --checkpoints all --pick"
    for which, want in (("best-served", no_pick),
                        ("7", "no checkpoint '7' in run"), ("../..", "no checkpoint '../..' in run"),
                        ("checkpoint_best", "(have: 1, 2)")):
        r = inv("fetch", "--host", "light", "--hosts", hosts, "--run-id", rid, "--checkpoint", which,
                "--dest", str(tmp_path))
        assert r.returncode != 0 and want in r.stderr, (which, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not (tmp_path / rid).exists()
    r = inv("fetch", "--host", "light,light", "--hosts", hosts, "--run-id", rid, "--checkpoint", "1")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "not a group" in r.stderr, r.stderr


def test_a_plain_fetch_leaves_an_incomplete_checkpoint_and_names_it(light_host, tmp_path):
    """failures row 161: checkpoint 2 cut mid-save (its config.json 0 bytes, its marker saying 3): a
    plain `inv fetch` brings checkpoint 1 and the rest of the run, not 2 nor the aliases naming it,
    and says so in one line; --incomplete brings it too, said as well; --checkpoint 2 is refused."""
    from specops_host import ckpt

    rid = jobs.new_run_id("t") + "-half"
    with connect(light_host) as t:
        d = make_checkpointed_run(t, rid)
        t.ensure_pushed()
        mark = f"from specops_host import ckpt; ckpt.start_marking({d + '/checkpoints'!r})"
        t.check(f"cd {shlex.quote(t.workdir)} && {t.expand(light_host.python)} -c {shlex.quote(mark)} && "
                f": > {d}/checkpoints/2/config.json", "mark the saves, then cut checkpoint 2 short")
    hosts = str(Path(light_host.key).parent / "hosts-light.yaml")
    base = ["fetch", "--host", "light", "--hosts", hosts, "--run-id", rid]
    r = inv(*base, "--dest", str(tmp_path / "plain"))
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (f"fetch: left the incomplete checkpoint(s) of {rid} on light: 2 (config.json is 0 bytes, 3 when saved); "
            f"`inv fetch --run-id {rid} --incomplete --host light --hosts {hosts}` brings them too") in said, said
    got = tmp_path / "plain" / rid
    assert sorted(p.name for p in (got / "checkpoints").iterdir()) == ["1", "epoch0_end", "run.yaml", ckpt.POLICY]
    assert (got / "output.log").is_file() and (got / "checkpoints/1" / ckpt.MARKER).is_file()
    assert "verified (sha256)" in said
    r = inv(*base, "--dest", str(tmp_path / "all"), "--incomplete")
    said = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0 and "bringing the incomplete checkpoint(s) of" in said, said
    assert "--incomplete): 2 (config.json is 0 bytes" in said, said
    assert (tmp_path / "all" / rid / "checkpoints/2/config.json").stat().st_size == 0
    r = inv(*base, "--checkpoint", "2", "--dest", str(tmp_path / "one"))
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"checkpoint '2' of run {rid} on light is incomplete (config.json is 0 bytes, 3 when saved)" in r.stderr
    r = inv(*base, "--checkpoint", "1", "--incomplete")
    assert r.returncode != 0 and "drop one of them" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_pick_is_written_whole_and_read_back(light_host, tmp_path):
    """evaluate's record_pick merges best_served into the run's record on the host (the other
    fields kept, no temp file left) and fetch reads it; a record that is not a JSON object is
    refused in one line; a pick whose checkpoint is gone is refused too."""
    from specops.ops.evaluate import record_pick

    rid = jobs.new_run_id("t") + "-record"
    with connect(light_host) as t:
        d = make_checkpointed_run(t, rid)
        assert fetch.read_pick(t, rid) is None
        out = record_pick(t, rid, {"checkpoint": "5", "mean_acceptance_length": 1.25})
        assert out["record"] == f"{d}/run.json"
        rec = json.loads(t.read_bytes(f"{d}/run.json"))
        assert rec["config"] == {"lr": 0.001} and rec["best_served"]["checkpoint"] == "5"
        assert not [x for x in t.run(f"ls -a {d}").stdout.split() if x.endswith((".tmp", ".part"))]
        with pytest.raises(SpecopsError,
                           match=r"the pick of run .*, checkpoint '5', is no longer on light \(have: 1, 2\)"):
            fetch.fetch(t, rid, str(tmp_path), checkpoint="best-served")
        record_pick(t, rid, {"checkpoint": "2"})
        assert fetch.read_pick(t, rid)["checkpoint"] == "2" and fetch.read_pick(t, rid).get("mean_acceptance_length") is None
        t.check(f"echo '[1, 2]' > {d}/run.json", "a record that is not an object")
        with pytest.raises(SpecopsError, match="is not a JSON object: the pick was not recorded"):
            record_pick(t, rid, {"checkpoint": "2"})


def transfers_of(rid):
    """Live laptop-side processes (rsync, ssh) whose command line names the run."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if rid in cmd and "invoke" not in cmd and state != "Z" and not cmd.startswith(("sshd", "sh -c")) \
                    and "specops_host.jobs.job" not in cmd:  # (the host's side of the rig: a fetch's lease)
                out.append(f"{p.name} {cmd[:120]}")
    return out


def wait_transfer(rid):
    """Until a transfer process of the run has been seen (each stream's ssh lives for its batch)."""
    t0, seen = time.time(), []
    while time.time() - t0 < 120 and not seen:  # (a loaded machine: the fetch starts late)
        seen = transfers_of(rid)
        time.sleep(0.05)
    assert seen, "no transfer seen"
    time.sleep(1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_fetch_leaves_no_transfer_running(light_host, tmp_path, sig):
    """SIGTERM or SIGINT (Ctrl-C) of the laptop process mid-fetch: its rsync/ssh processes end
    with it, and it says in one line what is in place and how to resume; SIGKILL (nothing can run
    then): its transfers end within seconds all the same."""
    rid = jobs.new_run_id("t") + f"-sig{int(sig)}"
    with connect(light_host) as t:
        make_run(t, rid, big_mib=48)
    hosts = str(Path(light_host.key).parent / "hosts-light.yaml")
    p = subprocess.Popen([sys.executable, "-m", "invoke", "fetch", "--host", "light", "--hosts", hosts,
                          "--run-id", rid, "--dest", str(tmp_path), "--bwlimit", "1000"],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_transfer(rid)
    p.send_signal(sig)  # (the laptop process alone, not its process group)
    out, err = p.communicate(timeout=60)
    if sig != signal.SIGKILL:
        lines = err.strip().splitlines()
        assert p.returncode != 0 and "Traceback" not in err, err
        assert lines[-1].startswith(f"specops: fetch {rid} interrupted: ") and "resumes" in lines[-1], err
    deadline = time.time() + 15
    while time.time() < deadline and transfers_of(rid):
        time.sleep(0.2)
    assert transfers_of(rid) == [], transfers_of(rid)
    with connect(light_host) as t:  # (the fetch's lease on the host: ended with it, unless SIGKILL left it (its cap))
        left = [j for j in jobs.status(t) if j.kind == "fetch" and j.uses == [rid] and not j.ended]
        assert len(left) == (1 if sig == signal.SIGKILL else 0), [j.run_id for j in left]
        for j in left:
            jobs.stop(t, j.run_id, grace=2)
    r = inv("fetch", "--host", "light", "--hosts", hosts, "--run-id", rid, "--dest", str(tmp_path))
    assert r.returncode == 0 and "verified (sha256)" in r.stdout, r.stderr


def descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                kids.setdefault(int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(p.name))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def test_a_connection_lost_during_a_fetch_is_one_line(light_host, tmp_path):
    """The host's sshd goes away mid-fetch (its listener and its sessions): the fetch ends in the
    one line `connection to H lost ...: run it again, it resumes`, never paramiko's traceback."""
    from rig import Rig

    rid = jobs.new_run_id("t") + "-droplink"
    with connect(light_host) as t:
        make_run(t, rid, big_mib=48)
    other = Rig().start()  # (its own sshd, the same user and home: the same workdir)
    try:
        hf = str(other.write_hosts(tmp_path / "hosts-drop.yaml",
                                   {"drop": other.host(venv="~/light-venv", workdir="~/specops-light")}))
        p = subprocess.Popen([sys.executable, "-m", "invoke", "fetch", "--host", "drop", "--hosts", hf,
                              "--run-id", rid, "--dest", str(tmp_path / "dest"), "--bwlimit", "4000"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_transfer(rid)
        other.proc.send_signal(signal.SIGSTOP)  # (no new session from here on)
        for pid in descendants(other.proc.pid):  # its sessions (privilege-separated: grandchildren too)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # (ended with its parent session, killed a moment before)
                pass
        other.stop()
        out, err = p.communicate(timeout=180)
        lines = err.strip().splitlines()
        assert p.returncode != 0 and "Traceback" not in err, out + err
        assert lines[-1].startswith("specops: connection to drop lost") and \
            lines[-1].endswith("run it again, it resumes"), err
    finally:
        other.stop()
        with connect(light_host) as t:  # (the lease the lost connection could not stop: ended here)
            end_leases(t, rid)


def test_clean_keeps_a_run_while_it_is_fetched(rig, light_host, tmp_path):
    """Issue 45 item 2, a fetch (`inv clean --older-than 0s --checkpoints` removed the run under a
    running `inv fetch`): the fetch holds a lease on the host, a job of kind `fetch` that uses the
    run; a clean meanwhile keeps the run and names the lease and how to end it; the fetch ends
    verified, and leaves no lease job or folder; then the clean removes the run. A dry run starts none."""
    from specops import inventory

    hf = str(rig.write_hosts(tmp_path / "hosts-lease.yaml",
                             {"fl": rig.host(venv="~/light-venv", workdir="~/specops-lease")}))
    with connect(inventory.load(hf).get("fl")) as t:
        t.check(f"rm -rf {shlex.quote(t.workdir + '/runs')}", "no runs from an earlier test run")
        rid = jobs.new_run_id("t") + "-leased"
        jobs.start(t, rid, ["true"], kind="train")
        t0 = time.time()
        while jobs.status(t, rid)[0].state != "succeeded" and time.time() - t0 < 30:
            time.sleep(0.2)
        make_run(t, rid, big_mib=4)
        runs = shlex.quote(t.workdir + "/runs")

        def leases() -> list[str]:
            return t.run(f"cd {runs} && ls -d *.fetch-* 2>/dev/null || true").stdout.split()

        with connect(inventory.load(hf).get("fl"), dry_run=True) as d:  # (`inv fetch` has no --dry-run; a caller's)
            with fetch.lease(d, rid) as none:
                assert none is None and any(f"hold a lease on {rid}" in s for s in d.plan_of().steps)
        assert leases() == [] and [j for j in jobs.status(t) if j.kind == "fetch"] == []
        p = subprocess.Popen([sys.executable, "-m", "invoke", "fetch", "--host", "fl", "--hosts", hf, "--run-id", rid,
                              "--dest", str(tmp_path), "--bwlimit", "300", "--streams", "1"],
                             cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        t0 = time.time()
        while not (held := [j for j in jobs.status(t) if j.kind == "fetch" and j.state == "running"]):
            assert p.poll() is None and time.time() - t0 < 30, "no lease while the fetch runs"
            time.sleep(0.2)
        lid = held[0].run_id
        assert lid.startswith(f"{rid}.fetch-") and held[0].uses == [rid]
        r = inv("clean", "--host", "fl", "--hosts", hf, "--older-than", "0s", "--checkpoints")
        why = f"kept {rid}: in use by the running fetch {lid} (`inv stop --host fl --run-id {lid}` ends it; " \
              "then clean removes it)"
        assert r.returncode == 0 and "  " + why in r.stdout.splitlines(), r.stdout + r.stderr
        assert p.poll() is None, "the fetch ended before the clean: not slow enough to test the lease"
        assert t.exists(jobs.run_path(t, rid, "checkpoints", "1", "big.bin"))
        out, err = p.communicate(timeout=120)
        print(f"fetch under a lease: {time.time() - t0:.1f}s")
        assert p.returncode == 0 and "verified (sha256)" in out, out + err
        assert sha(tmp_path / rid / "checkpoints/1/big.bin") == \
            t.run(f"sha256sum {jobs.run_path(t, rid, 'checkpoints/1/big.bin')}").stdout.split()[0]
        assert leases() == [] and [j for j in jobs.status(t) if j.kind == "fetch"] == []
        r = inv("clean", "--host", "fl", "--hosts", hf, "--older-than", "0s", "--checkpoints")
        assert r.returncode == 0 and rid in r.stdout.splitlines()[0], r.stdout + r.stderr
        assert not t.exists(jobs.run_path(t, rid))
