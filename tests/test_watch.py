"""A training that looks after itself, the fast layer: the supervisor's decisions (jobs/watch.py), the
checkpoint markers (ckpt.py), notifications (jobs/notify.py), the flags and hosts.yaml fields,
the exact start command `inv train` builds, and the real supervisor on this machine with tiny
commands (no rig: its own processes, a temporary workdir). The real trainer over the real sshd:
tests/test_longruns.py."""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import inv
from specops import inventory
from specops.args import FLAGS, BadNumber
from specops.errors import SpecopsError
from specops_host.contract import FIRST_STEP_S, Refused, Supervision
from specops_host.jobs import notify, records, watch
from specops_host import ckpt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- decisions ---------------------------------------------------------------------------------
def test_causes_back_off_and_the_restart_decision():
    assert watch.cause_of(-9) == "signal 9 (SIGKILL)" and watch.cause_of(137) == "exit 137 (SIGKILL)"
    assert watch.cause_of(1) == "exit 1" and watch.cause_of(-15) == "signal 15 (SIGTERM)"
    p = Supervision(restarts=3, backoff=30)
    assert [p.delay(n) for n in (1, 2, 3, 6)] == [30, 60, 120, 600]
    assert watch.decide(p, 0, ("exit 1", 33), None) == (True, "")
    assert watch.decide(p, 1, ("exit 1", 33), ("exit 1", 33)) == (False, "the same failure twice (exit 1 at step 33)")
    assert watch.decide(p, 1, ("exit 1", 34), ("exit 1", 33))[0]  # (another step: it got further)
    assert watch.decide(p, 3, ("exit 1", 40), ("exit 1", 33)) == (False, "no restart left (3 of 3 used)")
    assert watch.decide(Supervision(), 0, ("exit 1", 1), None) == (False, "restarts are off (--restarts 0)")


def test_progress_times_steps_and_sets_the_stall_limit(tmp_path):
    log = tmp_path / "output.log"
    log.write_bytes(b"")
    pr = watch.Progress(log, 0, now=0.0)
    p = Supervision()
    # (no step yet: a start is long, but one quiet for an hour, or --first-step-after, is a stall too)
    assert pr.limit(p) == FIRST_STEP_S == 3600 and pr.limit(Supervision(stall_after=45)) == 3600
    assert pr.limit(Supervision(stall_after=7200)) == 7200 and pr.limit(Supervision(first_step_after=90)) == 90
    for i, now in enumerate((10.0, 12.0, 14.0, 16.0)):
        pr.take(f"INFO train/loss=1.0, epoch=0,\n global_step={i}\n".encode(), now)
    assert pr.steps == 4 and pr.last_step == 3 and pr.median_step() == 2.0
    assert pr.limit(p) == watch.STALL_FLOOR_S  # (20 x 2 s < the floor)
    assert pr.limit(Supervision(stall_after=45)) == 45
    pr.take(b"\rTraining epoch 0 40%", 100.0)  # (a progress bar redrawn: alive)
    assert pr.quiet_for(101.0) == 1.0 and pr.steps == 4
    log.write_bytes(b"train/loss=2 global_step=7\ntrain/loss=2 glo")  # (a half-written line waits)
    pr2 = watch.Progress(log, 0)
    assert pr2.read() == 1 and pr2.last_step == 7 and pr2.pos == len(b"train/loss=2 global_step=7\n")


def test_status_detail_says_the_restart_the_back_off_and_the_stall():
    rec = {"state": "running", "restart": {"n": 1, "of": 3, "cause": "exit 137 (SIGKILL)", "step": 1210},
           "backoff_until": 130.0}
    assert records.looked_after(rec, now=100.0) == ["restart 1 of 3 in 30s: exit 137 (SIGKILL) at step 1,210"]
    rec.update(backoff_until=None, stall={"since": 40.0, "step": 1300})
    assert records.looked_after(rec, now=100.0) == ["restart 1 of 3: exit 137 (SIGKILL) at step 1,210",
                                                    "no training step for 60s (step 1,300); stacks in stacks/"]
    assert records.shown_state(rec)["state"] == "stalled" and rec["state"] == "running"
    ended = {"state": "failed", "restart": {"n": 2, "of": 3, "cause": "exit 1", "step": 5}, "gave_up": "the same "
             "failure twice (exit 1 at step 5)", "stall": {"since": 1.0}}
    assert records.looked_after(ended, now=9.0) == ["restart 2 of 3: exit 1 at step 5",
                                                    "restarts stopped: the same failure twice (exit 1 at step 5)"]
    assert records.shown_state(ended)["state"] == "failed"


# -- checkpoint markers ----------------------------------------------------------------------
def test_markers_tell_complete_from_incomplete_and_set_them_aside(tmp_path):
    ck = tmp_path / "checkpoints"
    for n in ("0", "1", "2"):
        (ck / n).mkdir(parents=True)
        (ck / n / "model.safetensors").write_bytes(b"x" * 100)
        (ck / n / "config.json").write_text("{}")
    ckpt.start_marking(ck)  # (a run from before markers: its checkpoints are taken as complete)
    assert ckpt.incomplete(ck) == [] and ckpt.latest_complete(ck) == "2"
    ckpt.unmark(ck / "2")  # (a save of 2 began and never finished)
    (ck / "1" / "model.safetensors").write_bytes(b"x" * 10)  # (1 truncated after its save)
    os.symlink("2", ck / "epoch2_end")
    os.symlink("1", ck / "checkpoint_best")
    bad = dict((p.name, why) for p, why in ckpt.incomplete(ck))
    assert bad == {"1": "model.safetensors is 10 bytes, 100 when saved",
                   "2": f"no {ckpt.MARKER} (its save did not finish)"}
    aside = ckpt.set_aside(ck, now=0)
    assert [(a, b.startswith("incomplete-"), why) for a, b, why in aside] == [
        ("1", True, bad["1"]), ("2", True, bad["2"])]
    assert sorted(p.name for p in ck.iterdir() if not p.name.startswith("incomplete-")) == ["0", ckpt.POLICY]
    assert ckpt.latest_complete(ck) == "0" and ckpt.incomplete(ck) == []
    # the laptop's view of a listing: the same verdict from names alone
    from specops.host.transfer.listings import Entry
    from specops.ops.watch import checkpoint_split

    def e(rel):
        return Entry(rel, 1, 0, 0o644, "f")
    listing = {r: e(r) for r in ("checkpoints/0/config.json", f"checkpoints/0/{ckpt.MARKER}", "checkpoints/1/config.json",
                                 "checkpoints/incomplete-2-x/config.json", f"checkpoints/{ckpt.POLICY}")}
    assert checkpoint_split(listing) == (["0"], ["1", "incomplete-2-x"])
    del listing[f"checkpoints/{ckpt.POLICY}"]  # (a run from before markers: every checkpoint counts)
    assert checkpoint_split(listing) == (["0", "1"], ["incomplete-2-x"])


# -- notifications ----------------------------------------------------------------------------
class Hook(http.server.BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):
        Hook.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):
        pass


def test_notify_posts_json_runs_a_command_and_reports_a_failure_in_one_line(tmp_path):
    srv = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}/hooks/SECRET"
        assert notify.send(url, "end", "done", "r1") is None
        assert Hook.got[-1] == {"text": "done"}
        assert notify.shown(url) == f"http://127.0.0.1:{srv.server_port}/..."  # (the path is the secret)
    finally:
        srv.shutdown()
    out = tmp_path / "said"
    assert notify.send(f"echo \"$SPECOPS_EVENT|$SPECOPS_RUN_ID|$SPECOPS_TEXT\" > {out}", "stall", "no step",
                       "r2") is None
    assert out.read_text() == "stall|r2|no step\n"
    why = notify.send("http://127.0.0.1:9/none", "end", "x", timeout=5)
    assert why and "\n" not in why and "refused" in why.lower()
    assert notify.send("exit 4", "end", "x") == "exit 4"
    assert notify.problem("ftp://x/y").startswith("ftp:// is not a webhook URL")
    assert notify.problem("a\nb") and notify.problem("") and notify.problem("https://") == "a URL without a host"


# -- the flags, hosts.yaml, the command inv train builds ----------------------------------------
def test_flags_and_hosts_fields_are_checked_before_anything_starts():
    assert FLAGS["restarts"].parse("0") == 0 and FLAGS["stall_after"].parse("600") == 600.0
    for name, bad in (("restarts", "-1"), ("restarts", "2.5"), ("restarts", "101"), ("stall_after", "0"),
                      ("backoff", "-1"), ("backoff", "soon")):
        with pytest.raises(BadNumber):
            FLAGS[name].parse(bad)
    from specops.ops import watch as ops_watch

    with pytest.raises(SpecopsError, match="--notify 'ftp://x': ftp:// is not a webhook URL"):
        ops_watch.check_flags(notify="ftp://x")
    with pytest.raises(SpecopsError, match="--restarts 0 allows no restart"):
        ops_watch.check_flags(restarts=0, restart_on_stall=True)
    with pytest.raises(SpecopsError, match="a group's training .* is not restarted"):
        ops_watch.group_flags(restarts=2)
    h = inventory.Host(name="g", address="g", profile="cuda")
    assert h.restarts_default == 3 and inventory.Host(name="c", transport="local", profile="cpu").restarts_default == 0
    assert inventory.Host(name="g", address="g", restarts=1, notify="https://hooks.example/x").restarts_default == 1
    with pytest.raises(Exception, match="not a webhook URL"):
        inventory.Host(name="g", address="g", notify="ftp://hooks.example/x")
    with pytest.raises(Exception, match="greater than or equal to 0"):
        inventory.Host(name="g", address="g", restarts=-1)


def test_inv_train_refuses_a_bad_notify_target_in_one_line():
    p = inv("train", "--host", "local", "--notify", "ftp://x", "--dry-run", timeout=120)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].endswith(
        "--notify 'ftp://x': ftp:// is not a webhook URL: give http:// or https://, or a command"), p.stderr
    p = inv("train", "--host", "local", "--restarts", "-2", timeout=120)
    assert p.returncode == 2 and "--restarts -2: give how many times a failed training restarts, 0 to 100" in p.stderr


# -- the real supervisor, on this machine -----------------------------------------------------
def without_py_spy(path: str) -> str:
    """PATH less the folders holding a py-spy: these tests show the stacks a supervisor writes where none is
    installed (faulthandler, /proc), as on CI; a machine with py-spy on PATH made them read py-spy's dump instead."""
    return os.pathsep.join(d for d in path.split(os.pathsep) if d and not os.path.exists(os.path.join(d, "py-spy")))


def job(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": REPO, "PATH": without_py_spy(os.environ.get("PATH", ""))}
    p = subprocess.run([sys.executable, "-m", "specops_host.jobs.job", *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    return p


def sup(**fields):
    """jobs/job.py start's --supervision: a Supervision's record, as the laptop sends it (ops/jobs.py start)."""
    return ["--supervision", json.dumps(Supervision(**fields).record())]


def wait_end(tmp_path, rid, timeout=30):
    t0 = time.time()
    while not (tmp_path / "runs" / rid / "exit_code").exists():
        assert time.time() - t0 < timeout, (tmp_path / "runs" / rid / "output.log").read_text()
        time.sleep(0.1)
    return int((tmp_path / "runs" / rid / "exit_code").read_text())


STEPS = ("import os, sys, time\nn = int(os.environ.get('SPECOPS_RESTART') or 0)\n"
         "for i in range(3):\n    print(f'train/loss=1.0, global_step={10 * n + i}', flush=True); time.sleep(0.1)\n")


def test_supervisor_restarts_then_stops_at_the_same_failure_and_records_each_restart(tmp_path):
    (tmp_path / "t.py").write_text("print('train/loss=1.0, global_step=5', flush=True); raise SystemExit(3)\n")
    job(tmp_path, "start", "--run-id", "r", "--kind", "train", *sup(restarts=3, backoff=0.1),
        "--", sys.executable, "t.py")
    assert wait_end(tmp_path, "r") == 3
    log = (tmp_path / "runs/r/output.log").read_text()
    assert "restart 1 of 3 in 0.1s: exit 3 at step 5" in log
    assert "restarts stopped: the same failure twice (exit 3 at step 5)" in log and log.count("start: ") == 2
    rec = json.loads((tmp_path / "runs/r/run.json").read_text())
    assert [(r["n"], r["cause"], r["step"]) for r in rec["restarts"]] == [(1, "exit 3", 5)]
    # the policy, carried whole in the job's record, as the laptop built it
    assert json.loads((tmp_path / "runs/r/job.json").read_text())["supervision"] == Supervision(
        restarts=3, backoff=0.1).record() == {"restarts": 3, "backoff": 0.1, "stall_after": None,
                                              "first_step_after": None, "restart_on_stall": False, "requeue": False}


def test_one_supervision_policy_its_rules_written_once(tmp_path):
    """contract.Supervision: the restart-on-stall rule and the Slurm rule in one place (the laptop's
    flags check, its builder and the host's reader all use it); the notification target, a secret,
    never in its record; a bad record given to the host's job script: one framed line, nothing started."""
    with pytest.raises(Refused, match="--restarts 0 allows no restart"):
        Supervision(restart_on_stall=True)
    with pytest.raises(Refused, match="--stall-after, --notify: a Slurm job is restarted by Slurm's requeue"):
        Supervision(restarts=2, stall_after=60, notify="https://x/y", requeue=True)
    s = Supervision.of({"restarts": 2, "backoff": 5}, notify="https://hooks.example/SECRET")
    assert s.notify and "notify" not in s.record() and Supervision.of(s.record()) == Supervision(restarts=2, backoff=5)
    assert Supervision.of(None) is None and [s.delay(n) for n in (1, 2, 8)] == [5, 10, 600]
    assert Supervision().first_step_limit() == FIRST_STEP_S and Supervision(stall_after=7200).first_step_limit() == 7200
    for bad in ({"restarts": "3"}, {"watch": {}}, {"restarts": 1, "notify": "x"}, [1], {"stall_after": -1}):
        with pytest.raises(Refused):
            Supervision.of(bad)
    p = subprocess.run([sys.executable, "-m", "specops_host.jobs.job", "start", "--run-id", "x", "--supervision",
                        "{not json", "--", "true"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--supervision '{not json': not JSON" in p.stdout, p.stdout
    assert not (tmp_path / "runs").exists()


def test_supervisor_finds_a_stall_writes_stacks_and_restarts_it(tmp_path):
    (tmp_path / "t.py").write_text(STEPS + "if not os.environ.get('SPECOPS_RESTART'):\n    time.sleep(600)\n")
    job(tmp_path, "start", "--run-id", "s", "--kind", "train",
        *sup(restarts=1, backoff=0.1, stall_after=1.5, restart_on_stall=True), "--", sys.executable, "t.py")
    assert wait_end(tmp_path, "s") == 0
    log = (tmp_path / "runs/s/output.log").read_text()
    assert "stalled: no training step for" in log and "(at step 2; limit 2s)" in log
    assert "restart 1 of 1 in 0.1s: stalled (no training step for" in log and "global_step=12" in log
    stacks = list((tmp_path / "runs/s/stacks").iterdir())
    assert stacks and "State:" in stacks[0].read_text()
    status = job(tmp_path, "status", "--run-id", "s").stdout
    assert '"state": "succeeded"' in status and "restart 1 of 1: stalled" in status


def test_a_start_that_hangs_before_its_first_step_is_a_stall_and_restarted(tmp_path):
    """--first-step-after S: an attempt that goes S seconds without a sign of life before its first
    step (a trainer hung in its start: NCCL init, a collective, a load) is stalled, its stacks
    written, and restarted with --restart-on-stall; the restarted one steps and ends."""
    (tmp_path / "t.py").write_text("import os, sys, time\nif not os.environ.get('SPECOPS_RESTART'):\n"
                                   "    time.sleep(600)\n" + STEPS.split("\n", 1)[1])
    job(tmp_path, "start", "--run-id", "f", "--kind", "train", *sup(restarts=1, backoff=0.1,
        first_step_after=1.5, restart_on_stall=True), "--", sys.executable, "t.py")
    assert wait_end(tmp_path, "f") == 0
    log = (tmp_path / "runs/f/output.log").read_text()
    assert "stalled: no training step for" in log and "(before any step; limit 2s)" in log, log
    assert "restart 1 of 1 in 0.1s: stalled (no training step for" in log and "global_step=12" in log, log
    assert list((tmp_path / "runs/f/stacks").iterdir())
    status = job(tmp_path, "status", "--run-id", "f").stdout
    assert '"state": "succeeded"' in status and "restart 1 of 1: stalled" in status and "before any step" in status


DEAF = ("import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('SIGTERM: saving a checkpoint first', flush=True))\n"
        "for i in range(10000):\n    print(f'train/loss={\"1.0\" if i < 3 else \"nan\"}, global_step={i}', flush=True)"
        "; time.sleep(0.05)\n")


@pytest.mark.parametrize("watch", [False, True], ids=["plain", "watched"])
def test_a_nan_run_that_does_not_heed_sigterm_gets_it_again_then_sigkill(tmp_path, watch):
    """The suite's NaN training (lr 2e9) once trained all its 200 epochs after the fail-on match: speculators'
    interruption, raised from its SIGTERM handler while a log line was printing, was swallowed by logging.
    Now: SIGTERM, again after the grace (speculators' sign to exit at once), SIGKILL after another: with or
    without the supervisor's watch."""
    (tmp_path / "t.py").write_text(DEAF)
    job(tmp_path, "start", "--run-id", "n", "--kind", "train", "--fail-on", "nonfinite-loss", "--fail-grace", "1",
        "--term", "child", *(sup() if watch else []), "--", sys.executable, "t.py")
    t0 = time.time()
    assert wait_end(tmp_path, "n", timeout=60) == 1
    assert time.time() - t0 < 30
    log = (tmp_path / "runs/n/output.log").read_text()
    assert "train/loss=nan in the log: stopping the command (it learns nothing)" in log, log
    assert log.count("SIGTERM: saving a checkpoint first") == 2, log
    assert "the command still runs 1s after its SIGTERM: SIGTERM again (a trainer's sign to exit at once)" in log
    assert "the command still runs 1s after a second SIGTERM: SIGKILL" in log
    assert "NonFiniteLossError: train/loss=nan in the log" in log.strip().splitlines()[-1]


def test_stop_during_the_back_off_ends_the_run_without_a_restart(tmp_path):
    (tmp_path / "t.py").write_text("raise SystemExit(5)\n")
    job(tmp_path, "start", "--run-id", "b", "--kind", "train", *sup(restarts=2, backoff=30),
        "--", sys.executable, "t.py")
    t0 = time.time()
    while "restart 1 of 2 in 30s" not in (tmp_path / "runs/b/output.log").read_text():
        assert time.time() - t0 < 20
        time.sleep(0.1)
    assert "restart 1 of 2 in " in job(tmp_path, "status", "--run-id", "b").stdout
    p = job(tmp_path, "stop", "--run-id", "b", "--grace", "10")
    assert p.returncode == 0 and time.time() - t0 < 15
    log = (tmp_path / "runs/b/output.log").read_text()
    assert "stopped during the back-off (`inv stop`): not restarted" in log and log.count("start: ") == 1
    assert '"state": "stopped"' in job(tmp_path, "status", "--run-id", "b").stdout


def test_stop_of_a_frozen_trainer_does_not_wait_for_the_grace(tmp_path):
    """A stalled trainer may be frozen (SIGSTOP): `stop` continues it after its SIGTERM, so it ends at
    once instead of at the SIGKILL after the grace."""
    (tmp_path / "t.py").write_text("import time\nprint('train/loss=1.0, global_step=0', flush=True)\ntime.sleep(600)\n")
    job(tmp_path, "start", "--run-id", "f", "--kind", "train", "--term", "child", *sup(), "--",
        sys.executable, "t.py")
    t0 = time.time()
    while "global_step=0" not in (tmp_path / "runs/f/output.log").read_text():
        assert time.time() - t0 < 20
        time.sleep(0.1)
    os.kill(json.loads((tmp_path / "runs/f/job.json").read_text())["child_pid"], signal.SIGSTOP)
    t0 = time.time()
    p = job(tmp_path, "stop", "--run-id", "f", "--grace", "30")
    assert p.returncode == 0 and time.time() - t0 < 15 and '"sigkill": false' in p.stdout, p.stdout


def test_evaluate_serves_only_complete_checkpoints(tmp_path):
    """The host's `inv evaluate` (serve/evaluate.py checkpoint_dir): an incomplete checkpoint is refused by
    name, and `best` falls back to the newest complete one when checkpoint_best points at an incomplete one."""
    from specops_host.contract import Refused
    from specops_host.serve.evaluate import checkpoint_dir

    ck = tmp_path / "checkpoints"
    for n in ("0", "1"):
        (ck / n).mkdir(parents=True)
        (ck / n / "config.json").write_text("{}")
    ckpt.start_marking(ck)
    ckpt.unmark(ck / "1")
    os.symlink("1", ck / "checkpoint_best")
    assert checkpoint_dir(tmp_path, "best") == (ck / "0").resolve()
    assert checkpoint_dir(tmp_path, "0") == (ck / "0").resolve()
    with pytest.raises(Refused, match=f"checkpoint 1 in {ck} is incomplete \\(no {ckpt.MARKER}"):
        checkpoint_dir(tmp_path, "1")


def test_a_hung_trainer_that_answers_sigusr2_leaves_its_python_stacks(tmp_path):
    """A trainer hung in Python (not frozen): train/hooked.py's faulthandler answers the supervisor's
    SIGUSR2 with every thread's stack (the stall is reported, not restarted: no --restart-on-stall)."""
    (tmp_path / "t.py").write_text(
        STEPS + "from specops_host.train import hooked\nhooked.stacks_on_signal()\n"
        + "def stuck_in_a_collective():\n    time.sleep(600)\nstuck_in_a_collective()\n")
    job(tmp_path, "start", "--run-id", "h", "--kind", "train", *sup(stall_after=1.5), "--",
        sys.executable, "t.py")
    t0 = time.time()
    while "not restarted (--restart-on-stall" not in (tmp_path / "runs/h/output.log").read_text():
        assert time.time() - t0 < 30, (tmp_path / "runs/h/output.log").read_text()
        time.sleep(0.2)
    assert '"state": "stalled"' in job(tmp_path, "status", "--run-id", "h").stdout
    pid = json.loads((tmp_path / "runs/h/job.json").read_text())["child_pid"]
    assert f"stacks: {pid} (faulthandler)" in (tmp_path / "runs/h/output.log").read_text()
    assert "in stuck_in_a_collective" in (tmp_path / f"runs/h/stacks/faulthandler-{pid}.txt").read_text()
    assert job(tmp_path, "stop", "--run-id", "h", "--grace", "10").returncode == 0
