"""The Slurm layer's pure parts: the sbatch script from typed inputs, scontrol/sinfo parsing and a
request judged against a partition; remote/specops_host/jobs/launch.py's node fields from a Slurm task's environment
(no network, no Slurm: the integration tests run them against a real one)."""

import shlex

from specops import inventory
from specops.slurm import queue
from specops.slurm.script import BatchJob, Request, render, srun_prefix
from specops_host.jobs import launch

PY = "/shared/env/bin/python3"


def job(**kw):
    req = Request(**{"nodes": 2, "gpus_per_node": 8, "partition": "gpu", "account": "proj", "qos": "hi",
                     "time": "04:00:00", "constraint": "h100", **kw})
    return BatchJob(name="specops-r1", workdir="/shared/w", run_dir="/shared/w/runs/r1",
                    command=[PY, "-m", "specops_host.train.run", "--spec",
                             "/shared/w/runs/r1/train-spec.json"], request=req,
                    setup=("module load cuda/12.4",), env_file="/shared/w/runs/r1.env")


def test_header_from_the_request_and_one_task_per_node():
    text = render(job())
    head = [ln for ln in text.splitlines() if ln.startswith("#SBATCH ")]
    assert head == ["#SBATCH --job-name=specops-r1", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                    "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --qos=hi", "#SBATCH --time=04:00:00",
                    "#SBATCH --constraint=h100", "#SBATCH --gpus-per-node=8", "#SBATCH --chdir=/shared/w",
                    "#SBATCH --output=/shared/w/runs/r1/output.log", "#SBATCH --open-mode=append"]
    srun = next(ln for ln in text.splitlines() if ln.startswith("srun "))
    argv = shlex.split(srun + text.split(srun, 1)[1].split("\nrc=$?")[0])
    assert argv[:4] == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash"]
    node = argv[5].splitlines()
    assert node[0] == "module load cuda/12.4"  # the setup lines first on each node
    assert "< /shared/w/runs/r1.env" in node[1] and "export \"$kv\"" in node[1]
    assert node[2] == f"exec {PY} -m specops_host.train.run --spec /shared/w/runs/r1/train-spec.json"
    assert 'echo "$rc" > /shared/w/runs/r1/exit_code' in text and text.startswith("#!/bin/bash\n")
    assert "SPECOPS_RDZV_ADDR" in text and 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text


def test_optional_fields_are_left_out():
    text = render(BatchJob(name="n", workdir="/w", run_dir="/w/runs/r", command=["x"], request=Request()))
    assert "--partition" not in text and "--gpus-per-node" not in text and "--time" not in text
    assert srun_prefix(Request(nodes=1, partition="debug", time="10")) == \
        "srun --nodes=1 --ntasks-per-node=1 --partition=debug --time=10"


def test_request_of_the_inventory_and_the_nodes_flag():
    s = inventory.Slurm(partition="gpu", nodes=2, gpus_per_node=4, time="1:00:00")
    assert Request.of(s) == Request(nodes=2, gpus_per_node=4, partition="gpu", time="1:00:00")
    assert Request.of(s, nodes=4).nodes == 4


def test_launch_takes_the_node_from_slurm_and_reuses_torchrun():
    spec = {"run_dir": "/w/runs/r1", "nproc": 8, "scheduler": "slurm", "rdzv_port": 29500}
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "1", "SPECOPS_RDZV_ADDR": "10.0.0.7", "SLURM_JOB_ID": "42"}
    node = launch.slurm_node(spec, env)
    assert (node["nnodes"], node["node_rank"], node["rdzv_endpoint"], node["slurm_job_id"]) == (2, 1, "10.0.0.7:29500", "42")
    argv = launch.torchrun(node, python=PY)
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.7:29500" and "is_host=0" in argv
    assert launch.torchrun(launch.slurm_node(spec, {"SLURM_NNODES": "1", "SLURM_NODEID": "0"}),
                           PY)[-1] == "--standalone"


RUNNING = ("JobId=7 JobName=specops-r1 UserId=u(1000) GroupId=u(1000) JobState=RUNNING Reason=None Dependency=(null) "
           "ExitCode=0:0 RunTime=00:01:02 TimeLimit=00:20:00 NodeList=node[1-2] BatchHost=node1 NumNodes=2 "
           "Command=/shared/w/runs/r1/slurm-job.sh WorkDir=/shared/w StdOut=/shared/w/runs/r1/output.log")


def test_scontrol_records_and_states():
    j = queue.jobs(RUNNING)["7"]
    assert (j.state, j.nodes, j.run_time, j.stdout) == ("RUNNING", "node[1-2]", "00:01:02",
                                                        "/shared/w/runs/r1/output.log")
    assert j.job_state == "running" and j.describe() == "Slurm job 7 RUNNING on node[1-2] for 00:01:02"
    cancelled = queue.jobs(RUNNING.replace("JobState=RUNNING", "JobState=CANCELLED").replace("ExitCode=0:0", "ExitCode=0:15"))["7"]
    assert (cancelled.job_state, cancelled.code) == ("killed", -15) and "signal 15" in cancelled.describe()
    pend = queue.jobs(RUNNING.replace("JobState=RUNNING Reason=None", "JobState=PENDING Reason=Resources")
                      .replace("NodeList=node[1-2]", "NodeList=(null)"))["7"]
    assert pend.job_state == "pending" and pend.nodes == "" and pend.describe() == "Slurm job 7 PENDING (Resources)"
    assert queue.records("Command=/path with space/x.sh WorkDir=/w")[0]["Command"] == "/path with space/x.sh"


def test_gres_and_the_partition_judgement():
    assert [queue.gres_gpus(g) for g in ("gpu:2", "gpu:a100:4(S:0-1)", "gpu:a100:4,nic:1", "(null)", "")] == [2, 4, 4, 0, 0]
    rec = queue.records("PartitionName=gpu Default=YES MaxNodes=4 MaxTime=1-00:00:00 Nodes=g[1-8] State=UP TotalNodes=8")[0]
    p = queue.Partition.of(rec, queue.sinfo_nodes("g1|gpu:8|idle\ng2|gpu:8(S:0)|mixed\n"))
    assert (p.max_nodes, p.max_time_s, p.gpus_per_node, p.default) == (4, 86400, 8, True)
    assert queue.judge(p, Request(nodes=4, gpus_per_node=8, time="23:00:00")) is None
    assert "5 nodes asked; partition gpu has 8 and takes at most 4 per job: ask for at most 4" in queue.judge(p, Request(nodes=5))
    assert "9 GPUs per node asked" in queue.judge(p, Request(gpus_per_node=9))
    assert "time limit 2-00 asked; partition gpu allows at most 1-00:00:00" in queue.judge(p, Request(time="2-00"))
    down = queue.Partition.of({**rec, "State": "DOWN"})
    assert queue.judge(down, Request()).startswith("partition gpu is DOWN")


def test_an_array_job_script():
    """`--array=0-N-1`, `%A_%a` logs, a per-task exit code, and the task index expanded by the shell."""
    from specops.slurm.script import ARRAY_TASK, shell_arg

    j = BatchJob(name="specops-x", workdir="/w", run_dir="/w/runs/x", request=Request(gpus_per_node=1),
                 command=[PY, "-m", "specops_host.data.datagen", "--shard", f"{ARRAY_TASK}/2", "--result",
                          f"/w/runs/x/result-{ARRAY_TASK}.json"], array=2)
    text = render(j)
    head = [ln for ln in text.splitlines() if ln.startswith("#SBATCH ")]
    assert "#SBATCH --array=0-1" in head and "#SBATCH --output=/w/runs/x/output-%A_%a.log" in head
    assert "#SBATCH --gpus-per-node=1" in head
    assert 'echo "$rc" > /w/runs/x/exit_code-"$SLURM_ARRAY_TASK_ID"' in text
    node = shlex.split(text.split("bash -c ", 1)[1].split("\nrc=$?")[0])[0]
    assert node.splitlines()[-1] == (f'exec {PY} -m specops_host.data.datagen --shard "$SLURM_ARRAY_TASK_ID"/2 --result '
                                     f'/w/runs/x/result-"$SLURM_ARRAY_TASK_ID".json')
    assert shell_arg("a b") == "'a b'" and shell_arg(ARRAY_TASK) == '"$SLURM_ARRAY_TASK_ID"'
    assert "--array" not in render(job()) and "output.log" in render(job())


def test_a_step_before_srun_fails_the_job_with_its_code():
    j = BatchJob(name="n", workdir="/w", run_dir="/w/runs/r", command=["x"], request=Request(nodes=2),
                 setup=("module load cuda",), before=(("draft-serves preflight", [PY, "-m", "specops_host.check.serve",
                                                                                  "--spec", "/w/s.json"]),))
    lines = render(j).splitlines()
    i = lines.index("echo '[specops] draft-serves preflight'")
    step = shlex.split(lines[i + 1] + "\n" + lines[i + 2])
    assert step[:5] == ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1", "bash"]  # (the first node)
    assert step[6] == f"module load cuda\nexec {PY} -m specops_host.check.serve --spec /w/s.json", step
    assert lines[i + 3] == 'rc=$?; if [ "$rc" != 0 ]; then echo "$rc" > /w/runs/r/exit_code; exit "$rc"; fi'
    assert lines[i + 4].startswith("srun --ntasks-per-node=1 ")


def test_a_hard_cancel_is_recorded_by_the_batch_shell():
    """Slurm's SIGTERM to the batch shell (scancel, the time limit): its trap writes -15 at once (srun
    runs in the background, so `wait` lets the trap run), then waits for srun; once Slurm forgets
    the job, that file says killed, not lost."""
    from specops.slurm.cluster import _state

    lines = render(job()).splitlines()
    trap = next(ln for ln in lines if ln.startswith("trap "))
    assert lines.index(trap) < next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    assert shlex.split(trap)[1].endswith("echo -15 > /shared/w/runs/r1/exit_code; wait; exit 143") and \
        shlex.split(trap)[2] == "TERM", trap
    assert "train-spec.json' & wait $!\nrc=$?\n" in render(job())
    assert _state("7", -15, None, False)[0] == "killed" and _state("7", -15, None, False)[1] == \
        "Slurm job 7 ended by signal 15 (scancel or its time limit)"
    assert _state("7", -15, None, True)[0] == "stopped" and _state("7", 3, None, False)[0] == "failed"


def test_array_task_ids():
    assert queue.task_ids("3") == (3,) and queue.task_ids("0-3") == (0, 1, 2, 3)
    assert queue.task_ids("1,3") == (1, 3) and queue.task_ids("0-6:2") == (0, 2, 4, 6)
    assert queue.task_ids("2-4%2") == (2, 3, 4) and queue.task_ids("") == ()


def test_an_online_split_names_the_allocations_gpus():
    """In a Slurm job the server's and the trainer's GPUs are positions in the allocation's own
    CUDA_VISIBLE_DEVICES (a node that does not renumber them gives e.g. 4,5,6,7)."""
    from specops_host.train import online as on

    env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert on.allocated("0,1", env) == "4,5" and on.allocated("2,3", env) == "6,7"
    assert on.allocated("0,1", {"CUDA_VISIBLE_DEVICES": "4,5"}) == "0,1"  # (not a Slurm job: as they are)
    try:
        on.allocated("4", env)
        raise AssertionError("an index past the allocation was taken")
    except on.Refused as e:
        assert "this Slurm allocation has 4 (4,5,6,7)" in str(e)
