"""Slurm clusters against a real Slurm (tests/slurmrig.py: munged, slurmctld, two slurmd on
loopback), the login node reached through the real sshd: `inv check` through srun, refusals
before anything is queued, and a training submitted, followed, stopped (interrupted checkpoint)
and fetched; a failing job reports its exit code."""

import json
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO, inv, wait_for
from rig import Rig, free_port
from slurmrig import PARTITION, SlurmRig, have_slurm
from specops import inventory
from specops.host.connection import connect
from specops.ops import jobs
from specops.slurm import queue
from test_train import LONG  # (the long CPU training of the SSH host's tests)


@pytest.fixture(scope="session")
def slurm(rig):
    assert have_slurm(), "Slurm is not installed (slurmctld, slurmd, munged, sbatch): `bash .ci/system-deps` installs it"
    s = SlurmRig(rig.user).start()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def login(slurm):
    """The cluster's login node: an sshd whose login environment carries SLURM_CONF, as a cluster's does."""
    r = Rig(env={"SLURM_CONF": str(slurm.conf)}).start()
    yield r
    r.stop()


def cluster_host(login, rig, work, **slurm_fields):
    return login.host(venv=f"{rig.home}/ml-env", workdir=str(work), scheduler="slurm",
                      slurm={"partition": PARTITION, "time": "00:20:00", **slurm_fields})


@pytest.fixture(scope="session")
def cluster_hosts(login, rig, work, slurm):
    return login.write_hosts(login.root / "hosts.yaml", {
        "cluster": cluster_host(login, rig, work),
        "cluster-nopart": cluster_host(login, rig, work, partition="gpu-huge"),
        "cluster-wide": cluster_host(login, rig, work, nodes=3),
        "cluster-gpus": cluster_host(login, rig, work, gpus_per_node=4),
        "cluster-long": cluster_host(login, rig, work, time="02:00:00"),
        "cluster-feature": cluster_host(login, rig, work, constraint="nosuchfeature"),
        "cluster-unshared": {**cluster_host(login, rig, work), "workdir": f"{rig.home}/specops-unshared"},
        "cluster-pair": {**cluster_host(login, rig, work, nodes=2), "env": {"GLOO_SOCKET_IFNAME": "lo"}},
        "cluster-local": {**cluster_host(login, rig, work), "workdir": str(slurm.node_local)},
        "cluster-gpu1": cluster_host(login, rig, work, gpus_per_node=1),
        "cluster-gpu2": cluster_host(login, rig, work, gpus_per_node=2),
    })


def queued(slurm) -> list:
    return slurm.queue()


@pytest.mark.parametrize("name, expect", [
    ("cluster-nopart", "unknown partition 'gpu-huge' (slurm.partition in hosts.yaml); the cluster's partitions: "
                       "debug (nothing was submitted)"),
    ("cluster-wide", "3 nodes asked; partition debug has 2: ask for at most 2 (--nodes or slurm.nodes) "
                     "(nothing was submitted)"),
    ("cluster-gpus", "4 GPUs per node asked; partition debug's nodes have at most 2"),
    ("cluster-long", "time limit 02:00:00 asked; partition debug allows at most 00:30:00"),
    ("cluster-unshared", "workdir"),
])
def test_bad_request_one_line_nothing_queued(slurm, cluster_hosts, name, expect):
    before = queued(slurm)
    r = inv("train", "--host", name, "--hosts", str(cluster_hosts), "--dataset", "pipe", "--run-id", "s-refused")
    assert r.returncode != 0
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith("specops: train on ") and expect in first, r.stderr
    assert queued(slurm) == before
    if name == "cluster-unshared":
        assert "is not known to be shared with the compute nodes: run `inv check" in first, first


def test_nodes_flag_over_the_partition(slurm, cluster_hosts):
    r = inv("train", "--host", "cluster", "--hosts", str(cluster_hosts), "--nodes", "5", "--run-id", "s-five")
    assert r.returncode != 0 and "5 nodes asked; partition debug has 2" in r.stderr, r.stderr


def test_queue_parses_a_real_pending_job(slurm):
    """scontrol's own output for a held job and a finished one, through the parser."""
    jid = slurm.cmd("sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true").stdout.strip()
    try:
        j = queue.jobs(slurm.cmd("scontrol", "-o", "show", "job", jid).stdout)[jid]
        assert j.job_state == "pending" and j.reason == "JobHeldUser" and not j.nodes
        assert j.describe() == f"Slurm job {jid} PENDING (JobHeldUser)"
    finally:
        slurm.cmd("scancel", jid)
    jid = slurm.cmd("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "exit 3").stdout.strip()
    j = wait_for(lambda: (lambda x: x if x.job_state.terminal else None)(
        queue.jobs(slurm.cmd("scontrol", "-o", "show", "job", jid).stdout)[jid]), 60, "the failing job's end")
    assert (j.state, j.exit_code, j.job_state) == ("FAILED", 3, "failed") and j.describe().startswith(
        f"Slurm job {jid} FAILED, exit 3")
    rec = queue.records(slurm.cmd("scontrol", "-o", "show", "partition").stdout)
    nodes = queue.sinfo_nodes(slurm.cmd("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N|%G|%T").stdout)
    p = queue.Partition.of(rec[0], nodes)
    assert (p.name, p.total_nodes, p.gpus_per_node, p.max_time_s) == (PARTITION, 2, 2, 1800)


@pytest.fixture(scope="session")
def cluster_checked(slurm, cluster_hosts, cpu_box):
    r = inv("check", "--host", "cluster", "--hosts", str(cluster_hosts), "--min-free-gb", "1")
    return r


def test_check_runs_on_a_compute_node_and_shows_the_partition(slurm, cluster_checked):
    r = cluster_checked
    out = " ".join(r.stdout.split())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "slurm partition" in out and "debug: UP, 2 node(s)" in out and "2 GPU(s) per node" in out, out[-3000:]
    assert "shared workdir" in out and "seen by the 1 node(s) of an allocation" in out
    # the preflight ran as a job step on a compute node (Slurm's record of it), not on the login node
    shown = queue.records(slurm.cmd("scontrol", "-o", "show", "job").stdout)
    assert any(j.get("JobName") == "sh" and j.get("NodeList", "").startswith("node") for j in shown), shown


def test_a_workdir_the_nodes_do_not_share_is_found_and_refused(slurm, cluster_hosts):
    """cluster-local's workdir is a folder the compute nodes cover with a tmpfs of their own."""
    base = ["--host", "cluster-local", "--hosts", str(cluster_hosts)]
    r = inv("check", *base, "--min-free-gb", "1")
    out = " ".join(r.stdout.split())
    assert r.returncode != 0 and "shared workdir" in out and f"do not see {slurm.node_local}/.specops/slurm-probe" \
        in out, r.stdout[-2000:] + r.stderr[-2000:]
    before = queued(slurm)
    r = inv("train", *base, "--dataset", "pipe", "--run-id", "s-local")
    first = r.stderr.strip().splitlines()[0]
    assert r.returncode != 0 and first.startswith(
        f"specops: train on cluster-local: workdir {slurm.node_local} is not shared with the compute nodes "
        f"(compute node(s) ") and "put `workdir:` and `venv:` on the cluster's shared filesystem" in first, r.stderr
    assert queued(slurm) == before


def test_train_submitted_followed_stopped_fetched(slurm, cluster_hosts, cluster_checked, pipeline_run, tmp_path):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(LONG)
    rid = "s-long-" + str(int(time.time()))
    base = ["--host", "cluster", "--hosts", str(cluster_hosts)]
    # --dry-run: the script and the command, nothing queued or written
    before = queued(slurm)
    r = inv("train", *base, "--config", str(cfg), "--dataset", "pipe", "--run-id", rid, "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "#SBATCH --partition=debug" in r.stdout and "#SBATCH --time=00:20:00" in r.stdout, r.stdout[-3000:]
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c" in r.stdout
    assert "-m specops_host.train.run --spec" in r.stdout and "sbatch --parsable" in r.stdout
    assert queued(slurm) == before
    h = inventory.load(str(cluster_hosts)).get("cluster")
    with connect(h) as t:
        assert not t.exists(jobs.run_path(t, rid))

    r = inv("train", *base, "--config", str(cfg), "--dataset", "pipe", "--run-id", rid)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    with connect(h) as t:
        rec = json.loads(t.read_bytes(jobs.run_path(t, rid, "slurm.json")))
        jid = rec["job_ids"][-1]
        assert f"submitted as Slurm job {jid}" in " ".join(r.stdout.split()), r.stdout[-2000:]
        log = jobs.run_path(t, rid, "output.log")
        wait_for(lambda: b"train/loss=" in (t.read_bytes(log) or b""), 300, "the first training step")
        st = inv("status", *base, "--run-id", rid, "--json")
        assert st.returncode == 0, st.stderr
        row = json.loads(st.stdout)[0]
        assert row["state"] == "running" and row["slurm_job_id"] == jid and row["nodes"].startswith("node"), row
        assert f"Slurm job {jid} RUNNING on node" in row["detail"]
        # the same run id while it runs: refused
        r2 = inv("train", *base, "--config", str(cfg), "--dataset", "pipe", "--run-id", rid)
        assert r2.returncode != 0 and f"already running on cluster (Slurm job {jid})" in r2.stderr, r2.stderr

        follower = subprocess.Popen([sys.executable, "-m", "invoke", "logs", *base, "--run-id", rid, "-f"],
                                    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        steps = (t.read_bytes(log) or b"").count(b"train/loss=")
        wait_for(lambda: (t.read_bytes(log) or b"").count(b"train/loss=") > steps + 1, 180, "more steps")
        r = inv("stop", *base, "--run-id", rid, "--grace", "120")
        assert r.returncode == 0, r.stderr
        assert f"stop {rid}: stopped" in r.stdout, r.stdout
        out, _ = follower.communicate(timeout=120)
        full = t.read_bytes(log)
        assert out == full, "logs -f lost or changed bytes"
        ckpt = jobs.run_path(t, rid, "checkpoints", "interrupted")
        assert t.exists(f"{ckpt}/model.safetensors", "-f"), "no interrupted checkpoint: " + full.decode(
            errors="replace")[-4000:]
        j = jobs.status(t, rid)[0]
        assert j.state == "stopped" and f"Slurm job {jid}" in j.detail, j.describe
        assert jid not in queued(slurm)
        run = json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))
        assert run["slurm_job_ids"] == [jid] and run["run_id"] == rid

    dest = tmp_path / "runs"
    r = inv("fetch", *base, "--run-id", rid, "--dest", str(dest))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads((dest / rid / "run.json").read_text())["slurm_job_ids"] == [jid]
    assert (dest / rid / "checkpoints" / "interrupted" / "model.safetensors").is_file()
    assert "#SBATCH --job-name=specops-" + rid in (dest / rid / "slurm-job.sh").read_text()

    # the same run id again: a new job of the same run (its record keeps both job ids)
    r = inv("train", *base, "--config", str(cfg), "--dataset", "pipe", "--run-id", rid, "--max-steps", "1",
            "--follow")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    with connect(h) as t:
        ids = json.loads(t.read_bytes(jobs.run_path(t, rid, "slurm.json")))["job_ids"]
        assert len(ids) == 2 and ids[0] == jid and ids[1] != jid, ids
        assert json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))["slurm_job_ids"] == ids
        j = jobs.status(t, rid)[0]
        assert j.state == "succeeded" and j.slurm_job_id == ids[1] and f"Slurm job {ids[1]} COMPLETED, exit 0" \
            in j.detail, j.describe


def test_a_requeued_training_resumes_and_says_its_restart(slurm, cluster_hosts, cluster_checked, pipeline_run,
                                                          tmp_path):
    """`inv train --restarts 1` on a Slurm host: `#SBATCH --requeue`; the job requeued mid-training
    (`scontrol requeue`, as a preemption or a node failure) starts again, its batch shell records the
    restart (run.json `restarts`, cause and step), the trainer resumes from its last checkpoint and
    the run ends succeeded with every epoch; `inv status` says `restart 1 of 1: requeued by Slurm`."""
    from conftest import cpu_train_config

    cfg = tmp_path / "two.yaml"
    cfg.write_text(cpu_train_config(2))
    rid = "s-requeue-" + str(int(time.time()))
    base = ["--host", "cluster", "--hosts", str(cluster_hosts)]
    r = inv("train", *base, "--config", str(cfg), "--dataset", "pipe", "--run-id", rid, "--restarts", "1",
            "--no-serve-check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "restarts: up to 1, by Slurm's requeue" in r.stdout, r.stdout[-2000:]
    h = inventory.load(str(cluster_hosts)).get("cluster")
    with connect(h) as t:
        jid = json.loads(t.read_bytes(jobs.run_path(t, rid, "slurm.json")))["job_ids"][-1]
        assert "#SBATCH --requeue" in (t.read_bytes(jobs.run_path(t, rid, "slurm-job.sh")) or b"").decode()
        log = jobs.run_path(t, rid, "output.log")
        done0 = jobs.run_path(t, rid, "checkpoints", "0", "specops-complete.json")
        wait_for(lambda: t.exists(done0, "-f"), 300, "checkpoint 0 marked complete")
        slurm.cmd("scontrol", "requeue", jid)
        wait_for(lambda: b"restart 1 of 1: requeued by Slurm" in (t.read_bytes(log) or b""), 240, "the requeued start")
        wait_for(lambda: jobs.status(t, rid)[0].ended, 400, "the run's end")
        j = jobs.status(t, rid)[0]
        assert j.state == "succeeded" and j.slurm_job_id == jid, j.describe + jobs.tail(t, rid, 30)
        assert re.search(r"restart 1 of 1: requeued by Slurm (at step \d+|before any step)", j.describe), j.describe
        run = json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))
        assert [x["cause"] for x in run["restarts"]] == ["requeued by Slurm"], run["restarts"]
        assert [s.get("restart") for s in run["starts"]] == [None, 1], run["starts"]
        text = (t.read_bytes(log) or b"").decode(errors="replace")
        assert "resuming from checkpoint" in text.split("restart 1 of 1: requeued by Slurm", 1)[1], text[-3000:]
        assert t.exists(jobs.run_path(t, rid, "checkpoints", "1", "model.safetensors"), "-f"), "no final checkpoint"


def test_pending_job_shows_slurms_reason_and_stops(slurm, cluster_hosts, cluster_checked, pipeline_run, tmp_path):
    """Both nodes held by other jobs: the run waits in the queue with Slurm's reason; stop cancels it."""
    blockers = [slurm.cmd("sbatch", "--parsable", "--exclusive", "-w", n, "-o", "/dev/null", "--wrap", "sleep 300")
                .stdout.strip() for n in ("node1", "node2")]
    rid = "s-pending-" + str(int(time.time()))
    base = ["--host", "cluster", "--hosts", str(cluster_hosts)]
    try:
        wait_for(lambda: all(queue.jobs(slurm.cmd("scontrol", "-o", "show", "job", b).stdout)[b].state == "RUNNING"
                             for b in blockers), 60, "the blocking jobs to run")
        r = inv("train", *base, "--config", "configs/demo.yaml", "--dataset", "pipe", "--run-id", rid)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        st = inv("status", *base, "--run-id", rid, "--json")
        row = json.loads(st.stdout)[0]
        assert row["state"] == "pending" and row["reason"] in ("Resources", "Priority"), row
        assert f"Slurm job {row['slurm_job_id']} PENDING ({row['reason']})" == row["detail"]
        table = inv("status", *base)
        assert rid in table.stdout and "pending (Slurm job" in " ".join(table.stdout.split()), table.stdout
        r = inv("stop", *base, "--run-id", rid)
        assert r.returncode == 0 and f"stop {rid}: stopped" in r.stdout, r.stdout + r.stderr
        assert row["slurm_job_id"] not in queued(slurm)
    finally:
        for b in blockers:
            slurm.cmd("scancel", b)


def test_failing_job_reports_its_exit_code(slurm, cluster_hosts, cluster_checked, pipeline_run, tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(LONG.replace("speculator-type: eagle3", "speculator-type: no-such-draft"))
    rid = "s-broken-" + str(int(time.time()))
    r = inv("train", "--host", "cluster", "--hosts", str(cluster_hosts), "--config", str(cfg), "--dataset", "pipe",
            "--follow", "--run-id", rid)
    assert r.returncode != 0
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith(f"specops: train {rid} on cluster failed (Slurm job ") and "FAILED, exit " in first, first
    assert "no-such-draft" in first, first
    st = inv("status", "--host", "cluster", "--hosts", str(cluster_hosts), "--run-id", rid)
    assert "failed" in st.stdout and "FAILED, exit" in " ".join(st.stdout.split()), st.stdout


def test_slurm_refuses_an_unknown_feature_nothing_queued(slurm, cluster_hosts, cluster_checked, pipeline_run):
    before = queued(slurm)
    r = inv("train", "--host", "cluster-feature", "--hosts", str(cluster_hosts), "--dataset", "pipe",
            "--config", "configs/demo.yaml", "--run-id", "s-feature")
    assert r.returncode != 0
    first = r.stderr.strip().splitlines()[0]
    assert "Slurm refuses the job: " in first and "(nothing was submitted)" in first, r.stderr
    assert queued(slurm) == before


def test_online_and_nodes_where_they_do_not_apply(slurm, cluster_hosts):
    r = inv("train", "--host", "cluster-pair", "--hosts", str(cluster_hosts), "--hidden-states", "online",
            "--run-id", "s-on")
    first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
    assert r.returncode != 0 and first.startswith("specops: --hidden-states online on cluster-pair: the vLLM server "
                                                  "and the trainer share one node's allocation; 2 nodes asked: give "
                                                  "--nodes 1, or `inv extract") \
        and first.endswith("first and train offline (nothing was submitted)"), r.stderr
    r = inv("train", "--host", "local", "--nodes", "2", "--run-id", "s-local-nodes")
    assert r.returncode != 0 and "--nodes is for a `scheduler: slurm` host; local is one host" in r.stderr, r.stderr


def test_two_node_dist_check_as_one_job(slurm, cluster_hosts, cluster_checked):
    """One batch job over node1 and node2: a torchrun per node, the rendezvous on the first node."""
    r = inv("dist-check", "--host", "cluster-pair", "--hosts", str(cluster_hosts), "--rdzv-port", str(free_port()))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "world 2, all-reduce sum 3.0 (want 3.0)" in r.stdout and "node 0" in r.stdout and "node 1" in r.stdout
    rid = r.stdout.split("dist-check ", 1)[1].split(":", 1)[0]
    shown = queue.records(slurm.cmd("scontrol", "-o", "show", "job").stdout)
    job = [j for j in shown if j.get("JobName") == f"specops-{rid}"]
    assert job and job[0]["NodeList"] == "node[1-2]" and job[0]["JobState"] == "COMPLETED", job


def test_extract_runs_as_a_slurm_job(slurm, cluster_hosts, cluster_checked, pipeline_run, work):
    """`inv extract` on a slurm host: the extraction (hf backend) is a batch job on a compute node."""
    from conftest import LAYERS

    h = inventory.load(str(cluster_hosts)).get("cluster")
    src, dst = f"{work}/data/pipe", f"{work}/data/pipe-slurm"
    with connect(h) as t:
        t.check(f"rm -rf {dst} && mkdir -p {dst} && cp {src}/*.json {src}/*.arrow {dst}/", "copy the prepared rows")
    r = inv("extract", "--host", "cluster", "--hosts", str(cluster_hosts), "--backend", "hf", "--dataset", dst,
            "--verifier", f"{work}/models/tiny-llama", "--layers", LAYERS)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rid = r.stdout.split("(run ", 1)[1].split(")", 1)[0]
    with connect(h) as t:
        jid = json.loads(t.read_bytes(jobs.run_path(t, rid, "slurm.json")))["job_ids"][-1]
        assert f"submitted as Slurm job {jid}" in " ".join(r.stdout.split())
        j = jobs.status(t, rid)[0]
        assert j.state == "succeeded" and j.kind == "extract" and f"Slurm job {jid} COMPLETED, exit 0" in j.detail
    done = queue.jobs(slurm.cmd("scontrol", "-o", "show", "job", jid).stdout)[jid]
    assert done.nodes.startswith("node") and done.state == "COMPLETED"
    r = inv("inspect-data", "--host", "cluster", "--hosts", str(cluster_hosts), "--path", dst, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["stored_layers"] == 4, r.stdout[-2000:]


def timed(name):
    """Print a test's own time (CI's budget: each Slurm test says what it costs)."""
    t0 = time.time()

    class _T:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            print(f"\n[time] {name}: {time.time() - t0:.1f} s")
    return _T()


def test_shards_only_for_a_slurm_host(slurm, cluster_hosts):
    r = inv("extract", "--host", "local", "--shards", "2", "--backend", "hf")
    assert r.returncode != 0 and r.stderr.strip().splitlines()[0] == (
        "specops: --shards is for a `scheduler: slurm` host (a job array); local is one host: drop --shards, or "
        "give --shard i/n (a group splits the rows itself)"), r.stderr
    r = inv("extract", "--host", "cluster", "--hosts", str(cluster_hosts), "--shards", "0")
    assert r.returncode == 2 and "--shards" in r.stderr, r.stderr


def test_array_tasks_report_each_exit_code_and_stop_cancels_the_array(slurm, cluster_hosts, cluster_checked):
    """Real Slurm arrays through jobs.start: each task's state and exit code in `inv status`; a
    task that fails fails the run with its code; `inv stop` ends the running tasks and the pending one."""
    from specops.slurm.script import ARRAY_TASK

    base = ["--host", "cluster-gpu2", "--hosts", str(cluster_hosts)]
    h = inventory.load(str(cluster_hosts)).get("cluster-gpu2")
    with timed("array exit codes and stop"), connect(h) as t:
        rid = "s-array-codes-" + str(int(time.time()))
        jid = jobs.start(t, rid, ["bash", "-c", f"exit $(( {ARRAY_TASK} * 3 ))"], kind="extract", array=2).slurm_job_id
        j = wait_for(lambda: (lambda x: x if x.ended else None)(jobs.status(t, rid)[0]), 120, "the array's end")
        st = json.loads(inv("status", *base, "--run-id", rid, "--json").stdout)[0]
        assert st["state"] == "failed" and st["exit_code"] == 3 and st["slurm_job_id"] == jid, st
        tasks = {s["run_id"]: s for s in st["subjobs"]}
        assert (tasks["task0"]["state"], tasks["task0"]["exit_code"]) == ("succeeded", 0), tasks
        assert (tasks["task1"]["state"], tasks["task1"]["exit_code"]) == ("failed", 3), tasks
        assert tasks["task1"]["detail"].startswith(f"Slurm job {jid}_1 FAILED, exit 3"), tasks["task1"]
        assert st["detail"].startswith(f"Slurm job array {jid}: ") and f"task1 Slurm job {jid}_1 FAILED, exit 3" \
            in st["detail"], st["detail"]
        table = " ".join(inv("status", *base).stdout.split())
        assert f"{rid}/task0" in table and f"{rid}/task1" in table, table

        # three tasks, each the whole node's two GPUs: two run, the third waits; stop ends all three
        rid = "s-array-stop-" + str(int(time.time()))
        jid = jobs.start(t, rid, ["sleep", "300"], kind="extract", array=3).slurm_job_id
        j = wait_for(lambda: (lambda x: x if [s.state for s in x.subjobs].count("running") == 2 else None)(
            jobs.status(t, rid)[0]), 60, "two tasks running")
        assert j.state == "running" and [s.state for s in j.subjobs].count("pending") == 1, j.subjobs
        r = inv("stop", *base, "--run-id", rid, "--grace", "20")
        assert r.returncode == 0 and f"stop {rid}: stopped" in r.stdout, r.stdout + r.stderr
        assert not [q for q in queued(slurm) if q.startswith(jid)] and not any(
            j.get("ArrayJobId") == jid and j.get("JobState") in ("PENDING", "RUNNING")
            for j in queue.records(slurm.cmd("scontrol", "-o", "show", "job").stdout))
        assert all(s.state == "stopped" for s in jobs.status(t, rid)[0].subjobs)


def copy_rows(h, work, name):
    src, dst = f"{work}/data/pipe", f"{work}/data/{name}"
    with connect(h) as t:
        t.check(f"rm -rf {dst} && mkdir -p {dst} && cp {src}/*.json {src}/*.arrow {dst}/", "copy the prepared rows")
    return dst


def test_extract_array_vllm_dry_run_script(slurm, cluster_hosts, cluster_checked, pipeline_run, work):
    """The vLLM array as it would be submitted: each task its share (--shard $SLURM_ARRAY_TASK_ID/2) and a
    vLLM server of its own on its allocation's GPU; nothing queued, nothing written."""
    from conftest import LAYERS

    h = inventory.load(str(cluster_hosts)).get("cluster-gpu1")
    dst = copy_rows(h, work, "pipe-array-dry")
    before = queued(slurm)
    with timed("extract array dry-run"):
        r = inv("extract", "--host", "cluster-gpu1", "--hosts", str(cluster_hosts), "--shards", "2", "--dataset", dst,
                "--verifier", f"{work}/models/tiny-llama", "--layers", LAYERS, "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = r.stdout
    for line in ("#SBATCH --array=0-1", "#SBATCH --gpus-per-node=1", "#SBATCH --partition=debug",
                 "--output=" + f"{work}/runs/", "-extract/output-%A_%a.log"):
        assert line in out, out[-4000:]
    node = out.split("bash -c '", 1)[1]
    assert (f"-m specops_host.data.datagen --data-dir {dst} --verifier {work}/models/tiny-llama --kind cpu --extract "
            f"--backend vllm --concurrency 32 --layers {LAYERS} --shard \"$SLURM_ARRAY_TASK_ID\"/2 --tensor-parallel 1 "
            f"--trust-remote-code auto --result ") in node, node
    # each task's own vLLM server, as task 0 would start it (task i: --rank i)
    served = [ln for ln in out.splitlines() if "would start: " in ln and "vllm.entrypoints.openai.api_server" in ln]
    assert len(served) == 1 and "--tensor-parallel-size 1" in served[0], out[-3000:]
    gen = [ln for ln in out.splitlines() if "would start: " in ln and "generate-offline-data" in ln]
    assert len(gen) == 1 and "--world-size 2 --rank 0" in gen[0], gen
    assert "/result-\"$SLURM_ARRAY_TASK_ID\".json" in node and "sbatch --parsable" in out
    assert queued(slurm) == before
    with connect(h) as t:
        assert not t.exists(f"{dst}/hidden_states")


def test_extract_array_two_shards_end_to_end(slurm, cluster_hosts, cluster_checked, pipeline_run, work):
    """`inv extract --shards 2` (the vLLM backend): one array, each task its share of the rows on its
    own fake GPU with its own vLLM server (its own port, server folder and staging folder), which it
    stops; every row's file in the one data dir at the end; status shows each task; no server left."""
    from conftest import LAYERS
    from test_online import FAST, alive_in_group

    h = inventory.load(str(cluster_hosts)).get("cluster-gpu1")
    dst = copy_rows(h, work, "pipe-array")
    base = ["--host", "cluster-gpu1", "--hosts", str(cluster_hosts)]
    with timed("extract array (vllm, 2 tasks)"):
        r = inv("extract", *base, "--shards", "2", "--dataset", dst, "--verifier", f"{work}/models/tiny-llama",
                "--layers", LAYERS, *(f"--vllm-arg={a}" for a in FAST))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = " ".join(r.stdout.split())
    rid = out.split("extract submitted on cluster-gpu1: run ", 1)[1].split(" ", 1)[0]
    jid = out.split("(Slurm job array ", 1)[1].split(",", 1)[0]
    assert f"task0 ({jid}_0)" in out and f"task1 ({jid}_1)" in out, out
    assert "every row has its hidden states, the tasks' shards in one data dir (shared filesystem)" in out, out
    st = json.loads(inv("status", *base, "--run-id", rid, "--json").stdout)[0]
    assert st["state"] == "succeeded" and st["kind"] == "extract" and st["exit_code"] == 0, st
    assert [(s["run_id"], s["state"], s["slurm_job_id"]) for s in st["subjobs"]] == [
        ("task0", "succeeded", f"{jid}_0"), ("task1", "succeeded", f"{jid}_1")], st["subjobs"]
    with connect(h) as t:
        rows = [json.loads(t.read_bytes(jobs.run_path(t, rid, f"result-{i}.json")))["rows"] for i in (0, 1)]
        files = int(t.check(f"ls {dst}/hidden_states | grep -c '^hs_.*safetensors$'", "count files").stdout)
        assert rows[0][0] == 0 and rows[0][1] == rows[1][0] and rows[1][1] == files > 1, (rows, files)  # (contiguous)
        ports = set()
        for i in (0, 1):
            log = t.read_bytes(jobs.run_path(t, rid, f"output-{jid}_{i}.log")).decode()
            assert f"[specops] array task {i} of {jid} on " in log and ", GPUs none" not in log, log[-2000:]
            assert log.index("vLLM server healthy after") < log.index("generate-offline-data") < log.index(
                "vLLM server stopped") and f"--world-size 2 --rank {i}" in log, log[-3000:]
            assert f"{dst}/.hs_stage-{i}-of-2" in log, log[-3000:]  # (each server its own staging folder)
            srv = json.loads(t.read_bytes(jobs.run_path(t, rid, f"server-{i}", "job.json")))
            ports.add(srv["port"])
            assert alive_in_group(t, srv["pgid"]) == [], f"task {i}'s vLLM server outlived its task"
            assert not t.run(f"grep -lsz SPECOPS_JOB={srv['tag']} /proc/[0-9]*/environ").stdout.strip()
        assert len(ports) == 2, ports
        assert not t.run(f"ls -A {dst} | grep hs_stage").stdout.strip(), "a staging folder was left"
    r = inv("logs", *base, "--run-id", rid, "--task", "1")
    assert r.returncode == 0 and f"[specops] array task 1 of {jid} on " in r.stdout, r.stdout[-2000:] + r.stderr
    r = inv("logs", *base, "--run-id", rid)
    assert r.returncode != 0 and f"run {rid} is a Slurm job array of 2 tasks, each with its own log: give --task 0..1" \
        in r.stderr, r.stderr
    r = inv("inspect-data", *base, "--path", dst, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["stored_layers"] == 4, r.stdout[-2000:]


def test_online_training_is_one_allocation_dry_run(slurm, cluster_hosts, cluster_checked, pipeline_run):
    """--hidden-states online on a slurm host: one batch job on one node; its first step the
    draft-serves preflight, then remote/specops_host/train/run.py, which starts the vLLM server, the trainer once the
    server is healthy, and stops the server when the trainer ends or Slurm signals the job."""
    before = queued(slurm)
    rid = "s-online-dry"
    with timed("online training dry-run"):
        r = inv("train", "--host", "cluster", "--hosts", str(cluster_hosts), "--hidden-states", "online",
                "--config", "configs/demo.yaml", "--dataset", "pipe", "--run-id", rid, "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    out = r.stdout
    script = out.split("echo '[specops] draft-serves preflight (remote/specops_host/check/serve.py) before the trainer'\n", 1)[1]
    step, rest = script.split('\nrc=$?; if [ "$rc" != 0 ]; then echo "$rc" > ', 1)
    assert step.startswith("srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 bash -c "), step
    assert "-m specops_host.check.serve --spec " in step and f"runs/{rid}/train-spec.json --job-step " in step \
        and f"runs/{rid}/serve-check.json" in step, step
    assert rest.split("\n", 1)[1].startswith("srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c"), rest[:500]
    assert "-m specops_host.train.run --spec" in out and "#SBATCH --nodes=1" in out and "sbatch --parsable" in out
    assert "the job would start the vLLM server: " in out and "hidden states: online" in " ".join(out.split())
    assert queued(slurm) == before


def test_serve_preflight_failure_on_slurm_is_one_line_and_no_training(slurm, cluster_hosts, cluster_checked,
                                                                      pipeline_run):
    """The preflight is the job's first step: vLLM refusing the server fails the job in one line
    (inv train --follow, inv status, inv logs) and the trainer never starts."""
    rid = "s-serve-fail-" + str(int(time.time()))
    base = ["--host", "cluster", "--hosts", str(cluster_hosts)]
    with timed("preflight failure as a Slurm step"):
        r = inv("train", *base, "--config", "configs/demo.yaml", "--dataset", "pipe", "--run-id", rid, "--follow",
                "--vllm-arg=--no-such-vllm-flag")
    assert r.returncode != 0
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith(f"specops: train {rid} on cluster failed (Slurm job ") and \
        ": the draft-serves preflight failed: vLLM could not serve the verifier with an untrained EAGLE-3 draft " \
        "of this config: " in first and "no-such-vllm-flag" in first and \
        first.endswith("the trainer was not started (--no-serve-check skips the preflight)"), r.stderr
    st = json.loads(inv("status", *base, "--run-id", rid, "--json").stdout)[0]
    assert st["state"] == "failed" and st["exit_code"] == 1 and st["error"].startswith(
        "the draft-serves preflight failed: vLLM could not serve"), st
    logs = inv("logs", *base, "--run-id", rid)
    assert "[specops] error: the draft-serves preflight failed" in logs.stdout, logs.stdout[-2000:]
    h = inventory.load(str(cluster_hosts)).get("cluster")
    with connect(h) as t:
        log = (t.read_bytes(jobs.run_path(t, rid, "output.log")) or b"").decode()
        assert "train/loss=" not in log and "[specops] $ " not in log.split("draft-serves preflight failed")[1]
        assert not t.exists(jobs.run_path(t, rid, "run.json"), "-f"), "the trainer started"
        assert not json.loads(t.read_bytes(jobs.run_path(t, rid, "serve-check.json")))["ok"]


def test_online_training_in_one_allocation(slurm, cluster_hosts, cluster_checked, pipeline_run, work):
    """A real online run as one Slurm job: the server first on the allocation's node, the trainer
    once it is healthy (half the rows have no file: generated by the server), the server stopped
    when the trainer ends; nothing of the server left running."""
    from test_online import FAST, alive_in_group, hs_count

    h = inventory.load(str(cluster_hosts)).get("cluster")
    src, dst = f"{work}/data/pipe", f"{work}/data/pipe-slurm-half"
    with connect(h) as t:
        t.check(f"rm -rf {dst} && cp -r {src} {dst} && cd {dst}/hidden_states && for f in hs_*.safetensors; do "
                f"i=${{f#hs_}}; i=${{i%.safetensors}}; [ $((i % 2)) -eq 1 ] && rm $f; done; true", "half the files")
        before = hs_count(t, dst)
    rid = "s-online-" + str(int(time.time()))
    with timed("online training as one Slurm job"):
        r = inv("train", "--host", "cluster", "--hosts", str(cluster_hosts), "--hidden-states", "online",
                "--config", "configs/demo.yaml", "--dataset", dst, "--run-id", rid, "--max-steps", "2", "--follow",
                "--no-serve-check", *(f"--vllm-arg={a}" for a in FAST))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    with connect(h) as t:
        log = t.read_bytes(jobs.run_path(t, rid, "output.log")).decode(errors="replace")
        assert log.index("vLLM server healthy after") < log.index("train/loss=") < log.index("trainer exited 0") \
            < log.index("vLLM server stopped"), log[-3000:]
        srv = json.loads(t.read_bytes(jobs.run_path(t, rid, "server", "job.json")))
        assert alive_in_group(t, srv["pgid"]) == [], "the vLLM server outlived the job"
        j = jobs.status(t, rid)[0]
        assert j.state == "succeeded" and "COMPLETED, exit 0" in j.detail, j.describe
        assert hs_count(t, dst) == before  # (generated rows are never written into the dataset)


def online_serving(t, base, rid):
    """An online run submitted detached (its trainer would run 1000 steps), once its server is healthy
    and its trainer started: (Slurm job id, the server's job.json, a function listing what is left of the
    run: the server's group and tag, and every process whose command line names the run)."""
    from test_online import FAST, alive_in_group

    r = inv("train", *base, "--hidden-states", "online", "--config", "configs/demo.yaml", "--dataset", "pipe",
            "--run-id", rid, "--max-steps", "1000", "--no-serve-check", *(f"--vllm-arg={a}" for a in FAST))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    jid = json.loads(t.read_bytes(jobs.run_path(t, rid, "slurm.json")))["job_ids"][-1]
    log = jobs.run_path(t, rid, "output.log")
    wait_for(lambda: b"vLLM server healthy after" in (t.read_bytes(log) or b""), 300, "the server's health")
    srv = json.loads(t.read_bytes(jobs.run_path(t, rid, "server", "job.json")))

    def run_procs():  # (the step's and the trainer's command lines name the run; vLLM's engines are in its group)
        return [ln for ln in t.run("ps -eo pid=,stat=,args=").stdout.splitlines()
                if rid in ln and not ln.split()[1].startswith("Z")]

    def left():
        tagged = t.run(f"grep -lsz SPECOPS_JOB={srv['tag']} /proc/[0-9]*/environ").stdout.split()
        return alive_in_group(t, srv["pgid"]) + run_procs() + tagged

    wait_for(lambda: any("specops_host.train.hooked" in ln for ln in run_procs()), 120, "the trainer's start")
    assert alive_in_group(t, srv["pgid"]), "the server is not running"
    return jid, srv, left, run_procs


def gone_within(left, seconds=60):
    t0 = time.time()
    while (still := left()) and time.time() - t0 < seconds:
        time.sleep(1)
    print(f"\n[time] every process gone {time.time() - t0:.1f} s later")
    assert not still, f"alive {seconds} s later: {still}"


def test_online_run_cancelled_hard_leaves_nothing_running(slurm, cluster_hosts, cluster_checked, pipeline_run):
    """`scancel JOBID` from outside specops (a user; the time limit does the same) while an online
    run's server and trainer run: both are gone within seconds, and `inv status` shows the run
    ended (Slurm's CANCELLED), not running or lost."""
    h = inventory.load(str(cluster_hosts)).get("cluster")
    rid = "s-online-cancel-" + str(int(time.time()))
    base = ["--host", "cluster", "--hosts", str(cluster_hosts)]
    with timed("online run cancelled hard"), connect(h) as t:
        jid, srv, left, _ = online_serving(t, base, rid)
        slurm.cmd("scancel", jid)
        gone_within(left)
        row = wait_for(lambda: (lambda j: j if j["state"] != "running" else None)(
            json.loads(inv("status", *base, "--run-id", rid, "--json").stdout)[0]), 60, "the run's end")
        assert row["state"] == "killed" and f"Slurm job {jid} CANCELLED" in row["detail"], row
        assert t.read_bytes(jobs.run_path(t, rid, "exit_code")).strip() == b"-15"  # (what is left once Slurm forgets)
        assert not t.exists(f"{t.workdir}/.specops/hs-stage/{rid}"), "the run's staging folder was left"


def test_online_run_whose_step_is_killed_leaves_nothing_running(slurm, cluster_hosts, cluster_checked, pipeline_run):
    """The step's own process (remote/specops_host/train/run.py) SIGKILLed (the OOM killer, a node's admin): Slurm's
    tracking loses its orphans (here proctrack/linuxproc; proctrack/pgid never sees the server's
    session), so the server is tied to it and the trainer gets SIGTERM when it dies: both gone."""
    h = inventory.load(str(cluster_hosts)).get("cluster")
    rid = "s-online-kill9-" + str(int(time.time()))
    base = ["--host", "cluster", "--hosts", str(cluster_hosts)]
    with timed("online run's step SIGKILLed"), connect(h) as t:
        jid, srv, left, run_procs = online_serving(t, base, rid)
        step = [ln.split()[0] for ln in run_procs() if ln.split()[2].endswith("/python3")
                and ln.split()[3:5] == ["-m", "specops_host.train.run"]]  # (not srun's nor bash's line, which name it too)
        assert len(step) == 1, run_procs()
        t.check(f"kill -9 {step[0]}", "SIGKILL the step's specops_host.train.run")
        gone_within(left)
        row = wait_for(lambda: (lambda j: j if j["state"] != "running" else None)(
            json.loads(inv("status", *base, "--run-id", rid, "--json").stdout)[0]), 60, "the run's end")
        assert row["state"] == "failed" and f"Slurm job {jid} FAILED" in row["detail"] and row["exit_code"] == 137, row
