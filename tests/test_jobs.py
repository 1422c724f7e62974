"""Detached jobs over the real sshd: survive the connection, follow, stop, lock, secrets."""

import json
import shlex
import time

import pytest

from specops.ops import jobs
from specops.errors import SpecopsError
from specops.host.connection import connect


def live_in_group(t, pgid):
    """Processes of the group that are not zombies (a zombie waits for init to reap it)."""
    out = t.run("ps -eo pgid=,stat=,pid=").stdout.split("\n")
    return [ln for ln in out if ln.split() and ln.split()[0] == str(pgid) and not ln.split()[1].startswith("Z")]


def wait_state(t, run_id, pred, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        j = jobs.status(t, run_id)[0]
        if pred(j):
            return j
        time.sleep(0.2)
    raise AssertionError(f"{run_id}: state still {j.describe}")


def ENDED(j):
    return j.ended


def test_job_survives_connection_and_follow_loses_nothing(light_host):
    rid = jobs.new_run_id("t") + "-survive"
    script = "for i in $(seq 1 40); do echo line $i; sleep 0.05; done"
    t = connect(light_host)
    jobs.start(t, rid, ["sh", "-c", script], kind="test")
    t.conn.client.close()  # the SSH client dies mid-run
    with connect(light_host) as t2:
        got = []
        off, code = jobs.follow(t2, rid, write=got.append)
        text = b"".join(got).decode()
        lines = [ln for ln in text.splitlines() if ln.startswith("line ")]
        assert lines == [f"line {i}" for i in range(1, 41)]
        assert code == 0 and jobs.status(t2, rid)[0].state == "succeeded"
        # re-attaching from an offset gives exactly the rest
        got2 = []
        jobs.follow(t2, rid, offset=len(text.split("line 20\n")[0] + "line 20\n"), write=got2.append)
        assert b"".join(got2).decode().splitlines()[0] == "line 21"


def test_stop_terms_the_group_and_waits(light_host):
    rid = jobs.new_run_id("t") + "-stop"
    with connect(light_host) as t:
        marker = t.expand("~/specops-light/runs/" + rid + "/interrupted-checkpoint")
        script = (f"trap 'sleep 0.5; echo saved > {shlex.quote(marker)}; exit 143' TERM; "
                  "sleep 300 & wait")
        j = jobs.start(t, rid, ["sh", "-c", script], kind="test")
        time.sleep(0.5)
        res = jobs.stop(t, rid, grace=10)
        assert res.state == "stopped" and not res.sigkill
        assert t.run(f"cat {shlex.quote(marker)}").stdout.strip() == "saved"
        # nothing of the process group is left
        assert live_in_group(t, j.pgid) == []


def test_stop_escalates_to_sigkill(light_host):
    rid = jobs.new_run_id("t") + "-stubborn"
    with connect(light_host) as t:
        j = jobs.start(t, rid, ["sh", "-c", "trap '' TERM; sleep 300 & wait; sleep 300"], kind="test")
        time.sleep(0.5)
        res = jobs.stop(t, rid, grace=1)
        assert res.sigkill is True
        assert live_in_group(t, j.pgid) == []


def test_lock_refuses_second_job(light_host):
    a, b = jobs.new_run_id("t") + "-lockA", jobs.new_run_id("t") + "-lockB"
    with connect(light_host) as t:
        jobs.start(t, a, ["sleep", "60"], kind="train", lock="train")
        with pytest.raises(SpecopsError, match=f"held by run '{a}'"):
            jobs.start(t, b, ["sleep", "1"], kind="train", lock="train")
        jobs.stop(t, a, grace=5)
        jobs.start(t, b, ["true"], kind="train", lock="train")  # free again


def test_killed_and_failed_states(light_host):
    with connect(light_host) as t:
        k, f = jobs.new_run_id("t") + "-k9", jobs.new_run_id("t") + "-fail"
        jobs.start(t, k, ["sh", "-c", "kill -9 $$"], kind="test")
        jobs.start(t, f, ["sh", "-c", "echo boom >&2; exit 3"], kind="test")
        assert wait_state(t, k, ENDED).describe == "killed (signal 9)"
        assert wait_state(t, f, ENDED).describe == "failed (exit 3)"
        assert b"boom" in t.read_bytes(jobs.run_path(t, f, "output.log"))


def test_secret_env_not_on_command_line(light_host):
    rid = jobs.new_run_id("t") + "-secret"
    secret = "s3cr3t-token-value"
    with connect(light_host) as t:
        jobs.start(t, rid, ["sh", "-c", 'echo "seen ${#HF_TOKEN} ${HF_TOKEN#s3cr3t}"; sleep 2'],
                   kind="test", env={"HF_TOKEN": secret})
        time.sleep(0.5)
        ps = t.run("ps -eo args").stdout
        assert secret not in ps
        wait_state(t, rid, ENDED)
        log = t.read_bytes(jobs.run_path(t, rid, "output.log")).decode()
        assert "seen 18 -token-value" in log and secret not in log
        assert not t.exists(jobs.run_path(t, rid) + ".env")


@pytest.mark.parametrize("bad", ["a;b", "$(touch x)", "../up", ".hidden", "a b", "x\ny", ""])
def test_run_id_validated(bad):
    with pytest.raises(SpecopsError, match="invalid run id"):
        jobs.validate_run_id(bad)


def test_unknown_run_id(light_host):
    with connect(light_host) as t:
        with pytest.raises(SpecopsError, match="unknown run id 'nope-123'"):
            jobs.status(t, "nope-123")
        with pytest.raises(SpecopsError, match="unknown run id"):
            jobs.stop(t, "nope-123")


HAMMER = """import sys
sys.path.insert(0, sys.argv[1])
from specops_host.jobs import records
for i in range(300):
    records.update_json(sys.argv[2], **{sys.argv[3]: i})
"""


def test_job_record_updates_from_several_writers_lose_nothing(tmp_path):
    """The starter, the supervisor and `stop` write job.json at once (on the H200 the supervisor
    once died of it: its temp file renamed away by the other writer): three processes merging
    300 updates each, no error, every writer's last value kept."""
    import json
    import subprocess
    import sys

    from conftest import REPO

    rec = tmp_path / "job.json"
    rec.write_text(json.dumps({"run_id": "x"}))
    script = tmp_path / "hammer.py"
    script.write_text(HAMMER)
    procs = [subprocess.Popen([sys.executable, str(script), str(REPO), str(rec), key],
                              stderr=subprocess.PIPE, text=True) for key in ("pid", "child_pid", "stopped_by_user")]
    errs = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    assert json.loads(rec.read_text()) == {"run_id": "x", "pid": 299, "child_pid": 299, "stopped_by_user": 299}
    assert not list(tmp_path.glob("*.tmp"))


def test_clean_removes_only_old_ended_runs_and_status_filters_by_kind(rig, light_host, tmp_path):
    """`inv clean --older-than AGE`: ended runs go (a dry run removes nothing and says 'would');
    a running job and a run holding checkpoints stay, each with why; --checkpoints takes those
    too; `inv status --kind` lists only that kind; a bad age is one line, exit 2."""
    from conftest import inv
    from specops import inventory

    hf = str(rig.write_hosts(tmp_path / "hosts-clean.yaml",
                             {"cl": rig.host(venv="~/light-venv", workdir="~/specops-clean")}))
    h = inventory.load(hf).get("cl")
    with connect(h) as t:
        t.check(f"rm -rf {shlex.quote(t.workdir + '/runs')}", "no runs from an earlier test run")
        done, busy, kept = (jobs.new_run_id("t") + s for s in ("-done", "-busy", "-ckpt"))
        jobs.start(t, done, ["true"], kind="test")
        jobs.start(t, kept, ["true"], kind="train")
        jobs.start(t, busy, ["sleep", "60"], kind="test")
        t.check(f"mkdir -p {shlex.quote(jobs.run_path(t, kept, 'checkpoints', '0'))}", "a checkpoint")
        for rid in (done, kept):
            wait_state(t, rid, ENDED)
        r = inv("status", "--host", "cl", "--hosts", hf, "--kind", "train")
        assert r.returncode == 0 and kept in r.stdout and done not in r.stdout and busy not in r.stdout, r.stdout
        r = inv("clean", "--host", "cl", "--hosts", hf, "--older-than", "0s", "--dry-run")
        assert r.returncode == 0 and "would remove 1 run(s): " + done in r.stdout, r.stdout + r.stderr
        assert t.exists(jobs.run_path(t, done), "-d")
        r = inv("clean", "--host", "cl", "--hosts", hf, "--older-than", "0s")
        assert r.returncode == 0 and f"removed 1 run(s): {done}" in r.stdout, r.stdout + r.stderr
        assert f"kept {busy}: running: a running job is never removed" in r.stdout
        assert f"kept {kept}: holds checkpoints (--checkpoints removes them too)" in r.stdout
        assert not t.exists(jobs.run_path(t, done)) and t.exists(jobs.run_path(t, kept), "-d")
        r = inv("clean", "--host", "cl", "--hosts", hf, "--older-than", "0s", "--checkpoints")
        assert r.returncode == 0 and f"removed 1 run(s): {kept}" in r.stdout, r.stdout
        r = inv("clean", "--host", "cl", "--hosts", hf, "--older-than", "1y")
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [
            "specops: --older-than '1y': give an age such as 7d, 12h, 30m (s, m, h, d or w)"], r.stderr
        r = inv("clean", "--host", "cl", "--hosts", hf, "--older-than", "7d")
        assert r.returncode == 0 and "removed 0 run(s)" in r.stdout  # (too young: not listed at all)
        jobs.stop(t, busy, grace=5)


def test_clean_keeps_a_run_that_a_running_job_uses(rig, light_host, tmp_path):
    """Issue 45 defect 2 (`inv clean --older-than 0s --checkpoints` removed r1 while `inv evaluate
    --run-id r1` started its server): a job started with uses=[r1] (what evaluate() starts) keeps
    r1, checkpoints and all, and the clean says which job uses it and how to end that; once that
    job has ended, r1 goes. A record that names r1 but whose process is gone (lost) keeps nothing."""
    from conftest import inv
    from specops import inventory

    hf = str(rig.write_hosts(tmp_path / "hosts-inuse.yaml",
                             {"iu": rig.host(venv="~/light-venv", workdir="~/specops-inuse")}))
    h = inventory.load(hf).get("iu")
    with connect(h) as t:
        t.check(f"rm -rf {shlex.quote(t.workdir + '/runs')}", "no runs from an earlier test run")
        r1, r2 = jobs.new_run_id("t") + "-r1", jobs.new_run_id("t") + "-r2"
        for rid in (r1, r2):
            jobs.start(t, rid, ["true"], kind="train")
            t.check(f"mkdir -p {shlex.quote(jobs.run_path(t, rid, 'checkpoints', '0'))}", "a checkpoint")
            wait_state(t, rid, ENDED)
        user, gone = f"{r1}.eval-1", f"{r2}.eval-1"
        u = jobs.start(t, user, ["sleep", "300"], kind="evaluate", uses=[r1])
        jobs.start(t, gone, ["sleep", "300"], kind="evaluate", uses=[r2])
        assert jobs.status(t, user)[0].uses == [r1]
        g = jobs.status(t, gone)[0]
        t.check(f"pkill -9 -s {g.pid}", "the other evaluation's processes die")  # (its record names r2: lost now)
        wait_state(t, gone, lambda j: j.state == "lost")
        why = f"kept {r1}: in use by the running evaluate {user} (`inv stop --host iu --run-id {user}` ends it; " \
              "then clean removes it)"
        for dry in (["--dry-run"], []):
            r = inv("clean", "--host", "iu", "--hosts", hf, "--older-than", "0s", "--checkpoints", *dry)
            assert r.returncode == 0 and "  " + why in r.stdout.splitlines(), r.stdout + r.stderr
            assert r2 in r.stdout.splitlines()[0] and r1 not in r.stdout.splitlines()[0], r.stdout
        assert t.exists(jobs.run_path(t, r1, "checkpoints", "0"), "-d") and not t.exists(jobs.run_path(t, r2))
        assert jobs.status(t, user)[0].state == "running" and u.pid
        jobs.stop(t, user, grace=2)
        r = inv("clean", "--host", "iu", "--hosts", hf, "--older-than", "0s", "--checkpoints")
        assert r.returncode == 0 and r1 in r.stdout.splitlines()[0], r.stdout + r.stderr
        assert not t.exists(jobs.run_path(t, r1))


def test_the_demos_vllm_warm_up_that_cannot_run_is_a_warning(light_host):
    """The demo's warm-up of vLLM's model-info cache (remote/specops_host/serve/vllm_warm.py, a job beside the
    learnable verifier's training) on a host whose venv has no vLLM: the job fails, its error
    comes back as one warning and the demo goes on (each server then inspects its architectures
    itself); an empty --archs is refused in one line."""
    from specops.host.remote_exec import run_script
    from specops.ops import pipeline

    with connect(light_host) as t:
        rid = pipeline.start_vllm_warm(t)
        res = pipeline.vllm_warm_done(t, rid, timeout=60)
        bad = run_script(t, "serve.vllm_warm", ["--kind", "cpu", "--archs", " , "])
    assert not res.get("ok") and res["error"].startswith("ModuleNotFoundError: No module named 'vllm'"), res
    warned = [n.text for n in t.notes if n.kind == "warn"]
    assert any(w.startswith("vLLM's model info not cached ahead (ModuleNotFoundError: No module named 'vllm'")
               and w.endswith("each server inspects its architectures itself") for w in warned), warned
    assert bad.get("refused") and bad["error"] == "--archs: give one or more architecture names, e.g. LlamaForCausalLM"


def test_a_job_is_running_as_soon_as_start_job_returns(monkeypatch, tmp_path):
    """Exec closes the pipe Popen waits on before the new program's environment is in place: a
    look at once could see the supervisor with no tag, and read the job `lost` (a vLLM server's
    start once failed so, 0 s after its launch, and the server outlived its Slurm task). start_job
    returns only once the tag shows: here /proc's environment is read as empty three times first."""
    from specops_host.jobs import job, procs
    from specops_host.jobs.records import job_state

    blank = iter(range(3))
    monkeypatch.setattr(job, "environ", lambda pid: {} if next(blank, None) is not None else procs.environ(pid))
    rec = job.start_job("r1", ["sleep", "30"], kind="test", root=str(tmp_path))
    try:
        assert rec["ok"] and next(blank, None) is None  # (every blank read was waited past)
        assert job_state(tmp_path / "r1")["state"] == "running"
        assert procs.environ(rec["pid"])[procs.TAG_VAR] == rec["tag"]
    finally:
        assert job.stop_job(tmp_path / "r1", grace=5)["ok"]


def test_a_log_ending_in_a_payload_frame_reads_back_through_the_status_payload(tmp_path, capsys):
    """A job whose script framed its own payload into its log (contract.main's error, vllm_warm's reply): the status
    payload carried that line, marker and all, and the laptop's decode took the inner marker for the frame
    ('printed a broken payload: Expecting property name enclosed in double quotes', CI, 2026-12-06). The log's last
    line skips the frame, and no marker can be written inside a payload."""
    from specops_host.contract import BEGIN, END, decode, emit
    from specops_host.jobs.records import job_state

    d = tmp_path / "r1"
    d.mkdir()
    (d / "job.json").write_text(json.dumps({"run_id": "r1", "pid": 0, "argv": ["x"], "started": time.time()}))
    (d / "output.log").write_text("importing vllm\n" + BEGIN + json.dumps({"ok": False, "error": "boom"}) + END + "\n")
    (d / "exit_code").write_text("1\n")
    rec = job_state(d)
    assert rec["state"] == "failed" and rec["last_line"] == "importing vllm", rec
    emit({"rows": [rec], "log": "a line\n" + BEGIN + '{"ok": false}' + END + "\n" + BEGIN + "{cut"})
    out = capsys.readouterr().out
    assert out.count(BEGIN) == 1 and out.count(END) == 1, out
    assert decode(out)["log"].endswith(BEGIN + "{cut")


@pytest.mark.parametrize("attempt", range(3))
def test_a_stop_at_once_after_the_start_ends_the_command_and_notifies(tmp_path, attempt):
    """`stop` as soon as `start` returns: the supervisor is past its imports with its handlers set and the command
    started, so the stop ends the command, the end is recorded as a stop and notified (CI, 2026-12-06: a
    supervisor SIGTERMed while still importing died with no exit code and no notification)."""
    from specops_host.contract import Supervision
    from specops_host.jobs import job
    from specops_host.jobs.records import job_state

    events = tmp_path / "events"
    env = tmp_path / "env"
    env.write_text(f"SPECOPS_NOTIFY=echo \"$SPECOPS_EVENT $SPECOPS_RUN_ID\" >> {events}\n")
    env.chmod(0o600)
    rec = job.start_job("r1", ["sleep", "60"], kind="train", root=str(tmp_path / "runs"), env_file=str(env),
                        extra={"supervision": Supervision(restarts=1, backoff=0.2).record()})
    assert rec["ok"] and rec.get("child_pid"), rec
    stopped = job.stop_job(tmp_path / "runs" / "r1", grace=60)
    assert stopped["ok"] and not stopped["sigkill"], stopped  # (the SIGTERM did it, however loaded the machine)
    assert job_state(tmp_path / "runs" / "r1")["state"] == "stopped"
    deadline = time.time() + 60
    while time.time() < deadline and not (events.is_file() and events.read_text()):
        time.sleep(0.1)
    log = (tmp_path / "runs" / "r1" / "output.log").read_text()
    assert events.is_file() and events.read_text().split() == ["end", "r1"], log


def test_a_followed_slurm_job_is_read_once_slurm_has_ended_it(monkeypatch):
    """The batch shell writes the exit code before Slurm ends the job (COMPLETING: specops' RUNNING): the follower
    waits, bounded, until Slurm lists it as ended, so the caller's status line says failed, not running."""
    answers = iter([None, None, None, 1])
    monkeypatch.setattr(jobs.time, "sleep", lambda s: None)
    assert jobs.settled(lambda: next(answers)) is True
    assert next(answers, "spent") == "spent"  # (asked until it answered, not once more)
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(jobs.time, "monotonic", lambda: next(clock))
    assert jobs.settled(lambda: None, wait=30) is False  # (Slurm never ends it: the follower goes on, bounded)
