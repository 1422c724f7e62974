"""Training as a detached job over the real sshd: outlives its SSH client, `logs -f`
re-attaches without losing a line, one training per host, `stop` leaves an interrupted
checkpoint and no process behind."""

import json
import re
import shlex
import os
import signal
import subprocess
import sys
import time

from conftest import REPO, cpu_train_config, inv, wait_for
from specops import inventory
from specops.ops import jobs
from specops.host.connection import connect


LONG = cpu_train_config(200)


def test_train_outlives_client_logs_reattach_lock_and_stop(pipeline_run, hosts_file, tmp_path, work):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(LONG)
    rid = "t-long-" + str(int(time.time()))
    h = inventory.load(str(hosts_file)).get("box")
    base = ["--host", "box", "--hosts", str(hosts_file)]
    # `inv train --follow` as a user runs it; then its SSH client dies (SIGKILL) mid-run.
    # (--no-serve-check: this draft (256 tokens) would be served first, a minute and more before the
    # first step on 2 cores; the preflight has its own tests: test_serve_check.py)
    p = subprocess.Popen([sys.executable, "-m", "invoke", "train", *base, "--config", str(cfg), "--run-id", rid,
                          "--dataset", "pipe", "--follow", "--no-serve-check"], cwd=REPO, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with connect(h) as t:
        log = jobs.run_path(t, rid, "output.log")
        wait_for(lambda: b"train/loss=" in (t.read_bytes(log) or b""), 240, "the first training step")
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        time.sleep(2)
        assert jobs.status(t, rid)[0].state == "running"
        steps_before = (t.read_bytes(log) or b"").count(b"train/loss=")

        # one training per host
        r = inv("train", *base, "--config", str(cfg), "--dataset", "pipe", "--run-id", rid + "-2")
        assert r.returncode != 0 and f"held by run '{rid}'" in r.stderr
        assert f"draft-serves preflight: not run while {rid} trains on box" in r.stdout, r.stdout[-2000:]
        assert not t.exists(jobs.run_path(t, rid + "-2"), "-d"), "a refused start left a run folder"
        # the same run id while it runs: refused before its spec is rewritten; the hint repeats --hosts
        spec = t.read_bytes(jobs.run_path(t, rid, "train-spec.json"))
        r = inv("train", *base, "--config", str(cfg), "--dataset", "pipe", "--run-id", rid, "--epochs", "1")
        assert r.returncode != 0 and "already running" in r.stderr and f"--hosts {hosts_file}" in r.stderr, r.stderr
        assert t.read_bytes(jobs.run_path(t, rid, "train-spec.json")) == spec

        # logs -f re-attaches from the start and follows until the job ends (we stop it meanwhile)
        follower = subprocess.Popen([sys.executable, "-m", "invoke", "logs", *base, "--run-id", rid, "-f"],
                                    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_for(lambda: (t.read_bytes(log) or b"").count(b"train/loss=") > steps_before + 2, 120, "more steps")
        r = inv("stop", *base, "--run-id", rid, "--grace", "120")
        assert r.returncode == 0, r.stderr
        assert f"stop {rid}: " in r.stdout
        out, _ = follower.communicate(timeout=60)
        full = t.read_bytes(log)
        assert out == full, "logs -f lost or changed bytes"
        ckpt = jobs.run_path(t, rid, "checkpoints", "interrupted")
        assert t.exists(f"{ckpt}/model.safetensors", "-f"), "no interrupted checkpoint"
        j = jobs.status(t, rid)[0]
        assert j.state in ("succeeded", "stopped"), j.describe
        ps = t.run("ps -eo pgid=,stat=").stdout.split("\n")
        assert not [ln for ln in ps if ln.split() and ln.split()[0] == str(j.pgid) and "Z" not in ln.split()[1]]
        assert b"interrupting training to save checkpoint" in full or b"interrupted" in full

        # the same run id resumes from its latest checkpoint
        rec = json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))
        assert rec["run_id"] == rid and len(rec["starts"]) == 1


def test_a_followed_train_stopped_says_stopped_and_its_resume_follows_only_its_own_start(pipeline_run, hosts_file,
                                                                                            tmp_path):
    """issue 46 item 7: `inv train --follow` whose run `inv stop` ends said `finished (exit 0)` (the trainer
    exits 0 on SIGTERM): it says `stopped`, as `inv status` does; the resume's follower (-v: the log byte for
    byte) showed the first start's `new run` before `resuming from checkpoint`: it follows its own start only."""
    cfg = tmp_path / "long.yaml"
    cfg.write_text(LONG)
    rid = "t-stopped-" + str(int(time.time()))
    h = inventory.load(str(hosts_file)).get("box")
    base = ["--host", "box", "--hosts", str(hosts_file)]
    argv = [sys.executable, "-m", "invoke", "train", *base, "--config", str(cfg), "--run-id", rid, "--dataset", "pipe",
            "--follow", "--no-serve-check", "-v"]
    with connect(h) as t:
        log = jobs.run_path(t, rid, "output.log")
        for n in (1, 2):
            # (this start's own first step: the log is appended, the first start's steps are in it)
            before = (t.read_bytes(log) or b"").count(b"train/loss=")
            p = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            wait_for(lambda b=before: (t.read_bytes(log) or b"").count(b"train/loss=") > b, 240,
                     f"start {n}'s first step")
            r = inv("stop", *base, "--run-id", rid, "--grace", "120")
            assert r.returncode == 0, r.stderr
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out[-3000:]
            assert f"train {rid} on box: stopped" in out and "finished (exit" not in out, out[-3000:]
            assert jobs.status(t, rid)[0].state == "stopped"
            # its own start's first line, once: a follower from byte 0 showed the first start's too (the
            # second start resumes if the first saved a checkpoint before its stop, else it is a new run again)
            heads = out.count(f"train {rid}: new run") + out.count(f"train {rid}: resuming from checkpoint")
            assert heads == 1, out[-3000:]
            if n == 1:  # (-v streams the log byte for byte; text mode reads a progress bar's \r as \n)
                shown = (t.read_bytes(log) or b"").decode().replace("\r\n", "\n").replace("\r", "\n")
                assert shown.count("train/loss=") >= 1 and shown in out, out[-3000:]
            if n == 2:
                assert out.count("train/loss=") < (t.read_bytes(log) or b"").count(b"train/loss="), out[-3000:]
                # (the first stop's checkpoints/interrupted: said not resumed, speculators resumes complete epochs)
                assert "; checkpoints/interrupted (the stop's mid-epoch save) is not resumed: speculators resumes " \
                       "complete epochs only" in " ".join(out.split()), out[-3000:]


def test_train_follow_is_quiet(pipeline_run, hosts_file):
    """`inv train --follow` (the real trainer): its figures (step, loss, accuracy per draft position,
    tokens/s; each epoch's validation), not its per-step INFO panels, which stay whole in the run's
    output.log. (`-v` streams that log byte for byte: the stopped run's first start above shows it, one training
    fewer.)"""
    h = inventory.load(str(hosts_file)).get("box")
    base = ["--host", "box", "--hosts", str(hosts_file), "--dataset", "pipe", "--config", "configs/demo.yaml",
            "--epochs", "1", "--follow", "--no-serve-check"]
    rid = "t-quiet-" + str(int(time.time()))
    r = inv("train", *base, "--run-id", rid)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    with connect(h) as t:
        log = t.read_bytes(jobs.run_path(t, rid, "output.log")).decode()
    assert log.count("train/loss=") >= 2 and "train/loss=" not in r.stdout, r.stdout[-3000:]
    assert re.search(r"^\[train\] step 0, epoch 1/1: loss [\d.]+, accuracy by position [\d.]+ [\d.]+ [\d.]+, "
                     r"[\d,]+ tokens/s$", r.stdout, re.M), r.stdout[-3000:]
    assert re.search(r"^\[train\] validation after epoch 1/1: loss [\d.]+, accuracy by position [\d. ]+$",
                     r.stdout, re.M), r.stdout[-3000:]
    assert f"train {rid} on box: finished (exit 0)" in r.stdout and len(r.stdout.splitlines()) <= 12, r.stdout


def test_train_failing_at_start_shows_the_traceback_tail(pipeline_run, hosts_file, tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(LONG.replace("speculator-type: eagle3", "speculator-type: no-such-draft"))
    r = inv("train", "--host", "box", "--hosts", str(hosts_file), "--config", str(cfg), "--dataset", "pipe",
            "--follow", "--run-id", "t-broken-" + str(int(time.time())))
    assert r.returncode != 0
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith("specops: train t-broken-") and "failed (exit" in first
    assert "no-such-draft" in first  # the error the trainer died of, on the first line
    assert "no-such-draft" in r.stderr  # and the tail of its log
    # (the preflight serves specops' draft kinds: it says it skips another type, the trainer then refuses it)
    assert "draft-serves preflight: skipped: speculator-type no-such-draft: the preflight serves eagle3, peagle, " \
           "dflash drafts only" in " ".join(r.stdout.split()), r.stdout[-2000:]


def test_train_dry_run_starts_nothing(pipeline_run, hosts_file):
    r = inv("train", "--host", "box", "--hosts", str(hosts_file), "--dataset", "pipe", "--config",
            "configs/demo.yaml", "--run-id", "t-dry", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "-m specops_host.jobs.job start --run-id t-dry --kind train" in r.stdout and "nothing was changed" in r.stdout
    assert "draft-serves preflight: would serve" in " ".join(r.stdout.split()), r.stdout[-2000:]  # (planned, not run)
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        assert not t.exists(jobs.run_path(t, "t-dry"))


def test_train_several_processes_on_a_cpu_host_is_refused(pipeline_run, hosts_file):
    r = inv("train", "--host", "box", "--hosts", str(hosts_file), "--dataset", "pipe", "--nproc", "2",
            "--config", "configs/demo.yaml", "--run-id", "t-cpu-nproc2")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[0].startswith(
        "specops: train on box: a cpu host trains in one process (1 node(s) x 2 process(es) asked)"), r.stderr
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        assert not t.exists(jobs.run_path(t, "t-cpu-nproc2"))


def test_prepare_data_dry_run_with_a_laptop_file(verifier, hosts_file, tmp_path):
    """The laptop file a real run would upload is not on the host during a dry run: the plan
    allows for it, and the dry run shows the upload and the job, creating nothing."""
    rows = tmp_path / "dry-rows.jsonl"
    rows.write_text('{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n')
    r = inv("prepare-data", "--host", "box", "--hosts", str(hosts_file), "--data", str(rows), "--dataset",
            "dry-ds", "--verifier", verifier, "--seq-length", "512", "--dry-run")  # (the tiny verifier holds 2048
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]               # positions: the default is refused)
    assert f"put: {rows} -> box:" in r.stdout and "-dry-rows.jsonl" in r.stdout
    assert "-m specops_host.jobs.job start" in r.stdout and "nothing was changed" in r.stdout
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        wd = t.expand(t.host.workdir_path)
        assert not t.run(f"ls {wd}/uploads/ 2>/dev/null | grep dry-rows").stdout and not t.exists(f"{wd}/data/dry-ds")


TRAP = """import signal, sys, time
from pathlib import Path
def save(*_):
    time.sleep(1)  # a checkpoint being written
    Path(sys.argv[1]).write_text("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("rank ready", flush=True)
time.sleep(300)
"""


def test_stop_under_torchrun_signals_the_ranks_once(cpu_box, hosts_file, work, tmp_path):
    """Under torchrun, `stop` signals the ranks (torchrun's children), so a rank's SIGTERM
    handler can finish its checkpoint before torchrun tears anything down."""
    h = inventory.load(str(hosts_file)).get("box")
    rid = "t-torchrun-" + str(int(time.time()))
    script = tmp_path / "trap.py"
    script.write_text(TRAP)
    with connect(h) as t:
        t.put(str(script), f"{work}/trap.py")
        marker = f"{work}/trap-saved-{rid}"
        jobs.start(t, rid, [f"{cpu_box['venv']}/bin/python3", "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", "1", f"{work}/trap.py", marker], kind="train", term="child")
        log = jobs.run_path(t, rid, "output.log")
        wait_for(lambda: b"rank ready" in (t.read_bytes(log) or b""), 120, "the rank")
        res = jobs.stop(t, rid, grace=60)
        assert not res.sigkill
        assert t.run(f"cat {marker}").stdout == "saved"


STUBBORN = """import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"rank pid {os.getpid()} sid {os.getsid(0)}", flush=True)
time.sleep(600)
"""


def start_stubborn_rank(t, cpu_box, work, tmp_path, rid):
    """torchrun with one rank that ignores SIGTERM; returns (rank pid, rank session, job record)."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    t.put(str(script), f"{work}/stubborn.py")
    rec = jobs.start(t, rid, [f"{cpu_box['venv']}/bin/python3", "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node", "1", f"{work}/stubborn.py"], kind="train", term="child")
    log = jobs.run_path(t, rid, "output.log")
    wait_for(lambda: b"rank pid" in (t.read_bytes(log) or b""), 120, "the rank")
    m = re.search(rb"rank pid (\d+) sid (\d+)", t.read_bytes(log))
    return int(m.group(1)), int(m.group(2)), rec


def alive(t, pid):
    return t.run(f"test -d /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status").ok


def test_stop_reaches_ranks_in_their_own_sessions(cpu_box, hosts_file, work, tmp_path):
    """torchrun starts each rank in a session of its own, outside the job's process group: a rank
    that ignores SIGTERM still gets SIGKILL after the grace period (found by the job's tag)."""
    h = inventory.load(str(hosts_file)).get("box")
    rid = "t-stubborn-" + str(int(time.time()))
    with connect(h) as t:
        pid, sid, rec = start_stubborn_rank(t, cpu_box, work, tmp_path, rid)
        assert sid != rec.pgid  # (what makes a process-group kill miss it)
        res = jobs.stop(t, rid, grace=3)
        assert res.sigkill and res.state == "stopped", res
        assert not alive(t, pid)


def test_ranks_orphaned_by_a_killed_torchrun_are_ended(cpu_box, hosts_file, work, tmp_path):
    """torchrun SIGKILLed (e.g. by the OOM killer): its rank lives on, reparented, in its own
    session; the supervisor ends it, and says so in the log."""
    h = inventory.load(str(hosts_file)).get("box")
    rid = "t-orphan-" + str(int(time.time()))
    with connect(h) as t:
        pid, _, _ = start_stubborn_rank(t, cpu_box, work, tmp_path, rid)
        child = json.loads(t.read_bytes(jobs.run_path(t, rid, "job.json")))["child_pid"]
        t.check(f"kill -9 {child}", "killing torchrun")
        wait_for(lambda: jobs.status(t, rid)[0].ended, 60, "the job's end")
        assert jobs.status(t, rid)[0].describe == "killed (signal 9)"
        assert not alive(t, pid)
        log = t.read_bytes(jobs.run_path(t, rid, "output.log")).decode()
        assert f"the command left 1 process(es) running (pids {pid}): ending them" in log, log[-1500:]


#: what vLLM's engines do: rename themselves with setproctitle (here the host venv's own, vLLM's
#: dependency), then run on
RENAME = ("import setproctitle, time\n"
          "setproctitle.setproctitle('VLLM::EngineCore')\n"
          "time.sleep(300)\n")


def test_a_renamed_process_of_a_job_keeps_its_tag_and_is_stopped(cpu_box, hosts_file):
    """The job starts its command with SPT_NOENV: a process renamed by the real setproctitle (as
    vLLM's engines are) keeps the tag readable in /proc/PID/environ. Once the job's supervisor and
    command are SIGKILLed, that process alone keeps the job running, and stop ends it. (Here, not in
    test_tagged.py beside its kin: it needs the cpu venv, which makes a file heavy; test_tagged.py runs on
    the light lane.)"""
    hf = str(hosts_file)
    rid = jobs.new_run_id("t") + "-renamed"
    h = inventory.load(hf).get("box")
    with connect(h) as t:
        py = t.expand("~/ml-env/bin/python3")
        jobs.start(t, rid, ["sh", "-c", f"{shlex.quote(py)} -c {shlex.quote(RENAME)} & sleep 300"], kind="test")
        rec = wait_for(lambda: (r := json.loads(t.read_bytes(jobs.run_path(t, rid, "job.json")))).get("child_pid")
                       and r, 30, "the command's pid recorded")
        engine = wait_for(lambda: [p for p in t.run(f"pgrep -g {rec['pgid']} -f EngineCore").stdout.split()
                                   if t.run(f"tr '\\000' ' ' < /proc/{p}/cmdline").stdout.startswith("VLLM::")],
                          60, "the renamed member")[0]
        env = t.check(f"tr '\\000' '\\n' < /proc/{engine}/environ", "its environment").stdout.splitlines()
        assert f"SPECOPS_JOB={rec['tag']}" in env and "SPT_NOENV=1" in env, env
        t.check(f"kill -9 {rec['pid']} {rec['child_pid']}", "the supervisor and command die")
        time.sleep(0.5)
        try:
            row = next(j for j in jobs.status(t, rid))
            assert row.state == "running", row
            r = inv("stop", "--host", "box", "--hosts", hf, "--run-id", rid, "--grace", "3")
            assert r.returncode == 0, r.stdout + r.stderr
            assert not alive(t, int(engine))
        finally:
            t.run(f"kill {engine}")
