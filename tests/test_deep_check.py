"""`inv check --deep`: the error a failed training attempt died of, the settings tried, the
verdict on the host and the train gate that reads it; one real run on CPU (heavy)."""

import json

import pytest

from conftest import inv
from specops.ops import check
from specops import inventory
from specops.errors import SpecopsError
from specops.host.connection import connect

from specops_host.check import deep as deep_check


# What the H200 printed (speculators 0.9.0, torch 2.11.0, fused loss under torch.compile, torchrun).
H200_LOG = """$ /opt/torch/.venv/bin/python3 -m torch.distributed.run --nproc-per-node 1 --standalone -m speculators train
[rank0]: │   140 │   │   │   except TrainingInterruptedError:                                     │
[rank0]: │ ❱  418 │   │   │   raise AssertionError(                                               │
[rank0]: AssertionError: ListVariable(length=21) is already tracked for mutation. This could be because you are not using VariableBuilder
[rank0]: Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace
E1130 11:34:29.497000 3666 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed/launcher/api.py", line 317, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
"""


def test_first_error_finds_the_root_cause():
    assert deep_check.first_error(H200_LOG) == "AssertionError: ListVariable(length=21) is already tracked for mutation"
    chained = "torch._dynamo.exc.InternalTorchDynamoError: AssertionError: boom\n"
    assert deep_check.first_error(chained) == "AssertionError: boom"
    assert deep_check.first_error("all fine\n") is None


def test_candidates_start_with_the_configured_settings():
    h = inventory.Host(name="g", transport="local", profile="cuda")
    conf = check.settings_of({}, h)
    assert conf == {"draft-attn-impl": "simple_flex_attention", "loss-implementation": "fused", "compile": True}
    c = check.candidates(conf, "cuda")
    assert c[0] == conf and {"draft-attn-impl": "simple_flex_attention", "loss-implementation": "eager",
                             "compile": True} == c[1] and len(c) == len({json.dumps(x) for x in c}) == 5
    cpu = inventory.Host(name="c", transport="local", profile="cpu")
    assert check.settings_of({"draft-attn-impl": "sdpa", "loss-implementation": "eager"}, cpu)["compile"] is False


def test_train_gate_reads_the_hosts_verdict(tmp_path):
    h = inventory.Host(name="g", transport="local", profile="cuda", workdir=str(tmp_path))
    bad = {"draft-attn-impl": "simple_flex_attention", "loss-implementation": "fused", "compile": True}
    good = {**bad, "loss-implementation": "eager"}
    with connect(h) as t:
        check.refuse_failed_settings(t, {})  # no verdict yet: nothing to refuse
        (tmp_path / ".specops").mkdir()
        (tmp_path / ".specops" / "deep-check.json").write_text(json.dumps({
            "when": "2026-11-30T11:22:00", "works": good, "results": [
                {"settings": bad, "ok": False, "error": "AssertionError: ListVariable(length=21) is already tracked"},
                {"settings": good, "ok": True, "error": None}]}))
        with pytest.raises(SpecopsError, match="train refused on g: .*fused, compile on.*ListVariable.*these work: "
                                               "--draft-attn-impl simple_flex_attention --loss-implementation eager"):
            check.refuse_failed_settings(t, {})
        check.refuse_failed_settings(t, {"loss-implementation": "eager"})


def test_deep_check_on_cpu_finds_the_working_setting(tmp_path, cpu_box):
    """The real cpu-profile venv (the rig's, built once a run), driven through the local transport."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  cpu:\n    transport: local\n    profile: cpu\n    venv: {cpu_box['venv']}\n"
                     f"    workdir: {tmp_path / 'work'}\n")
    cfg = tmp_path / "flex.yaml"  # FlexAttention has no backward on CPU: the configured setting must fail
    cfg.write_text("train:\n  speculator-type: eagle3\n  draft-vocab-size: 256\nprofiles:\n  cpu: {}\n")
    r = inv("check", "--host", "cpu", "--hosts", str(hosts), "--deep", "--config", str(cfg), "--min-free-gb", "1",
            timeout=900)
    assert r.returncode != 0
    line = [x for x in r.stderr.splitlines() if x.startswith("specops:")][0]
    assert "fail a training step: NotImplementedError: FlexAttention does not support backward on CPU" in line
    assert "these work: --draft-attn-impl sdpa --loss-implementation eager, compile off" in line
    v = json.loads((tmp_path / "work" / ".specops" / "deep-check.json").read_text())
    assert [x["ok"] for x in v["results"]] == [False, True] and v["results"][1]["steps"] == 2
    with connect(inventory.load(str(hosts)).get("cpu")) as t:
        with pytest.raises(SpecopsError, match="train refused on cpu"):
            check.refuse_failed_settings(t, {"speculator-type": "eagle3"})
