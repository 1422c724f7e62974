"""Online hidden states (issue 13) and verifier-regenerated responses, for real over the loopback
sshd in the cpu venv: `train --hidden-states online` runs the verifier's vLLM extraction server
beside the trainer as one job (no hidden-state file written into the dataset, the server gone
afterwards); `stop` saves checkpoints/interrupted and leaves no process of either; a resumed
run starts its server again; a server that dies fails the run with one line; `auto` picks
offline when the files are there and online when they would not fit the disk budget;
`regenerate` writes one verifier response per prompt.

(The task flags are wired in tasks.py by the lead: these tests call the library, as the tasks
will, through a real SSH connection.)"""

import json
import re
import time

import pytest

from conftest import LAYERS, demo_conversations, wait_for
from specops import inventory, synth
from specops.ops import jobs
from specops.ops import regenerate as regen
from specops.ops import train
from specops.host.connection import connect
from specops.errors import SpecopsError
from specops_host import contract
from specops_host.train import online

FAST = ["--enforce-eager"]  # (vLLM without torch.compile: its CPU server starts in ~30 s, not minutes)

LONG = """train:
  speculator-type: eagle3
  draft-vocab-size: 128
  epochs: 200
  total-seq-len: 512
  num-workers: 0
  on-missing: raise
  log-freq: 1
  request-timeout: 30
  max-retries: 1
profiles:
  cpu: {draft-attn-impl: sdpa, loss-implementation: eager}
"""


# -- the plan's pure parts (no host) ----------------------------------------------------------

class Args:
    def __init__(self, **kw):
        self.__dict__.update(dict(kind="cuda", gpus=8, server_gpus=None, train_gpus=None, nproc=None,
                                  tensor_parallel=8), **kw)


def test_gpu_split_half_and_half_explicit_and_shared():
    Refused = contract.Refused
    s = online.gpu_split(Args())
    assert (s["server_gpus"], s["train_gpus"], s["tensor_parallel"], s["nproc"]) == ("0,1,2,3", "4,5,6,7", 4, 4)
    s = online.gpu_split(Args(server_gpus="0-5", train_gpus="6,7"))
    assert (s["server_gpus"], s["train_gpus"], s["tensor_parallel"], s["nproc"]) == ("0,1,2,3,4,5", "6,7", 6, 2)
    s = online.gpu_split(Args(train_gpus="7"))  # (the server gets the rest)
    assert s["server_gpus"] == "0,1,2,3,4,5,6" and s["train_gpus"] == "7"
    s = online.gpu_split(Args(gpus=1, tensor_parallel=1))
    assert s["shared"] and s["server_gpus"] == s["train_gpus"] == "0" and s["notes"]
    with pytest.raises(Refused, match="the trainer has 4 GPU"):
        online.gpu_split(Args(nproc=5))
    with pytest.raises(Refused, match="the host has 8 GPU"):
        online.gpu_split(Args(server_gpus="0-3", train_gpus="8-9"))
    with pytest.raises(Refused, match="CUDA_VISIBLE_DEVICES"):
        online.parse_gpus("3-1", "--server-gpus")
    with pytest.raises(Refused, match="a cpu host has no GPUs"):
        online.gpu_split(Args(kind="cpu", server_gpus="0"))
    s = online.gpu_split(Args(kind="cpu", gpus=None, tensor_parallel=1))
    assert s["server_gpus"] is None and s["nproc"] == 1


def test_decide_says_which_and_why_with_both_numbers():
    facts = {"rows": 100000, "files": 0, "file_bytes": 0, "missing": 100000, "need_bytes": 28 * 2**20 * 100000}
    mode, why = online.decide("auto", facts, 2**40, "1.10 TiB free at /data, less 10%")
    assert mode == "online" and "need 2.67 TiB" in why and "over the disk budget of 1.00 TiB" in why, why
    mode, why = online.decide("auto", {**facts, "need_bytes": 2**30}, 2**40, "x")
    assert mode == "offline" and "within the disk budget" in why
    mode, why = online.decide("auto", {**facts, "files": 100000, "missing": 0, "file_bytes": 2**41}, 0, "x")
    assert mode == "offline" and "all 100000 rows have their hidden-state file (2.00 TiB)" in why


# -- over the real sshd, in the cpu venv ---------------------------------------------------------

def hs_count(t, data):
    return int(t.check(f"ls {data}/hidden_states 2>/dev/null | grep -c '^hs_.*safetensors$' || true",
                       "count hidden-state files").stdout.strip() or 0)


def alive_in_group(t, pgid):
    return [ln for ln in t.run("ps -eo pgid=,stat=,args=").stdout.splitlines()
            if ln.split() and ln.split()[0] == str(pgid) and not ln.split()[1].startswith("Z")]


def groups_of(t, rid):
    """(trainer job's pgid, server sub-job's pgid) of a run."""
    job = json.loads(t.read_bytes(jobs.run_path(t, rid, "job.json")))
    srv = json.loads(t.read_bytes(jobs.run_path(t, rid, "server", "job.json")))
    return job["pgid"], srv["pgid"]


@pytest.fixture(scope="module")
def half(pipeline_run, hosts_file, work):
    """`pipe` with every other row's hidden-state file removed (the odd rows: generated online)."""
    src, dst = work / "data" / "pipe", work / "data" / "pipe-half"
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        rows = hs_count(t, src)
        t.check(f"rm -rf {dst} && cp -r {src} {dst} && cd {dst}/hidden_states && "
                f"for f in hs_*.safetensors; do i=${{f#hs_}}; i=${{i%.safetensors}}; "
                f"[ $((i % 2)) -eq 1 ] && rm $f; done; true", "copy the dataset, half of its files")
        assert hs_count(t, dst) == (rows + 1) // 2
    return {"path": str(dst), "rows": rows, "missing": rows // 2}


def test_auto_picks_offline_when_the_files_are_there_and_online_over_budget(half, hosts_file, work, verifier,
                                                                               tmp_path):
    h = inventory.load(str(hosts_file)).get("box")
    rows, half = half["rows"], half["path"]
    with connect(h) as t:
        full = f"{work}/data/pipe"
        p = train.hidden_states_plan(t, data=full, verifier=verifier, disk_budget_gb=0)
        assert p["mode"] == "offline" and p["reason"].startswith(f"all {rows} rows have their hidden-state file"), p
        # the missing half fits the free disk: offline, and `train` asks for `extract` first
        p = train.hidden_states_plan(t, data=half, verifier=verifier)
        assert p["mode"] == "offline" and "within the disk budget" in p["reason"] and p["missing"] == rows // 2, p
        with pytest.raises(SpecopsError, match=r"hidden states: offline .*inv extract .*--hidden-states online"):
            train.train(t, config="configs/demo.yaml", run_id="t-auto-refused", dataset=half, verifier=verifier)
        assert not t.exists(jobs.run_path(t, "t-auto-refused"))
        # over a budget: online; the note says which and why, with both numbers
        p = train.hidden_states_plan(t, data=half, verifier=verifier, disk_budget_gb=0.0001)
        assert p["mode"] == "online" and "over the disk budget of 104.9 KiB (--disk-budget)" in p["reason"], p
        assert p["server"]["layer_ids"] == [1, 3, 4, 6] and p["server"]["max_model_len"] == p["longest"] + 1
        # rows that claim more tokens than the disk holds (the Kimi case): online on the real free space
        synth.write_dataset(tmp_path / "huge", [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}],
                            seq_lens=[10**12])
        t.sync_up(str(tmp_path / "huge"), f"{work}/data/huge-online")
        # (its row of 10**12 tokens is past the tiny verifier's 2048 positions: refused before any server)
        with pytest.raises(SpecopsError, match=r"--max-model-len 1000000000001, but the verifier holds 2048 positions"):
            train.hidden_states_plan(t, data=f"{work}/data/huge-online", verifier=verifier, layers=LAYERS)
        # (a verifier of enough positions: the plan's decision by the disk)
        long_v = f"{work}/models/tiny-long-positions"
        t.check(f"rm -rf {long_v} && cp -r {verifier} {long_v} && sed -i 's/\"max_position_embeddings\": 2048/"
                f"\"max_position_embeddings\": 2000000000000/' {long_v}/config.json", "the long verifier")
        p = train.hidden_states_plan(t, data=f"{work}/data/huge-online", verifier=long_v, layers=LAYERS)
        assert p["mode"] == "online" and "over the disk budget" in p["reason"] and "free at" in p["reason"], p
        # an online run's layers must match the files already there
        with pytest.raises(SpecopsError, match=r"hold layers \[1, 3, 4, 6\], this run asks for \[1, 2, 4, 6\]"):
            train.hidden_states_plan(t, data=half, verifier=verifier, mode="online", layers="1,2,4,6")
        with pytest.raises(SpecopsError, match="a cpu host has no GPUs"):
            train.hidden_states_plan(t, data=half, verifier=verifier, mode="online", server_gpus="0")


def test_online_stop_then_resume_then_a_dying_server_fails_it_with_one_line(half, hosts_file, work, verifier,
                                                                            tmp_path):
    """An online run stopped (checkpoints/interrupted, no process of either left, nothing written into the
    dataset), then started again: its server starts again, then its trainer steps; then its server
    SIGKILLed: the run fails (not hangs) with one VLLMServerError line, nothing of it left. (A dying server ends
    the resumed start, not a third one of its own: one server and one trainer start fewer; an online run that
    completes: test_pipeline_regenerate_then_online, test_slurm.py's test_online_training_in_one_allocation.)"""
    cfg = tmp_path / "long.yaml"
    cfg.write_text(LONG)
    rid = "t-online-" + str(int(time.time()))
    h = inventory.load(str(hosts_file)).get("box")
    missing, half = half["missing"], half["path"]
    with connect(h) as t:
        before = hs_count(t, half)
        res = train.train(t, config=str(cfg), run_id=rid, dataset=half, verifier=verifier, hidden_states="online",
                          vllm_arg=FAST)
        assert res["hidden_states"] == "online" and res["exit_code"] is None
        assert any(n.text.startswith(f"hidden states: online: the {missing} row(s) without a file") for n in t.notes)
        log = jobs.run_path(t, rid, "output.log")
        wait_for(lambda: (t.read_bytes(log) or b"").count(b"train/loss=") >= 2, 300, "two online training steps")
        spec = json.loads(t.read_bytes(jobs.run_path(t, rid, "train-spec.json")))
        assert spec["flags"]["on-missing"] == "generate"
        assert hs_count(t, half) == before  # (generated rows are never written into the dataset)
        train_pgid, server_pgid = groups_of(t, rid)

        st = jobs.stop(t, rid, grace=120)
        assert st.state == "stopped" and not st.sigkill, st
        assert t.exists(jobs.run_path(t, rid, "checkpoints", "interrupted", "model.safetensors"), "-f")
        assert alive_in_group(t, train_pgid) == [] and alive_in_group(t, server_pgid) == []
        full = t.read_bytes(log).decode(errors="replace")
        assert full.index("interrupting training to save checkpoint") < full.index("vLLM server stopped")
        assert not t.exists(f"{work}/.specops/hs-stage/{rid}")
        steps = full.count("train/loss=")

        # the same run again (another config: asked for): its server starts again, then its trainer
        res = train.train(t, config="configs/demo.yaml", run_id=rid, dataset=half, verifier=verifier,
                          hidden_states="online", vllm_arg=FAST, overrides={"epochs": 200},
                          continue_on_new_data=True)
        assert res["exit_code"] is None
        wait_for(lambda: (t.read_bytes(log) or b"").count(b"train/loss=") > steps, 300, "a resumed online step")
        full = t.read_bytes(log).decode(errors="replace")
        assert full.count("vLLM server healthy after") == 2
        rec = json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))
        assert rec["hidden_states"]["mode"] == "online" and len(rec["starts"]) == 2

        # its server dies (SIGKILL): the run fails with one line, the trainer and the server's group gone
        train_pgid, server_pgid = groups_of(t, rid)
        server = json.loads(t.read_bytes(jobs.run_path(t, rid, "server", "job.json")))["child_pid"]
        t0 = time.time()
        t.check(f"kill -9 {server}", "killing the vLLM server")
        j = jobs.wait_ended(t, rid, 180)
        assert j.ended and time.time() - t0 < 150, "the run hung after its server died"
        assert j.state == "failed", j.describe
        assert j.error.startswith("VLLMServerError: the vLLM server exited (killed, signal 9) during training"), j.error
        assert "\n" not in j.error and "log tail:" in j.error
        assert alive_in_group(t, train_pgid) == [] and alive_in_group(t, server_pgid) == []
        with pytest.raises(SpecopsError, match="VLLMServerError"):
            raise jobs.failure(t, rid, "train")
        assert hs_count(t, half) == before


def test_regenerate_writes_one_verifier_response_per_prompt(verifier, hosts_file, work, tmp_path):
    prompts = demo_conversations(tmp_path / "prompts.jsonl", n=6)
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        res = regen.regenerate(t, data=str(prompts), out="t-regen", verifier=verifier, max_tokens=16,
                               vllm_arg=FAST)
        assert res["out"] == f"{work}/regenerated/t-regen.jsonl" and res["prompts"] == 6
        rows = [json.loads(x) for x in t.read_bytes(res["out"]).decode().splitlines()]
        # no --sampling-params and a generation_config.json without sampling: greedy, said, and carried by
        # every request (vLLM's implicit temperature 1.0 never applies); the answers cut at the cap counted
        assert res["sampling"] == {"temperature": 0.0} and all(
            r["metadata"]["sampling_params"] == {"temperature": 0.0} for r in rows), rows[0]["metadata"]
        log = t.read_bytes(jobs.run_path(t, res["run_id"], "output.log")).decode()
        assert re.search(r"\[specops\] sampling: greedy \(temperature 0\) \(greedy: the verifier's generation_config"
                         r"\.json (says do_sample false|sets no sampling); --sampling-params sets another\); answers "
                         r"capped at 16 tokens \(--max-tokens\)", log), log[:3000]
        assert res["cut"] == sum(r["metadata"]["finish_reason"] == "length" for r in rows) and res["cut"] >= 1
        assert re.search(r"\[specops\] regenerate: 6 of 6 prompts answered, [\d.]+/s, done in \d+s", log), log[-2000:]
        assert res["quality"].startswith(f"{res['cut']} of {len(rows)} answers cut at the cap (16 tokens)")
        # one row per prompt: each its verifier's response (a random-weights verifier may answer one prompt
        # with byte pieces that decode to no text: speculators records that prompt as an error instead)
        errs = (t.read_bytes(res["errors_file"]) or b"").decode().splitlines()
        assert len(rows) + len(errs) == 6 and len(rows) >= 4, (rows, errs)
        assert all("empty assistant generation" in json.loads(e)["metadata"]["error"] for e in errs)
        assert len({r["primary_id"] for r in rows}) == len(rows)
        src = [json.loads(x) for x in prompts.read_text().splitlines()]
        for r in rows:
            m = r["loss_mask"]
            k = m.index(1)
            assert set(m[:k]) == {0} and set(m[k:]) == {1} and 1 <= len(m) - k <= 16
            assert len(r["input_ids"]) == len(m)
            assert "<|start_header_id|>assistant<|end_header_id|>" in r["text"]
            original = src[r["metadata"]["idx"]]["conversations"]
            assert next(x["content"] for x in original if x["role"] == "user") in r["text"]
            assert next(x["content"] for x in original if x["role"] == "assistant") not in r["text"]
        # the output is whole or absent: the same name again is refused before anything starts
        with pytest.raises(SpecopsError, match="exists: pick another --out name"):
            regen.regenerate(t, data=str(prompts), out="t-regen", verifier=verifier)
        assert res["next"].startswith("inv prepare-data --data ") and res["out"] in res["next"]


def test_regenerate_default_name():
    assert regen.default_name("/x/my convs.v2.jsonl") == "my_convs-regen"
    assert regen.default_name(".hidden.jsonl") == "data-regen"


def test_pipeline_regenerate_then_online(verifier, hosts_file, work, tmp_path):
    """`inv pipeline --regenerate --hidden-states online`: the verifier answers the prompts, those
    rows are prepared (pre-tokenised: no render server) and trained on online to the run's end (its server
    stopped with the trainer, nothing of it left); nothing extracted."""
    from conftest import inv

    convs = demo_conversations(tmp_path / "pipe-online.jsonl", n=8, seed=5)
    r = inv("pipeline", "--host", "box", "--hosts", str(hosts_file), "--data", str(convs), "--dataset", "pipe-online",
            "--verifier", verifier, "--layers", LAYERS, "--seq-length", "256", "--config", "configs/demo.yaml",
            "--dest", str(tmp_path / "runs"), "--max-steps", "2", "--regenerate", "--hidden-states", "online",
            "--vllm-arg=--enforce-eager")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert "regenerated:" in r.stdout and "hidden states online" in r.stdout, r.stdout[-3000:]
    rid = r.stdout.split("pipeline done: run ", 1)[1].split()[0]
    assert any(p.name.isdigit() for p in (tmp_path / "runs" / rid / "checkpoints").iterdir())
    # the same pipeline again takes the regenerated rows it wrote (a dry run shows it: nothing else changes)
    again = inv("pipeline", "--host", "box", "--hosts", str(hosts_file), "--data", str(convs), "--dataset",
                "pipe-online", "--verifier", verifier, "--seq-length", "256", "--regenerate", "--hidden-states",
                "online", "--dry-run")
    assert again.returncode == 0 and "regenerated rows of an earlier run reused" in again.stdout, again.stdout[-3000:]
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        spec = json.loads(t.read_bytes(jobs.run_path(t, rid, "train-spec.json")))
        assert spec["hidden_states"] == "online"
        # the online run completed: its server stopped with the trainer, nothing of it left
        assert jobs.status(t, rid)[0].state == "succeeded"
        _, server_pgid = groups_of(t, rid)
        assert alive_in_group(t, server_pgid) == []
        assert not t.exists(f"{work}/.specops/hs-stage/{rid}")
        left = t.run(f"find {work}/data/pipe-online -name '*.safetensors' 2>/dev/null | wc -l", changes=False)
        assert left.stdout.strip() == "0", left.stdout
