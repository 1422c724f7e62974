"""A job's identity is checked before anything is signalled, and one bad run folder never breaks
the others (issue 24, items 2 and 4). Through `inv`, over the real sshd: forged, copied and
garbled job records next to real jobs and a stranger's process."""

import json
import os
import shlex
import time
from pathlib import Path

import pytest

from conftest import inv, wait_for
from specops.errors import SpecopsError
from specops.host.connection import connect
from specops.ops import jobs


def hosts_file(light_host) -> str:
    return str(Path(light_host.key).parent / "hosts-light.yaml")


def alive(t, pid) -> bool:
    st = t.run(f"ps -o stat= -p {int(pid)}").stdout.strip()
    return bool(st) and not st.startswith("Z")


def stranger(t) -> int:
    """A process of nobody's job, in a session of its own (what a reused pid or group id points at)."""
    pid = int(t.check("setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!", "a stranger").stdout.split()[-1])
    time.sleep(0.3)
    assert alive(t, pid)
    return pid


def write_record(t, rid, text):
    d = jobs.run_path(t, rid)
    t.check(f"mkdir -p {shlex.quote(d)} && printf %s {shlex.quote(text)} > {shlex.quote(d + '/job.json')}",
            "a job record")


def status_rows(hf) -> dict:
    r = inv("status", "--host", "light", "--hosts", hf, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return {j["run_id"]: j for j in json.loads(r.stdout)}


def test_a_forged_record_pointing_at_a_stranger_is_lost_and_stop_signals_nothing(light_host):
    """job.json naming a live process that is not the job's (a reused pid, a copied record):
    status says lost, stop says it is not running, and the stranger lives on."""
    hf = hosts_file(light_host)
    with connect(light_host) as t:
        victim = stranger(t)
        now = time.time()
        # fresh run ids: the light host's workdir outlives a test session (an older run's
        # forged-start folder, ended with its exit_code, read as killed here)
        start_id, legacy_id = jobs.new_run_id("forged-start"), jobs.new_run_id("forged-legacy")
        forged = {  # a pid and group of another process, a start time that is not its own
            start_id: {"pid_start": 1, "tag": f"{start_id}.1.x"},
            # a record from before start times were kept: only the job's tag would do
            legacy_id: {"tag": f"{legacy_id}.1"},
        }
        for rid, extra in forged.items():
            write_record(t, rid, json.dumps({"run_id": rid, "kind": "train", "lock": "train", "argv": ["x"],
                                             "pid": victim, "pgid": victim, "child_pid": victim,
                                             "started": now, **extra}))
        rows = status_rows(hf)
        for rid in forged:
            assert rows[rid]["state"] == "lost", rows[rid]
            r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", rid, "--grace", "2")
            assert r.returncode == 0, r.stderr
            assert f"stop {rid}: not running (lost: supervisor gone without an exit code): nothing was signalled" \
                in r.stdout, r.stdout
        time.sleep(0.5)
        assert alive(t, victim), "stop signalled a process that was not its job's"
        # a lost record holds no lock: a train starts beside it
        other = jobs.new_run_id("t") + "-beside"
        jobs.start(t, other, ["true"], kind="train", lock="train")
        t.run(f"kill {victim}")


def test_a_copied_record_never_reaches_the_original_job(rig, light_host, tmp_path):
    """A running job's job.json copied into another workdir (same run id, same tag) or under
    another run id: the copy is not the job (lost / unreadable), stopping it leaves the job running."""
    from specops import inventory

    hf2 = str(rig.write_hosts(tmp_path / "hosts-copy.yaml",
                              {"copy": rig.host(venv="~/light-venv", workdir="~/specops-light-copy")}))
    hf = hosts_file(light_host)
    rid = jobs.new_run_id("t") + "-orig"
    with connect(light_host) as t:
        j = jobs.start(t, rid, ["sleep", "300"], kind="test")
        time.sleep(0.5)
        src = jobs.run_path(t, rid, "job.json")
        with connect(inventory.load(hf2).get("copy")) as t2:
            dst = jobs.run_path(t2, rid)
            t2.check(f"mkdir -p {shlex.quote(dst)} && cp {shlex.quote(src)} {shlex.quote(dst)}/", "copying the record")
        other = jobs.run_path(t, "t-renamed-copy")
        t.check(f"mkdir -p {shlex.quote(other)} && cp {shlex.quote(src)} {shlex.quote(other)}/", "a renamed copy")

        r = inv("stop", "--host", "copy", "--hosts", hf2, "--run-id", rid, "--grace", "2")
        assert r.returncode == 0 and "nothing was signalled" in r.stdout, r.stdout + r.stderr
        rows = status_rows(hf)
        assert rows["t-renamed-copy"]["kind"] == "?" and rows["t-renamed-copy"]["detail"].startswith(
            f"? job.json unreadable: its run_id \"{rid}\" is not this folder's ('t-renamed-copy'): copied"), rows
        assert rows["t-renamed-copy"]["state"] == "lost"
        r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", "t-renamed-copy", "--grace", "2")
        assert r.returncode == 0 and "nothing was signalled" in r.stdout, r.stdout + r.stderr
        assert alive(t, j.pid) and rows[rid]["state"] == "running"
        assert jobs.stop(t, rid, grace=5).state == "stopped"
        t.check(f"rm -rf {shlex.quote(other)}", "cleanup")


@pytest.mark.parametrize("garble,why", [
    ("[1, 2]", "a JSON list, not a record"),
    ('{"run_id": "RID", "pid": "abc"}', 'pid is "abc", not a number'),
    ("{half a record", "not JSON"),
])
def test_a_garbled_record_is_a_row_holds_the_lock_and_stop_reaches_its_processes(light_host, garble, why):
    """job.json unreadable or of the wrong types while the job runs: `inv status` shows it as a
    row of its own ("? job.json unreadable: ..."), running; its processes still hold the train lock;
    `inv stop` still ends them."""
    hf = hosts_file(light_host)
    rid = jobs.new_run_id("t") + "-garbled"
    with connect(light_host) as t:
        j = jobs.start(t, rid, ["sh", "-c", "sleep 300 & wait"], kind="train", lock="train")
        time.sleep(0.5)
        child = json.loads(t.read_bytes(jobs.run_path(t, rid, "job.json")))["child_pid"]
        write_record(t, rid, garble.replace("RID", rid))
        r = inv("status", "--host", "light", "--hosts", hf)
        assert r.returncode == 0, r.stderr
        row = next(ln.split("\t") for ln in r.stdout.splitlines() if ln.startswith(rid + "\t"))
        assert row[1] == "?" and row[2].startswith(f"running (? job.json unreadable: {why}"), row
        with pytest.raises(SpecopsError, match=f"lock 'train' is held by run '{rid}' .*job.json unreadable"):
            jobs.start(t, jobs.new_run_id("t") + "-second", ["true"], kind="train", lock="train")
        r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", rid, "--grace", "5")
        assert r.returncode == 0, r.stdout + r.stderr
        assert not alive(t, child)
        # (`inv stop` returns once the command is gone and its exit code written; the supervisor ends by itself
        # just after, its last notification: later on a loaded host, ci22 found it at the first look)
        wait_for(lambda: not alive(t, j.pid), 15, "the garbled record's supervisor to end after inv stop")
        left = t.run(f"grep -l {shlex.quote(rid)} /proc/[0-9]*/environ 2>/dev/null").stdout.split()
        assert left == [], left
        assert status_rows(hf)[rid]["state"] != "running"
        jobs.start(t, jobs.new_run_id("t") + "-after", ["true"], kind="train", lock="train")  # free again


def test_one_bad_run_folder_never_breaks_the_others(light_host):
    """Garbage exit_code, pid "abc", a list for job.json, a directory as job.json: each is a row
    saying what is wrong; the good runs are all listed."""
    hf = hosts_file(light_host)
    with connect(light_host) as t:
        good = jobs.new_run_id("t") + "-good"
        jobs.start(t, good, ["true"], kind="test")
        time.sleep(1)
        base = jobs.run_path(t, "t-bad")
        write_record(t, "t-bad-code", json.dumps({"run_id": "t-bad-code", "kind": "test", "started": time.time()}))
        t.check(f"printf abc > {shlex.quote(base + '-code/exit_code')}", "a garbage exit code")
        write_record(t, "t-bad-pid", json.dumps({"run_id": "t-bad-pid", "pid": "abc"}))
        write_record(t, "t-bad-list", "[]")
        t.check(f"mkdir -p {shlex.quote(base + '-dir/job.json')}", "a directory as job.json")
        rows = status_rows(hf)
        assert rows[good]["state"] == "succeeded"
        assert rows["t-bad-code"]["detail"] == "? exit_code unreadable: 'abc'" and rows["t-bad-code"]["state"] == "lost"
        assert rows["t-bad-pid"]["detail"].startswith('? job.json unreadable: pid is "abc", not a number')
        assert rows["t-bad-list"]["detail"].startswith("? job.json unreadable: a JSON list, not a record")
        assert rows["t-bad-dir"]["detail"].startswith("? job.json unreadable: Is a directory"), rows["t-bad-dir"]
        r = inv("status", "--host", "light", "--hosts", hf, "--run-id", "t-bad-pid")
        assert r.returncode == 0 and "t-bad-pid\t?\tlost (? job.json unreadable" in r.stdout, r.stdout + r.stderr
        t.check(f"rm -rf {shlex.quote(base)}-code {shlex.quote(base)}-pid {shlex.quote(base)}-list "
                f"{shlex.quote(base)}-dir", "cleanup")


def follower(hf, host, rid):
    import subprocess
    import sys

    from conftest import REPO

    return subprocess.Popen([sys.executable, "-m", "invoke", "logs", "--host", host, "--hosts", hf, "--run-id", rid,
                             "-f"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_follower_ends_in_one_line_when_the_job_is_lost_or_its_folder_vanishes(light_host):
    """`inv logs -f` of a job whose supervisor died without an exit code, or whose run folder is
    removed meanwhile: one line, non-zero, within seconds (it used to wait forever)."""
    hf = hosts_file(light_host)
    with connect(light_host) as t:
        lost, gone = (jobs.new_run_id("t") + s for s in ("-lostf", "-gonef"))
        for rid in (lost, gone):
            jobs.start(t, rid, ["sleep", "300"], kind="test")
        time.sleep(0.5)
        recs = {rid: json.loads(t.read_bytes(jobs.run_path(t, rid, "job.json"))) for rid in (lost, gone)}
        fs = {rid: follower(hf, "light", rid) for rid in (lost, gone)}
        for f in fs.values():  # (each follows: the log's first line has come)
            assert "start: sleep 300" in f.stdout.readline()
        t.check(f"kill -9 {recs[lost]['pid']} {recs[lost]['child_pid']}", "the job's supervisor and command die")
        t.check(f"rm -rf {shlex.quote(jobs.run_path(t, gone))}", "its run folder goes")
        try:
            for rid, why in ((lost, f"{lost} on light is lost (supervisor gone without an exit code): no exit code "
                                    f"will come, the follow ends"),
                             (gone, f"{gone} on light: its run folder is gone (removed while followed)")):
                out, err = fs[rid].communicate(timeout=90)
                lines = err.strip().splitlines()
                assert fs[rid].returncode != 0 and len(lines) == 1 and "Traceback" not in err, err
                assert lines[0].startswith("specops: " + why), lines[0]
        finally:
            t.run(f"kill {recs[gone]['pid']} {recs[gone]['child_pid']}")


def test_a_changed_host_key_during_a_follow_stops_the_retries_at_once(light_host, tmp_path):
    """The connection drops while `logs -f` follows, and the host now shows another key: the
    follower stops at once with the CHANGED line (no five reconnects with backoff). (Its own sshd,
    the same user and workdir: only that sshd's sessions are cut.)"""
    import signal
    import subprocess

    from rig import Rig
    from test_fetch import descendants

    other = Rig().start()
    kh = tmp_path / "known_hosts"
    kh.write_text(other.known_hosts.read_text())
    hf = str(other.write_hosts(tmp_path / "hosts-kh.yaml", {"kh": other.host(venv="~/light-venv",
                                                                              workdir="~/specops-light",
                                                                              known_hosts=str(kh))}))
    rid = jobs.new_run_id("t") + "-khf"
    with connect(light_host) as t:
        jobs.start(t, rid, ["sh", "-c", "while :; do echo tick; sleep 1; done"], kind="test")
    f = follower(hf, "kh", rid)
    try:
        assert "start:" in f.stdout.readline()  # (it follows)
        key = tmp_path / "otherkey"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        name = kh.read_text().split()[0]
        kh.write_text(f"{name} {' '.join(key.with_suffix('.pub').read_text().split()[:2])}\n")
        for pid in descendants(other.proc.pid):  # the follower's SSH session ends, host side
            os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        out, err = f.communicate(timeout=60)
        lines = err.strip().splitlines()
        assert f.returncode != 0 and "CHANGED" in lines[-1] and "Traceback" not in err, err
        assert sum("reconnecting" in ln for ln in lines) <= 1, err
        assert time.time() - t0 < 15, f"took {time.time() - t0:.0f}s"
    finally:
        if f.poll() is None:
            f.kill()
        other.stop()
        with connect(light_host) as t:
            jobs.stop(t, rid, grace=2)


def test_status_lists_the_rest_while_run_folders_vanish(light_host):
    """1,500 run folders removed while `inv status` lists them: no error, the good run listed,
    each listed folder a whole row."""
    import subprocess
    import sys

    from conftest import REPO

    hf = hosts_file(light_host)
    with connect(light_host) as t:
        good = jobs.new_run_id("t") + "-survivor"
        jobs.start(t, good, ["true"], kind="test")
        runs = shlex.quote(jobs.run_path(t, "x").rsplit("/", 1)[0])
        t.check(f"cd {runs} && for i in $(seq 1500); do mkdir t-many-$i && "
                f"printf '{{\"run_id\": \"t-many-%s\", \"kind\": \"test\"}}' $i > t-many-$i/job.json; done",
                "1,500 run folders")
        p = subprocess.Popen([sys.executable, "-m", "invoke", "status", "--host", "light", "--hosts", hf, "--json"],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        t.check(f"cd {runs} && rm -rf t-many-*", "removing them while status lists")
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "Traceback" not in err, err
        rows = {j["run_id"]: j for j in json.loads(out)}
        assert rows[good]["state"] == "succeeded"
        assert all(j["state"] for j in rows.values())


def test_jobs_of_one_run_id_in_two_workdirs_never_reach_each_other(rig, light_host, tmp_path):
    """Two nodes of a group on one machine run the same run id in two workdirs (the sharded
    extraction's flake: node0's finished job SIGTERMed node1's). Each job's tag is its own, and a
    job ending reaps only its own folder's processes, even given the other's tag."""
    from specops import inventory

    hf2 = str(rig.write_hosts(tmp_path / "hosts-twin.yaml",
                              {"twin": rig.host(venv="~/light-venv", workdir="~/specops-light-twin")}))
    rid = jobs.new_run_id("t") + "-twin"
    with connect(light_host) as t, connect(inventory.load(hf2).get("twin")) as t2:
        jobs.start(t, rid, ["sleep", "2"], kind="extract")
        jobs.start(t2, rid, ["sleep", "300"], kind="extract")
        time.sleep(0.5)
        a, b = (json.loads(x.read_bytes(jobs.run_path(x, rid, "job.json"))) for x in (t, t2))
        assert a["tag"] != b["tag"]
        wait_state = time.time()
        while jobs.status(t, rid)[0].state == "running" and time.time() - wait_state < 60:
            time.sleep(0.5)
        assert jobs.status(t, rid)[0].state == "succeeded"
        # the worst case, by hand: the first job's end-of-command reaping given the second's tag
        py = shlex.quote(t.expand("~/light-venv/bin/python3"))
        code = f"from specops_host.jobs import job; job.end_orphans({b['tag']!r}, grace=1)"
        t.check(f"cd {shlex.quote(t.workdir)} && SPECOPS_JOB_DIR=\"$(pwd)/runs/{rid}\" {py} -c {shlex.quote(code)}",
                "reaping with the other's tag")
        time.sleep(1)
        assert alive(t2, b["child_pid"]) and jobs.status(t2, rid)[0].state == "running"
        assert jobs.stop(t2, rid, grace=5).state == "stopped"
