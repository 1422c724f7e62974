"""A process is a job's only if it carries that run folder's tag (issue 34, item 1 and item 6).
Through `inv`, over the real sshd: a record naming an untagged process with its real start time,
and a run id that is a symlink to another run."""

import json
import shlex
import time
from pathlib import Path

import pytest

from conftest import inv, wait_for
from specops.host.connection import connect
from specops.ops import jobs
from test_identity import alive, follower, hosts_file, status_rows, stranger, write_record

DAY = 86400


@pytest.mark.parametrize("term", ["group", "child"])
def test_a_record_naming_an_untagged_process_at_its_real_start_time_is_lost(light_host, term):
    """job.json naming a `setsid sleep` with its real start time (stat field 22), as leader or as
    the command: status says lost, `logs -f` ends in one line, stop signals nothing and marks it
    stopped, and clean's hint (that stop) is a command that works: clean then removes it."""
    hf = hosts_file(light_host)
    with connect(light_host) as t:
        victim = stranger(t)
        start = int(t.check(f"cut -d' ' -f22 /proc/{victim}/stat", "its start time").stdout.split()[0])
        rid = jobs.new_run_id("forged-real")
        write_record(t, rid, json.dumps({
            "run_id": rid, "kind": "train", "lock": "train", "argv": ["x"], "term": term, "tag": f"{rid}.1.x",
            "pid": victim, "pgid": victim, "pid_start": start, "child_pid": victim, "child_start": start,
            "started": time.time() - 30 * DAY}))
        try:
            assert status_rows(hf)[rid]["state"] == "lost"
            f = follower(hf, "light", rid)
            out, err = f.communicate(timeout=60)
            lines = err.strip().splitlines()
            assert f.returncode != 0 and len(lines) == 1 and f"{rid} on light is lost" in lines[0], err

            r = inv("clean", "--host", "light", "--hosts", hf, "--older-than", "29d")
            assert r.returncode == 0, r.stdout + r.stderr
            kept = next(ln for ln in r.stdout.splitlines() if f"kept {rid}:" in ln)
            hint = kept.split("`")[1]
            assert hint == f"inv stop --host light --run-id {rid}", kept
            r = inv(*shlex.split(hint)[1:], "--hosts", hf, "--grace", "2")
            assert r.returncode == 0 and "nothing was signalled; marked stopped" in r.stdout, r.stdout + r.stderr
            time.sleep(0.5)
            assert alive(t, victim), "stop signalled a process that did not carry the job's tag"
            assert status_rows(hf)[rid]["state"] == "stopped"
            r = inv("clean", "--host", "light", "--hosts", hf, "--older-than", "29d")
            assert r.returncode == 0 and rid in r.stdout.splitlines()[0], r.stdout + r.stderr
            assert not t.exists(jobs.run_path(t, rid))
        finally:
            t.run(f"kill {victim}")


def test_a_symlinked_run_id_is_refused_by_stop_and_the_job_reads_stopped(light_host):
    """`ln -s realjob runs/alias; inv stop --run-id alias`: refused in one line naming the target,
    the job runs on; status shows alias as no run of its own; stopped by its own name it reads
    `stopped`; clean's hint for the link (rm) removes the link alone."""
    hf = hosts_file(light_host)
    real, alias = jobs.new_run_id("t") + "-real", jobs.new_run_id("t") + "-alias"
    with connect(light_host) as t:
        j = jobs.start(t, real, ["sleep", "300"], kind="test")
        time.sleep(0.5)
        target = jobs.run_path(t, real)
        t.check(f"ln -s {shlex.quote(real)} {shlex.quote(jobs.run_path(t, alias))}", "a symlinked run id")
        r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", alias, "--grace", "2")
        lines = r.stderr.strip().splitlines()
        assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
        assert f"is a symlink to {target}" in lines[0] and f"--run-id {real}" in lines[0], lines
        assert alive(t, j.pid)
        rows = status_rows(hf)
        assert rows[real]["state"] == "running" and rows[alias]["state"] == "lost", rows[alias]
        assert "is a symlink to" in rows[alias]["detail"]
        r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", real, "--grace", "5")
        assert r.returncode == 0, r.stdout + r.stderr
        assert status_rows(hf)[real]["state"] == "stopped"
        t.check(f"touch -d '40 days ago' {shlex.quote(target)}/job.json", "the target's record made old")
        r = inv("clean", "--host", "light", "--hosts", hf, "--older-than", "30d")
        assert r.returncode == 0, r.stdout + r.stderr
        kept = next((ln for ln in r.stdout.splitlines() if f"kept {alias}:" in ln), r.stdout + r.stderr)
        assert f"is a symlink to {target}" in kept, kept
        hint = kept.split("`")[1]
        assert hint == f"rm {jobs.run_path(t, alias)}", kept
        t.check(hint, "clean's hint")
        assert not t.exists(jobs.run_path(t, alias)) and t.exists(target + "/job.json")


def test_a_symlinked_run_id_is_refused_by_fetch_logs_and_evaluate_as_by_stop(light_host, tmp_path):
    """Issue 45 (defect 10): `ln -s r2 runs/alias`: `stop` refused it, but `fetch`, `logs` and
    `evaluate` quietly acted on r2. Each now refuses it in the same line as stop's, naming the
    target and the run id to use; nothing is fetched, no evaluation starts, r2 runs on."""
    hf = hosts_file(light_host)
    real, alias = jobs.new_run_id("t") + "-r2", jobs.new_run_id("t") + "-alias"
    with connect(light_host) as t:
        j = jobs.start(t, real, ["sleep", "300"], kind="train")
        target = jobs.run_path(t, real)
        t.put_text(json.dumps({"verifier": "/no/such/verifier", "kind": "cpu"}), f"{target}/train-spec.json")
        t.check(f"ln -s {shlex.quote(real)} {shlex.quote(jobs.run_path(t, alias))}", "a symlinked run id")
        try:
            said = {}
            for argv in (["stop", "--grace", "2"], ["fetch", "--dest", str(tmp_path)], ["logs"], ["logs", "-f"],
                         ["evaluate", "--speedup", "none", "--dest", str(tmp_path)]):
                r = inv(*argv, "--host", "light", "--hosts", hf, "--run-id", alias, timeout=120)
                lines = r.stderr.strip().splitlines()
                assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, (argv, r.stderr)
                assert lines[0].startswith(f"specops: {argv[0]} {alias} on light"), lines[0]
                said[" ".join(argv)] = lines[0].split(" on light", 1)[1].removeprefix(" refused").removeprefix(": ")
            assert set(said.values()) == {f"run id {alias!r} is a symlink to {target}, not a run of its own; use "
                                          f"--run-id {real}"}, said
            assert not list(tmp_path.iterdir()), "fetch or evaluate wrote something"
            assert not t.run(f"ls -d {shlex.quote(t.workdir)}/runs/{shlex.quote(alias)}.eval-* "
                             f"{shlex.quote(t.workdir)}/runs/{shlex.quote(real)}.eval-*").stdout.strip()
            assert jobs.status(t, real)[0].state == "running" and alive(t, j.pid)
        finally:
            jobs.stop(t, real, grace=2)
            t.run(f"rm -f {shlex.quote(jobs.run_path(t, alias))}")


#: a process that blanks its own environment as setproctitle does without SPT_NOENV: zeros over
#: /proc/self/environ's area (stat fields 50-51, env_start and env_end), then sleeps
BLANK = ("import time\n"
         "f = open('/proc/self/stat').read().rsplit(')', 1)[1].split()\n"
         "a, b = int(f[47]), int(f[48])\n"
         "m = open('/proc/self/mem', 'r+b'); m.seek(a); m.write(bytes(b - a)); m.close()\n"
         "time.sleep(300)\n")


def leaderless_group(t, member: str) -> tuple[int, int, int]:
    """Issue 45 defect 1's group: `setsid bash -c 'MEMBER & echo $$ >L; exit 0'` (its leader gone at
    once, its member left): (pgid, the member's pid, the member's start time in clock ticks)."""
    where = t.expand("~/leaderless.pgid")
    t.check(f"setsid bash -c {shlex.quote(member + ' </dev/null >/dev/null 2>&1 & echo $$ >' + where + '; exit 0')}"
            " </dev/null >/dev/null 2>&1", "a leaderless group")
    pgid = int(wait_for(lambda: t.read_bytes(where), 10, "the group's id").decode())
    pid = int(wait_for(lambda: t.run(f"pgrep -g {pgid}").stdout.split(), 10, "the group's member")[0])
    start = int(t.check(f"cut -d' ' -f22 /proc/{pid}/stat", "its start time").stdout.split()[0])
    return pgid, pid, start


@pytest.mark.parametrize("member", ["env -i /bin/sleep 900", "blanked"])
def test_a_record_naming_a_leaderless_group_of_untagged_processes_is_lost(light_host, member):
    """Issue 45 defect 1 (the exact forgery): a group whose leader is gone and whose member carries
    no tag (an empty environment, `env -i`; or one blanked as setproctitle does without SPT_NOENV);
    a job.json naming that group with pid_start one second before the member's start and any tag.
    `inv status` says lost, `inv stop` signals nothing and says so, the member lives on."""
    hf = hosts_file(light_host)
    with connect(light_host) as t:
        py = t.expand("~/light-venv/bin/python3")
        cmd = f"{shlex.quote(py)} -c {shlex.quote(BLANK)}" if member == "blanked" else member
        pgid, pid, start = leaderless_group(t, cmd)
        assert not t.run(f"tr -d '\\000' < /proc/{pid}/environ").stdout, "the member's environment is not empty"
        tick = int(t.check("getconf CLK_TCK", "clock ticks per second").stdout)
        rid = jobs.new_run_id("forged2")
        write_record(t, rid, json.dumps({"run_id": rid, "kind": "train", "argv": ["x"], "tag": f"{rid}.1.x",
                                         "pid": pgid, "pgid": pgid, "pid_start": start - tick,
                                         "started": time.time()}))
        try:
            row = status_rows(hf)[rid]
            assert row["state"] == "lost" and row["gpu_mib"] is None, row
            r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", rid, "--grace", "3")
            assert r.returncode == 0 and f"stop {rid}: not running (lost: " in r.stdout, r.stdout + r.stderr
            assert "nothing was signalled" in r.stdout, r.stdout
            time.sleep(0.5)
            assert alive(t, pid), "stop signalled a process that did not carry the job's tag"
        finally:
            t.run(f"kill {pid}")


def test_a_process_whose_environment_cannot_be_read_is_never_the_jobs(light_host, tmp_path):
    """Another user's process (here root's; the host's user cannot read its /proc/PID/environ) in a
    leaderless group that a record names: lost, nothing signalled."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.fail("this test starts a process of another user than the rig's: run the suite as root")
    hf = hosts_file(light_host)
    out = subprocess.run(["setsid", "bash", "-c", "/bin/sleep 900 </dev/null >/dev/null 2>&1 & echo $$ $!; exit 0"],
                         capture_output=True, text=True, check=True).stdout
    pgid, pid = map(int, out.split())
    start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    with connect(light_host) as t:
        r = t.run(f"cat /proc/{pid}/environ")
        assert not r.ok and "Permission denied" in r.stderr, (r.exited, r.stderr)
        rid = jobs.new_run_id("forged-root")
        write_record(t, rid, json.dumps({"run_id": rid, "kind": "train", "argv": ["x"], "tag": f"{rid}.1.x",
                                         "pid": pgid, "pgid": pgid, "pid_start": start - 1, "started": time.time()}))
    try:
        assert status_rows(hf)[rid]["state"] == "lost"
        r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", rid, "--grace", "2")
        assert r.returncode == 0 and "nothing was signalled" in r.stdout, r.stdout + r.stderr
        assert Path(f"/proc/{pid}").exists()
    finally:
        os.kill(pid, 15)


def test_every_line_of_a_dry_run_is_a_would_or_says_dry_run(light_host, tmp_path):
    """Item 3 (defect 4: `[specops] uploaded F -> ...` under dry runs): prepare-data of a laptop
    file, push, clean and stop under --dry-run; each line they print is a "would" or carries DRY-RUN.
    And item 4's --seq-length against the verifier's positions, refused by the plan (no server)."""
    hf = hosts_file(light_host)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    with connect(light_host) as t:
        ver = f"{t.workdir}/t-dry-ver"
        t.check(f"mkdir -p {ver} && echo '{{\"hidden_size\": 8, \"num_hidden_layers\": 6, \"vocab_size\": 32, "
                f"\"max_position_embeddings\": 64}}' > {ver}/config.json", "a verifier's config")
        rid = jobs.new_run_id("t") + "-dry"
        jobs.start(t, rid, ["sleep", "60"], kind="test")
    h = ["--host", "light", "--hosts", hf, "--dry-run"]
    for argv in (["prepare-data", "--data", str(rows), "--dataset", "t-dry", "--verifier", ver, "--seq-length", "32"],
                 ["push"], ["clean", "--older-than", "1000d"], ["stop", "--run-id", rid]):
        r = inv(*argv, *h)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
        assert lines and all(ln.startswith("DRY-RUN light: ") or "would" in ln for ln in lines), (argv, r.stdout)
    # defect 7, through the CLI: the default --seq-length 2048 (here 64) on a verifier of that many positions
    r = inv("prepare-data", "--data", str(rows), "--dataset", "t-dry", "--verifier", ver, "--seq-length", "64", *h)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "makes the vLLM server's --max-model-len 65, but the verifier holds 64 positions" in lines[0] and \
        "give --seq-length 63 or less (nothing was started)" in lines[0], lines[0]
    with connect(light_host) as t:
        assert jobs.status(t, rid)[0].state == "running"
        jobs.stop(t, rid, grace=2)


def test_status_of_an_unknown_kind_is_one_line_exit_2(light_host):
    r = inv("status", "--host", "light", "--hosts", hosts_file(light_host), "--kind", "nope")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(
        "specops: --kind 'nope': no such kind of run (kinds: ") and "train" in lines[0], r.stdout + r.stderr
    r = inv("status", "--host", "light", "--hosts", hosts_file(light_host), "--kind", "train,test")
    assert r.returncode == 0, r.stderr
