"""Several hosts: parallel fan-out, sharded extraction across hosts, a two-node torchrun launch.
Each host is a real sshd in its own network namespace with its own address (netrig.py)."""

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from conftest import LAYERS, inv, wait_for
from netrig import NetRig, netns_works
from rig import Rig, free_port
from specops import inventory
from specops.ops import jobs
from specops.host.connection import connect


@pytest.fixture(scope="module")
def pod(cpu_box, rig):
    """Two nodes; both use the test run's cpu venv (same user, same machine) and own workdirs."""
    if os.geteuid() == 0 and netns_works():
        net = NetRig(2).start()
        rigs, ifaces, stop = net.rigs, net.ifaces, net.stop
    else:  # without root: two sshds on loopback
        rigs = [Rig().start(), Rig().start()]
        ifaces, stop = ["lo", "lo"], lambda: [r.stop() for r in rigs]
    hosts = {}
    for i, (r, iface) in enumerate(zip(rigs, ifaces)):
        work = r.root / "work"
        work.mkdir()
        shutil.chown(work, r.user, r.user)
        hosts[f"node{i}"] = r.host(venv="~/ml-env", workdir=str(work), env={"GLOO_SOCKET_IFNAME": iface})
    hosts["dead"] = rigs[0].host(address="127.0.0.1", port=free_port(), connect_timeout=3)
    hf = rigs[0].write_hosts(rigs[0].root / "hosts.yaml", hosts, groups={"pod": ["node0", "node1"]})
    yield {"hosts_file": hf, "rigs": rigs, "work": [r.root / "work" for r in rigs]}
    stop()


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_fan_out_one_row_per_host_and_failures_do_not_hide_others(pod):
    hf = str(pod["hosts_file"])
    r = inv("status", "--host", "@pod", "--hosts", hf)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "status (2 hosts)" in r.stdout and "node0" in r.stdout and "node1" in r.stdout
    r = inv("status", "--host", "node0,dead,node1", "--hosts", hf)
    assert r.returncode != 0
    assert "1 of 3 host(s) failed: dead: nothing listening at 127.0.0.1:" in r.stderr
    rows = [ln for ln in r.stdout.splitlines() if re.search(r"node[01]", ln) and "✓" in ln]
    assert len(rows) >= 2, r.stdout


def test_two_node_torchrun_rendezvous_all_reduce(pod):
    r = inv("dist-check", "--host", "@pod", "--hosts", str(pod["hosts_file"]))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "world 2, all-reduce sum 3.0 (want 3.0)" in r.stdout
    assert "node 0" in r.stdout and "node 1" in r.stdout


def test_group_stop_stops_every_node(pod):
    hf = str(pod["hosts_file"])
    inv_hosts = inventory.load(hf)
    rid = jobs.new_run_id("t") + "-groupstop"
    for name in ("node0", "node1"):
        with connect(inv_hosts.get(name)) as t:
            jobs.start(t, rid, ["sleep", "300"], kind="test")
    r = inv("stop", "--host", "@pod", "--hosts", hf, "--run-id", rid, "--grace", "5")
    assert r.returncode == 0, r.stderr
    for name in ("node0", "node1"):
        with connect(inv_hosts.get(name)) as t:
            assert jobs.status(t, rid)[0].state == "stopped"


def test_sharded_extraction_union_equals_single_host(pod, pipeline_run, hosts_file, work):
    """Rows split across the two nodes (--shard i/2 each), then every node gets every shard;
    the union equals one host extracting all rows."""
    src = work / "data" / "pipe"
    ver = f"{work}/models/tiny-llama"
    targets = [w / "data" / "shard" for w in pod["work"]] + [work / "data" / "shard-single"]
    for d in targets:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        for f in list(src.glob("*.json")) + list(src.glob("*.arrow")):
            shutil.copy(f, d / f.name)
        for p in [d.parent, d, *d.iterdir()]:  # (made by this root test process: hand them over)
            shutil.chown(p, pod["rigs"][0].user, pod["rigs"][0].user)
    hf = str(pod["hosts_file"])
    t0 = time.time()
    r = inv("extract", "--host", "@pod", "--hosts", hf, "--backend", "hf", "--dataset", "shard",
            "--verifier", ver, "--layers", LAYERS)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "every host now holds all shards" in r.stdout
    print(f"sharded extraction on 2 nodes: {time.time() - t0:.1f}s")
    r = inv("extract", "--host", "box", "--hosts", str(hosts_file), "--backend", "hf",
            "--dataset", str(targets[2]), "--verifier", ver, "--layers", LAYERS)
    assert r.returncode == 0, r.stderr
    single = {p.name: sha(p) for p in (targets[2] / "hidden_states").glob("hs_*.safetensors")}
    assert len(single) == pipeline_run_rows(src)
    for d in targets[:2]:
        got = {p.name: sha(p) for p in (d / "hidden_states").glob("hs_*.safetensors")}
        assert got == single, f"{d}: {len(got)} files, {sum(got.get(k) == v for k, v in single.items())} identical"


def pipeline_run_rows(src: Path) -> int:
    return len(list((src / "hidden_states").glob("hs_*.safetensors")))


def test_parallel_bootstrap_and_check(pod):
    """bootstrap and check on both nodes at once (their venv is the test run's cpu venv: a no-op
    bootstrap that verifies, and a full check by each node's interpreter)."""
    hf = str(pod["hosts_file"])
    r = inv("bootstrap", "--host", "@pod", "--hosts", hf)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "bootstrap (2 hosts)" in r.stdout and r.stdout.count("profile unchanged") == 2
    r = inv("check", "--host", "@pod", "--hosts", hf, "--min-free-gb", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "check (2 hosts)" in r.stdout and r.stdout.count("all hard checks pass") == 2
    r = inv("check", "--host", "node0,dead", "--hosts", hf, "--min-free-gb", "1")
    assert r.returncode != 0 and "1 of 2 host(s) failed: dead" in r.stderr and "all hard checks pass" in r.stdout


def test_shards_move_host_to_host_with_the_forwarded_agent(pod, tmp_path, monkeypatch):
    """With `reach_peers`, each node rsyncs its shard files straight to the other (its own
    OpenSSH, the laptop's ssh-agent forwarded, strict known_hosts sent from the laptop)."""
    import signal
    import subprocess

    from specops.group import shards

    raw = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True, check=True).stdout
    sock = re.search(r"SSH_AUTH_SOCK=([^;]+);", raw).group(1)
    agent_pid = int(re.search(r"SSH_AGENT_PID=(\d+);", raw).group(1))
    try:
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        for r in pod["rigs"]:
            subprocess.run(["ssh-add", "-q", str(r.client_key)], check=True, env={**os.environ, "SSH_AUTH_SOCK": sock})
        inv_hosts = inventory.load(str(pod["hosts_file"]))
        hosts = [inv_hosts.get(n).model_copy(update={"reach_peers": True}) for n in ("node0", "node1")]
        payload = {}
        for i, h in enumerate(hosts):
            with connect(h) as t:
                d = f"{t.expand(h.workdir_path)}/data/peers/hidden_states"
                t.check(f"rm -rf {d} && mkdir -p {d} && head -c {1000 + i} /dev/urandom > {d}/hs_{i}.safetensors",
                        "shard")
                payload[i] = t.run(f"sha256sum {d}/hs_{i}.safetensors").stdout.split()[0]
        res = shards.complete_data(hosts, "peers")
        assert res == {"mode": "host to host", "files": 2}
        for h in hosts:
            with connect(h) as t:
                d = f"{t.expand(h.workdir_path)}/data/peers/hidden_states"
                for i in (0, 1):
                    assert t.run(f"sha256sum {d}/hs_{i}.safetensors").stdout.split()[0] == payload[i]
    finally:
        os.kill(agent_pid, signal.SIGTERM)


def test_group_train_on_cpu_hosts_is_refused_before_anything_starts(pod):
    """speculators' distributed training needs an accelerator ('No accelerator found' on CPU):
    a cpu group is refused with one line, and no node has a job."""
    hf = str(pod["hosts_file"])
    rid = jobs.new_run_id("t") + "-cpugroup"
    r = inv("train", "--host", "@pod", "--hosts", hf, "--run-id", rid, "--max-steps", "1")
    assert r.returncode != 0
    assert "a cpu host trains in one process (2 node(s) x 1 process(es) asked)" in r.stderr, r.stderr
    assert "nothing was started" in r.stderr
    inv_hosts = inventory.load(hf)
    for name in ("node0", "node1"):
        with connect(inv_hosts.get(name)) as t:
            assert all(j.run_id != rid for j in jobs.status(t)), name


def as_gpu_hosts(hf, tmp_path) -> Path:
    """The pod's nodes declared as one-GPU cuda hosts (this machine has no GPU)."""
    import yaml

    cfg = yaml.safe_load(Path(hf).read_text())
    for n in ("node0", "node1"):
        cfg["hosts"][n].update(profile="cuda", gpus=1)
    out = tmp_path / "hosts-gpu.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


def test_group_dry_runs_start_nothing(pod, pipeline_run, work, tmp_path):
    """--dry-run with a group: extract prints each node's commands, train each node's torchrun
    launch (--nnodes 2, its rank, c10d on the first host); no node gets a job or a file."""
    hf = str(pod["hosts_file"])
    ver = f"{work}/models/tiny-llama"
    r = inv("extract", "--host", "@pod", "--hosts", hf, "--backend", "hf", "--dataset", str(work / "data" / "pipe"),
            "--verifier", ver, "--layers", LAYERS, "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "every host would get every shard (DRY-RUN: nothing was changed)" in r.stdout
    assert r.stdout.count("-m specops_host.data.datagen") >= 2 and "--shard 0/2" in r.stdout and "--shard 1/2" in r.stdout
    gpu_hf = as_gpu_hosts(hf, tmp_path)  # (the spec is built, nothing runs)
    rid = jobs.new_run_id("t") + "-grpdry"
    r = inv("train", "--host", "@pod", "--hosts", str(gpu_hf), "--run-id", rid, "--dataset",
            str(work / "data" / "pipe"), "--verifier", ver, "--config", "configs/demo.yaml", "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"train {rid} would start on 2 nodes: node0 (rank 0), node1 (rank 1)" in r.stdout
    assert r.stdout.count("nothing was changed") == 2
    inv_hosts = inventory.load(hf)
    for name in ("node0", "node1"):
        with connect(inv_hosts.get(name)) as t:
            assert not t.exists(jobs.run_path(t, rid)), name
            assert all(j.state != "running" for j in jobs.status(t)), name


def test_group_resume_gives_every_node_rank0s_latest_checkpoint(pod, pipeline_run, work, tmp_path):
    """speculators decides whether to resume from each rank's own --save-path: before a group
    run resumes, rank 0's latest epoch checkpoint is copied to the nodes lacking it (a node with
    a checkpoint rank 0 lacks is refused: the nodes would disagree)."""
    hf = str(pod["hosts_file"])
    gpu_hf = str(as_gpu_hosts(hf, tmp_path))
    inv_hosts = inventory.load(hf)
    rid = jobs.new_run_id("t") + "-resume"
    args = ["train", "--host", "@pod", "--hosts", gpu_hf, "--run-id", rid, "--dataset", str(work / "data" / "pipe"),
            "--verifier", f"{work}/models/tiny-llama", "--max-steps", "1", "--no-serve-check",  # (no GPU: see above)
            "--config", "configs/demo.yaml"]  # (the default config's draft vocab is larger than the tiny verifier's)
    with connect(inv_hosts.get("node0")) as t0, connect(inv_hosts.get("node1")) as t1:
        ck = jobs.run_path(t0, rid, "checkpoints")
        t0.check(f"mkdir -p {ck}/0 {ck}/1 && for e in 0 1; do head -c 300000 /dev/urandom > {ck}/$e/model.safetensors; "
                 f"echo '{{\"epoch\": '$e'}}' > {ck}/$e/training_state.json; done && ln -s 1 {ck}/checkpoint_best", "ckpt")
        for n in ("node0", "node1"):  # (the dry run reads the data with specops' scripts)
            assert inv("push", "--host", n, "--hosts", gpu_hf).returncode == 0
        r = inv(*args, "--dry-run")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert f"train {rid}: resuming from rank 0's epoch 1 checkpoint; would copy it to node1" in r.stdout
        ck1 = jobs.run_path(t1, rid, "checkpoints")
        assert not t1.exists(ck1)
        r = inv(*args)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert f"train {rid}: resuming from rank 0's epoch 1 checkpoint; copied it to node1" in r.stdout
        sums = [t.run(f"cd {d}/1 && sha256sum model.safetensors training_state.json").stdout for t,
                d in ((t0, ck), (t1, ck1))]
        assert sums[0] == sums[1] and sums[0].count("\n") == 2
        assert not t1.exists(f"{ck1}/0")  # only the epoch it resumes from travels
        for t in (t0, t1):  # (speculators then fails on this GPU-less machine)
            wait_for(lambda t=t: jobs.status(t, rid)[0].ended, 120, f"{rid} to end on {t.host.name}")
        t1.check(f"mkdir -p {ck1}/2", "newer checkpoint")
        r = inv(*args)
        assert r.returncode != 0
        assert f"node1 holds checkpoint(s) [2] in {ck1} that rank 0 (node0) lacks (its latest: 1)" in r.stderr, r.stderr
        assert "nothing was started" in r.stderr
        assert jobs.status(t0, rid)[0].state == "failed"  # still the first attempt's record


def test_group_resume_on_other_settings_is_refused_unless_asked(pod, pipeline_run, work, tmp_path):
    """Issue 24 item 5 for a group: resuming a group run id with other settings is refused (a dry
    run shows it, a real start changes nothing) unless --continue-on-new-data; then every node's
    run.json appends the start with what changed. (The nodes are declared GPU hosts: speculators
    then fails on this GPU-less machine, which is enough: the rule is checked before any start.)
    Its first start, followed: two torchrun nodes really start, `train --follow` shows rank 0's log, waits
    for every node, exits non-zero naming each node's state ('No accelerator found'), with the failed nodes'
    log tails (failures row 39, on this run's first start rather than a group start of its own)."""
    hf = str(pod["hosts_file"])
    gpu_hf = str(as_gpu_hosts(hf, tmp_path))
    inv_hosts = inventory.load(hf)
    rid = jobs.new_run_id("t") + "-grpnew"
    other = tmp_path / "other-lr.yaml"
    other.write_text(Path("configs/demo.yaml").read_text().replace("lr: 5.0e-3", "lr: 1.0e-3"))
    args = ["train", "--host", "@pod", "--hosts", gpu_hf, "--run-id", rid, "--dataset", str(work / "data" / "pipe"),
            "--verifier", f"{work}/models/tiny-llama", "--max-steps", "1", "--no-serve-check"]  # (no GPU)

    def starts(t):
        return json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))["starts"]

    with connect(inv_hosts.get("node0")) as t0, connect(inv_hosts.get("node1")) as t1:
        # (--config demo.yaml: its draft vocab fits the tiny verifier's)
        r = inv(*args, "--config", "configs/demo.yaml", "--follow")
        assert r.returncode != 0
        assert f"train {rid} started on 2 nodes: node0 (rank 0), node1 (rank 1)" in r.stdout
        first = r.stderr.strip().splitlines()[0]
        assert first.startswith(f"specops: train {rid}: not every node succeeded (") and "'node1': 'failed (exit" \
            in first
        assert "; node0: " in first and "accelerator" in first, first  # the error the rank died of
        assert "--- node0 (rank 0)" in r.stderr and "--- node1 (rank 1)" in r.stderr, r.stderr[-3000:]
        for i, t in enumerate((t0, t1)):
            wait_for(lambda t=t: jobs.status(t, rid)[0].ended, 120, f"{rid} to end on {t.host.name}")
            assert jobs.status(t, rid)[0].state == "failed", t.host.name
            assert len(starts(t)) == 1, t.host.name
            cmd = json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))["command"]
            assert cmd[cmd.index("--nnodes"):cmd.index("--nnodes") + 4] == ["--nnodes", "2", "--node-rank", str(i)]
        for extra in (["--dry-run"], []):
            r = inv(*args, "--config", str(other), *extra)
            assert r.returncode != 0, r.stdout[-2000:]
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
            assert lines[0].startswith(f"specops: run {rid} on node0 was trained on other data or settings "
                                       f"(lr 0.005 -> 0.001): resuming it mixes them in one run; pass "
                                       f"--continue-on-new-data"), lines[0]
            assert "(nothing was started)" in lines[0]
            assert "started on 2 nodes" not in r.stdout
            for t in (t0, t1):
                assert len(starts(t)) == 1, t.host.name  # (nothing appended, nothing replaced)
                assert starts(t)[0]["config"]["lr"] == 0.005
        r = inv(*args, "--config", str(other), "--continue-on-new-data")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert f"train {rid} started on 2 nodes: node0 (rank 0), node1 (rank 1)" in r.stdout
        for t in (t0, t1):
            wait_for(lambda t=t: jobs.status(t, rid)[0].ended, 120, f"{rid} to end on {t.host.name}")
            s = starts(t)
            assert len(s) == 2, (t.host.name, s)
            assert s[0]["config"]["lr"] == 0.005 and s[0]["changed"] == []
            assert s[1]["config"]["lr"] == 0.001 and s[1]["changed"] == ["lr 0.005 -> 0.001"], s[1]
