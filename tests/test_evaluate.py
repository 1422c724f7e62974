"""evaluate over the real sshd: vLLM (CPU build) serves the tiny verifier with the run's EAGLE-3
draft; the acceptance counters come from the real /metrics endpoint and must move."""

import json
import sys
from pathlib import Path

import pytest

from conftest import inv

pytestmark = [pytest.mark.integration, pytest.mark.heavy]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "remote"))


def test_evaluate_reads_real_spec_decode_counters(pipeline_run, hosts_file, tmp_path):
    rid = pipeline_run["run_id"]
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--max-prompts", "4",
            "--max-tokens", "16", "--dest", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    ev = json.loads((tmp_path / rid / "evaluation.json").read_text())
    c = ev["counters"]
    assert c["drafts"] > 0 and c["draft_tokens"] == 3 * c["drafts"]
    assert len(ev["acceptance_by_position"]) == 3 and ev["mean_acceptance_length"] >= 1.0
    assert ev["prompt_source"]["source"].startswith("validation split")
    assert set(ev["training_accuracy"]["full"]) == {"0", "1", "2"}  # JSON keys
    assert (tmp_path / rid / "acceptance.png").stat().st_size > 1000
    assert "mean acceptance length" in r.stdout


def test_evaluate_dry_run_shows_the_server_command(pipeline_run, hosts_file, tmp_path):
    """--dry-run checks the run and prints the exact vLLM command (with the host's tensor parallel
    and the run's --vllm-arg last), starting nothing."""
    rid = pipeline_run["run_id"]
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run",
            "--vllm-arg=--enforce-eager", "--dest", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    cmd = next(ln for ln in r.stdout.splitlines() if "would start:" in ln and "vllm.entrypoints" in ln)
    assert "--tensor-parallel-size 1" in cmd and "eagle3" in cmd and cmd.rstrip().endswith("--enforce-eager"), cmd
    assert "nothing was changed" in r.stdout and not (tmp_path / rid).exists()
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run",
            "--vllm-arg=--port=1")
    assert r.returncode == 1 and "specops sets --port itself" in r.stderr, r.stderr


def test_metrics_parsing_and_acceptance_math():
    import evaluate as ev_mod

    before = ev_mod.parse_metrics('vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 0.0\n')
    text = "\n".join([
        '# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 306.0',
        'vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny"} 1.7e9',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 918.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 4.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 2.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="1"} 1.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="2"} 1.0',
    ])
    after = ev_mod.parse_metrics(text)
    res = ev_mod.acceptance(before, after)
    assert res["counters"] == {"drafts": 306.0, "draft_tokens": 918.0, "accepted": 4.0}
    assert [round(x, 4) for x in res["acceptance_by_position"]] == [0.0065, 0.0033, 0.0033]
    assert res["conditional_acceptance_by_position"][1] == 0.5
    assert round(res["mean_acceptance_length"], 3) == 1.013


def test_gap_is_flagged():
    from specops.evaluate import gap_flags

    ev = {"conditional_acceptance_by_position": [0.05, 0.0, 0.0]}
    flags = gap_flags(ev, {"cond": {0: 0.7, 1: 0.5, 2: 0.01}})
    assert len(flags) == 2 and flags[0].startswith("position 0: served acceptance 0.05 vs training cond_acc 0.70")
