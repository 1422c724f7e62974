"""evaluate over the real sshd: vLLM (CPU build) serves the tiny verifier with the run's EAGLE-3
draft; the acceptance counters come from the real /metrics endpoint and must move."""

import json
import re

import pytest

from conftest import inv


def test_evaluate_reads_real_spec_decode_counters(pipeline_run, hosts_file, tmp_path):
    rid = pipeline_run["run_id"]
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--max-prompts", "4",
            "--max-tokens", "16", "--dest", str(tmp_path), env={"SPECOPS_PROGRESS_EVERY": "0.1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    # never silent (a line every 0.1 s here): prompts answered so far, then the speedup's requests
    done = [int(m.group(1)) for m in re.finditer(r"^\[specops\] evaluate: (\d+) of 4 prompts answered "
                                                 r"\(\d+ tokens, \d+s\); mean acceptance length so far [\d.]+$",
                                                 r.stdout, re.M)]
    assert done and done == sorted(done) and max(done) < 4, r.stdout[-3000:]
    assert re.search(r"^\[specops\] speedup, with the draft: \d+ of 16 requests answered at concurrency 1 ",
                     r.stdout, re.M), r.stdout[-3000:]
    ev = json.loads((tmp_path / rid / "evaluation.json").read_text())
    c = ev["counters"]
    assert c["drafts"] > 0 and c["draft_tokens"] == 3 * c["drafts"]
    assert len(ev["acceptance_by_position"]) == 3 and ev["mean_acceptance_length"] >= 1.0
    assert ev["prompt_source"]["source"].startswith("validation split")
    assert set(ev["training_accuracy"]["full"]) == {"0", "1", "2"}  # JSON keys
    assert (tmp_path / rid / "acceptance.png").stat().st_size > 1000
    assert "mean acceptance length" in r.stdout
    # the speedup (default 1,16): the same draft server timed, then the verifier alone, same prompts
    sp = ev["speedup"]
    assert set(sp["by_concurrency"]) == {"1", "16"} and sp["max_tokens"] == 16 and sp["requests"] == 16
    for c, v in sp["by_concurrency"].items():
        assert v["draft_tokens_per_s"] > 0 and v["baseline_tokens_per_s"] > 0, sp
        assert v["ratio"] == pytest.approx(v["draft_tokens_per_s"] / v["baseline_tokens_per_s"], rel=1e-2), sp
        assert v["draft_completion_tokens"] == v["baseline_completion_tokens"] == 16 * 16, sp  # ignore_eos
    assert ev["speedup_at_1"] == sp["by_concurrency"]["1"]["ratio"]
    assert sp["settings"].startswith("cpu: ") and sp["cuda_graphs"] is False and "below 1" in sp["note"]
    assert "speedup: output tokens/s of the verifier with the draft over without it" in r.stdout
    print(f"speedup on CPU: {json.dumps(sp['by_concurrency'])}")


def test_evaluate_dry_run_shows_the_server_command(pipeline_run, hosts_file, tmp_path):
    """--dry-run checks the run and prints the exact vLLM command (with the host's tensor parallel
    and the run's --vllm-arg last), starting nothing."""
    rid = pipeline_run["run_id"]
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run",
            "--vllm-arg=--enforce-eager", "--dest", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    starts = [ln for ln in r.stdout.splitlines() if "would start:" in ln and "vllm.entrypoints" in ln]
    assert len(starts) == 2, starts  # the server with the draft, then the speedup's baseline without it
    cmd, base = starts
    assert "--tensor-parallel-size 1" in cmd and "eagle3" in cmd and cmd.rstrip().endswith("--enforce-eager"), cmd
    assert "the verifier without the draft" in base and "--speculative" not in base, base
    assert base.split("would start: ")[1] == cmd.split("would start: ")[1].replace(
        cmd[cmd.index(" --speculative_config"):cmd.index(" --enforce-eager")], ""), (cmd, base)
    assert "nothing was changed" in r.stdout and not (tmp_path / rid).exists()
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run", "--speedup", "none")
    assert r.returncode == 0 and len([ln for ln in r.stdout.splitlines() if "would start:" in ln]) == 1, r.stdout
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run", "--speedup", "1,x")
    assert r.returncode == 1 and r.stderr.strip() == "specops: --speedup '1,x': give concurrent request counts " \
                                                      "(1-1024) such as 1,16, or none", r.stderr
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run",
            "--vllm-arg=--port=1")
    assert r.returncode == 1 and "specops sets --port itself" in r.stderr, r.stderr


def test_metrics_parsing_and_acceptance_math():
    from specops_host.serve import evaluate as ev_mod

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


def test_speedup_levels_and_record():
    from specops_host.serve import evaluate as ev_mod

    from specops.contract import concurrency_levels
    from specops.errors import SpecopsError

    assert concurrency_levels("1,16") == [1, 16] and concurrency_levels(" 16, 1,16 ") == [16, 1]
    assert concurrency_levels("none") == concurrency_levels("off") == concurrency_levels("0") == []
    for bad in ("", "1,", "a", "-1", "0,4", "2000", "1.5"):
        with pytest.raises(SpecopsError, match="give concurrent request counts"):
            concurrency_levels(bad)
    prompts = [{"prompt": [1, 2]}, {"prompt": [3]}, {"prompt": "x"}]
    assert ev_mod.speedup_requests(prompts, [1, 4]) == [[1, 2], [3], "x", [1, 2]]
    draft = {1: {"requests": 4, "completion_tokens": 64, "seconds": 2.0, "tokens_per_s": 32.0},
             4: {"requests": 4, "completion_tokens": 64, "seconds": 0.5, "tokens_per_s": 128.0}}
    base = {1: {"requests": 4, "completion_tokens": 64, "seconds": 1.0, "tokens_per_s": 64.0},
            4: {"requests": 4, "completion_tokens": 64, "seconds": 0.4, "tokens_per_s": 160.0}}
    argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    sp = ev_mod.speedup(draft, base, kind="cuda", argv=argv, max_tokens=16, prompts=3, requests=4)
    assert sp["by_concurrency"]["1"] == {"draft_tokens_per_s": 32.0, "baseline_tokens_per_s": 64.0, "ratio": 0.5,
                                         "draft_completion_tokens": 64, "baseline_completion_tokens": 64,
                                         "draft_seconds": 2.0, "baseline_seconds": 1.0}
    assert sp["by_concurrency"]["4"]["ratio"] == 0.8 and list(sp["by_concurrency"]) == ["1", "4"]
    assert sp["cuda_graphs"] is True and sp["settings"].startswith("cuda: CUDA graphs") and "note" not in sp
    eager = ev_mod.speedup(draft, base, kind="cuda", argv=argv + ["--enforce_eager"], max_tokens=16, prompts=3,
                           requests=4)
    assert eager["cuda_graphs"] is False and "eager" in eager["settings"]
    cpu = ev_mod.speedup(draft, base, kind="cpu", argv=argv, max_tokens=16, prompts=3, requests=4)
    assert cpu["cuda_graphs"] is False and "can be below 1" in cpu["note"]


def test_gap_is_flagged():
    from specops.ops.evaluate import gap_flags

    ev = {"conditional_acceptance_by_position": [0.05, 0.0, 0.0]}
    flags = gap_flags(ev, {"cond": {0: 0.7, 1: 0.5, 2: 0.01}})
    assert len(flags) == 2 and flags[0].startswith("position 0: served acceptance 0.05 vs training cond_acc 0.70")


def test_evaluate_each_checkpoint_pick_then_fetch_best_served(pipeline_run, hosts_file, tmp_path):
    """--checkpoints all serves each checkpoint in turn (one entry each in evaluation.json, the best
    one's figures on top, acceptance.png); --pick writes the argmax into the run's record on the
    host, whole; fetch --checkpoint best-served brings that checkpoint and not the other. The
    refusals (both flags, an unknown checkpoint, no pick yet) are one line, before any server."""
    from specops import inventory
    from specops.ops import jobs
    from specops.host.connection import connect

    src = pipeline_run["run_id"]
    rid = src + "-ckpts"  # a copy of the run (its records, logs, two checkpoints): the pick stays off the shared run
    box = ["--host", "box", "--hosts", str(hosts_file)]
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        a, b = jobs.run_path(t, src), jobs.run_path(t, rid)
        t.check(f"rm -rf {b} && mkdir -p {b}/checkpoints && cp -a {a}/train-spec.json {a}/run.json {a}/logs {b}/",
                "copy the run")
        have = sorted((x for x in t.run(f"ls {a}/checkpoints").stdout.split() if x.isdigit()), key=int)
        assert have, "the pipeline run saved no checkpoint"
        names = have[:2] if len(have) > 1 else [have[0], "99"]  # (one checkpoint only: a copy of it, named 99)
        for n, frm in zip(names, have[:2] if len(have) > 1 else [have[0], have[0]]):
            t.check(f"cp -a {a}/checkpoints/{frm} {b}/checkpoints/{n}", "copy a checkpoint")
        record_before = json.loads(t.read_bytes(f"{b}/run.json"))

    def one_line_refusal(r, want):
        assert r.returncode != 0 and want in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr

    one_line_refusal(inv("evaluate", *box, "--run-id", rid, "--checkpoint", names[0], "--checkpoints", "all"),
                     "not both")
    one_line_refusal(inv("evaluate", *box, "--run-id", rid, "--checkpoints", f"{names[0]},77"), "no checkpoint '77'")
    one_line_refusal(inv("evaluate", *box, "--run-id", rid, "--pick"), "--pick chooses among checkpoints")
    one_line_refusal(inv("fetch", *box, "--run-id", rid, "--checkpoint", "best-served", "--dest", str(tmp_path)),
                     f"has no served pick recorded: run `inv evaluate --run-id {rid} --checkpoints all --pick")
    r = inv("evaluate", *box, "--run-id", rid, "--checkpoints", "all", "--pick", "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    starts = [ln for ln in r.stdout.splitlines() if "would start:" in ln and "vllm.entrypoints" in ln]
    assert len(starts) == 2 and all(f"checkpoints/{n}" in s for n, s in zip(names, starts)), starts
    assert "would record the best" in r.stdout and "nothing was changed" in r.stdout

    r = inv("evaluate", *box, "--run-id", rid, "--checkpoints", "all", "--pick", "--max-prompts", "4",
            "--max-tokens", "16", "--vllm-arg=--enforce-eager", "--dest", str(tmp_path / "eval"))  # (eager: no
    # torch.compile warm-up, about 40 s less per server on 2 cores)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    ev = json.loads((tmp_path / "eval" / rid / "evaluation.json").read_text())
    entries = ev["checkpoints"]
    assert [e["checkpoint"] for e in entries] == names
    for e in entries:
        assert e["counters"]["drafts"] > 0 and len(e["acceptance_by_position"]) == 3
        assert 1.0 <= e["mean_acceptance_length"] <= 4.0 and e["prompts"] == 4
        assert e["val_accuracy"] is None or len(e["val_accuracy"]["full"]) == 3
    best = max(entries, key=lambda e: e["mean_acceptance_length"])  # (the first of equals, as evaluate picks)
    assert ev["best_checkpoint"] == best["checkpoint"]
    assert ev["mean_acceptance_length"] == best["mean_acceptance_length"] and ev["counters"] == best["counters"]
    assert (tmp_path / "eval" / rid / "acceptance.png").stat().st_size > 1000
    assert f"acceptance of {rid} per checkpoint" in r.stdout
    assert f"picked checkpoint {best['checkpoint']}: recorded as best_served" in r.stdout

    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        record = json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))
        leftovers = t.run(f"ls -a {jobs.run_path(t, rid)}").stdout.split()
        served = t.run(f"ls {jobs.run_path(t, rid, 'evaluation')}").stdout.split()
    pick = record.pop("best_served")
    assert record == record_before  # the rest of the record kept
    assert pick["checkpoint"] == best["checkpoint"] and pick["mean_acceptance_length"] == best["mean_acceptance_length"]
    assert pick["num_spec_tokens"] == 3 and pick["prompts"] == 4 and pick["evaluated"] == names
    assert not [x for x in leftovers if x.endswith((".tmp", ".part"))], leftovers  # written whole: no temp file left
    assert {f"checkpoint-{n}.json" for n in names} <= set(served)

    r = inv("fetch", *box, "--run-id", rid, "--checkpoint", "best-served", "--dest", str(tmp_path / "got"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    got = tmp_path / "got" / rid
    assert sorted(p.name for p in (got / "checkpoints").iterdir() if p.is_dir()) == [best["checkpoint"]]
    assert (got / "checkpoints" / best["checkpoint"] / "model.safetensors").is_file()
    assert (got / "run.json").is_file() and (got / "train-spec.json").is_file() and any((got / "logs").rglob("*"))
    assert f"checkpoint {best['checkpoint']} (best served" in r.stdout and "verified (sha256)" in r.stdout
