"""The speedup's timing (remote/specops_host/serve/speedup.py): the exact `vllm bench serve` command lines
built, the sides of a sweep, which servers are up together, the order of the runs, the median /
spread / ratio kept, the best setting and its deployment line; the laptop's refusals, one line
before any server."""

import json

import pytest

from specops_host.serve import speedup as sp


def test_bench_command_line_is_vllm_bench_serve():
    args = sp.bench_args(url="http://127.0.0.1:8001", tokenizer="/m/v", dataset="/r/p.jsonl", level=4, requests=16,
                         tokens=64, result_dir="/r/bench", result_file="draft@4-r1.json", side="draft")
    assert sp.command(args) == (
        "vllm bench serve --backend vllm --base-url http://127.0.0.1:8001 --endpoint /v1/completions --model verifier "
        "--tokenizer /m/v --dataset-name custom --dataset-path /r/p.jsonl --skip-chat-template --custom-output-len 64 "
        "--ignore-eos --temperature 0 --num-prompts 16 --max-concurrency 4 --request-rate inf --num-warmups 4 "
        "--seed 0 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50 --disable-tqdm --save-result "
        "--result-dir /r/bench --result-filename draft@4-r1.json --metadata side=draft")
    assert "--trust-remote-code" in sp.bench_args(url="u", tokenizer="t", dataset="d", level=1, requests=1, tokens=1,
                                                  result_dir="r", result_file="f", trust_remote_code=True)
    assert sp.default_requests("cuda", 1) == 32 and sp.default_requests("cuda", 16) == 512
    assert sp.default_requests("cpu", 1) == 8 and sp.default_requests("cpu", 16) == 32
    assert sp.default_tokens("cuda", 64) == 256 and sp.default_tokens("cpu", 64) == 64


def vllm_tree(tmp_path, suffix=True):
    (tmp_path / "config").mkdir(parents=True)
    (tmp_path / "engine").mkdir()
    (tmp_path / "config" / "speculative.py").write_text('M = ("ngram", "suffix")' if suffix else 'M = ("ngram",)')
    (tmp_path / "engine" / "arg_utils.py").write_text("async_scheduling: bool = False")
    return tmp_path


def test_sides_of_a_sweep_and_what_is_skipped(tmp_path):
    draft = {"method": "eagle3", "model": "/c", "num_speculative_tokens": 3}
    sides, skipped = sp.sides(draft, baselines=["ngram", "suffix"], tune_k=[1, 2], tune_async=True,
                              vdir=vllm_tree(tmp_path))
    assert [s.name for s in sides] == ["baseline", "draft", "eagle3 k=1, async off", "eagle3 k=1, async on",
                                       "eagle3 k=2, async off", "eagle3 k=2, async on", "ngram"]
    assert sides[0].serve_args() == [] and sides[1].serve_args() == ["--speculative_config", json.dumps(draft)]
    assert sides[3].serve_args() == ["--speculative_config", json.dumps({**draft, "num_speculative_tokens": 1}),
                                     "--async-scheduling"]
    assert sides[2].args == ("--no-async-scheduling",)
    assert sides[-1].spec == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                              "prompt_lookup_min": 2}
    # (no arctic-inference in the test venv: suffix skipped, saying why; a vLLM without it: that)
    assert skipped == [{"method": "suffix", "why": sp.suffix_unavailable(tmp_path)}] and "arctic-inference" in \
        skipped[0]["why"]
    assert "no suffix method" in sp.suffix_unavailable(vllm_tree(tmp_path / "old", suffix=False))
    assert sp.has_async(tmp_path) and not sp.has_async(tmp_path / "nowhere")
    # (--tune-k without --tune: the draft's own k is the draft side, not a second server of the same setting)
    again, _ = sp.sides({**draft, "num_speculative_tokens": 5}, tune_k=[3, 5, 7], vdir=tmp_path)
    assert [s.name for s in again] == ["baseline", "draft", "eagle3 k=3", "eagle3 k=7"]


def test_which_servers_are_up_together_and_the_order_of_runs():
    b, d, t, n = (sp.Side("baseline", "baseline"), sp.Side("draft", "draft", {}), sp.Side("eagle3 k=1", "tune", {}),
                  sp.Side("ngram", "free", {}))
    names = lambda bs: [[s.name for s in x] for x in bs]  # noqa: E731
    assert sp.together_default("cpu") == 2 and sp.together_default("cuda") == 1 and sp.together_default("cuda", 3) == 3
    gib, h200 = 2 ** 30, 143771 * 2 ** 20
    assert sp.together_default("cuda", total=h200, weights=16 * gib) == 2  # (an 8B verifier: 46 GiB of KV each)
    assert sp.together_default("cuda", total=24 * gib, weights=2 * gib) == 2  # (a 1B on a 24 GiB GPU: 5.8 GiB each)
    assert sp.together_default("cuda", total=24 * gib, weights=16 * gib) == 1
    assert sp.together_default("cuda", total=h200, weights=600 * gib, tensor_parallel=8) == 1  # (Kimi-K2.5 on 8)
    assert sp.together_default("cuda", total=h200, weights=16 * gib, user_args=["--gpu-memory-utilization=0.8"]) == 1
    assert sp.together_default("cuda", 2, total=h200, weights=600 * gib, tensor_parallel=8) == 2  # (asked: as asked)
    assert names(sp.batches([b, d, t, n], 2)) == [["draft", "baseline"], ["eagle3 k=1", "baseline"],
                                                 ["ngram", "baseline"]]
    assert names(sp.batches([b, d, t, n], 1)) == [["draft"], ["baseline"], ["eagle3 k=1"], ["ngram"]]
    assert names(sp.batches([b, d, t, n], 3)) == [["draft", "eagle3 k=1", "baseline"], ["ngram", "baseline"]]
    assert names(sp.batches([b, d, t, n], 8)) == [["draft", "eagle3 k=1", "ngram", "baseline"]]
    urls = {"draft": "D", "baseline": "B"}
    runs = sp.plan([d, b], [1, 16], 2, urls=urls, file_for=lambda s, c, r: f"{s.name}@{c}-r{r + 1}.json",
                   args_for=lambda s, c, u, f: [u, str(c), f])
    assert [(r["side"], r["level"], r["repeat"]) for r in runs] == [
        ("draft", 1, 0), ("baseline", 1, 0), ("draft", 16, 0), ("baseline", 16, 0),  # repeat 1: draft first,
        ("baseline", 1, 1), ("draft", 1, 1), ("baseline", 16, 1), ("draft", 16, 1)]  # repeat 2: the other way
    assert runs[0]["args"] == ["D", "1", "draft@1-r1.json"] and runs[0]["name"] == "draft @1, repeat 1 of 2"


def fig(tps, tpot=5.0, acc=None):
    return {"output_tokens_per_s": tps, "tpot_ms": tpot, "itl_ms": tpot, "ttft_ms": 20.0, "completed": 8,
            "output_tokens": 512, "seconds": 1.0, "acceptance_length": acc, "acceptance_by_position": None}


def test_servers_sharing_a_gpu_get_a_memory_share_and_a_fixed_kv_cache(tmp_path):
    """--side-by-side N on a GPU: each server 0.9 / N of the memory and its KV cache set outright (its
    share less the weights and 3 GiB), so servers started together skip vLLM's memory profiling (it
    failed for two 8B servers started at once on an H200); what the user set is left alone."""
    gib = 2 ** 30
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "model-00001.safetensors").write_bytes(b"x" * 3000)
    (tmp_path / "v" / "config.json").write_text("{}")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "model.safetensors").write_bytes(b"x" * 1000)
    assert sp.weights_bytes(tmp_path / "v", tmp_path / "d", None) == 4000
    total, weights = 140 * gib, 16 * gib
    assert sp.shared_gpu_args(4, [], total=total, weights=weights) == [
        "--gpu-memory-utilization=0.23", f"--kv-cache-memory-bytes={int(140 * gib * 0.9 / 4 - 19 * gib)}"]
    assert sp.shared_gpu_args(4, [], total=total, weights=weights, tensor_parallel=2)[1] == \
        f"--kv-cache-memory-bytes={int(140 * gib * 0.9 / 4 - 11 * gib)}"
    assert sp.shared_gpu_args(8, [], total=20 * gib, weights=weights)[1] == f"--kv-cache-memory-bytes={gib}"  # (floor)
    assert sp.shared_gpu_args(1, [], total=total, weights=weights) == []
    assert sp.shared_gpu_args(2, ["--gpu-memory-utilization", "0.3"], total=total, weights=weights) == [
        f"--kv-cache-memory-bytes={int(140 * gib * 0.45 - 19 * gib)}"]
    assert sp.shared_gpu_args(2, ["--kv_cache_memory_bytes=8000000000"], total=total, weights=weights) == [
        "--gpu-memory-utilization=0.45"]
    assert sp.shared_gpu_args(2, [], total=None, weights=weights) == ["--gpu-memory-utilization=0.45"]


def test_median_spread_and_paired_ratio():
    b, d = sp.Side("baseline", "baseline"), sp.Side("draft", "draft", {"method": "eagle3"})
    runs, results = [], {}
    for r, (dt, bt) in enumerate([(120.0, 100.0), (150.0, 100.0), (130.0, 110.0)]):
        for side, v in (("draft", dt), ("baseline", bt)):
            f = f"{side}-{r}"
            runs.append({"side": side, "level": 1, "repeat": r, "batch": 0, "file": f})
            results[f] = fig(v, acc=2.5 if side == "draft" else None)
    rec = sp.record([b, d], runs, results, [1], paired=True)
    v = rec["draft"]["by_concurrency"]["1"]
    assert v["output_tokens_per_s"] == {"median": 130.0, "min": 120.0, "max": 150.0, "spread": 0.2308, "n": 3}
    # the median of the per-repeat ratios (1.2, 1.5, 1.182), not the ratio of the medians (1.3)
    assert v["ratio"]["median"] == 1.2 and v["ratio"]["min"] == 1.182 and v["ratio"]["max"] == 1.5
    assert v["noisy"] is True and v["acceptance_length"] == 2.5 and v["completed"] == 24
    assert v["files"] == ["draft-0", "draft-1", "draft-2"]
    base = rec["baseline"]["by_concurrency"]["1"]
    assert "ratio" not in base and base["output_tokens_per_s"]["median"] == 100.0 and base["noisy"] is True
    assert rec["draft"]["speculative_config"] == {"method": "eagle3"} and rec["baseline"]["role"] == "baseline"
    unpaired = sp.record([b, d], runs, results, [1], paired=False)["draft"]["by_concurrency"]["1"]["ratio"]
    assert unpaired == {"median": 1.3, "min": 1.3, "max": 1.3, "spread": 0.0, "n": 1}
    quiet = sp.record([b, d], runs[:2], results, [1], paired=True)["draft"]["by_concurrency"]["1"]
    assert quiet["noisy"] is False and quiet["output_tokens_per_s"]["spread"] == 0.0
    # a run of 1 s (fig()'s: one wave of 16 requests on an H100) is marked short on a GPU (SHORT_S), never on a CPU
    assert v["seconds"]["median"] == 1.0 and v["short"] is False
    gpu = sp.record([b, d], runs, results, [1], paired=True, short_s=sp.SHORT_S)
    assert gpu["draft"]["by_concurrency"]["1"]["short"] is True and gpu["baseline"]["by_concurrency"]["1"]["short"]


def test_a_figure_is_noisy_by_its_own_spread_and_drift_of_both_sides_cancels_in_a_paired_ratio():
    """The H200's 1B demo: both sides 6-8% slower in repeat 2, the paired ratio within 1.7%."""
    b, d = sp.Side("baseline", "baseline"), sp.Side("draft", "draft", {"method": "eagle3"})
    runs, results = [], {}
    for r, (dt, bt) in enumerate([(877.5, 442.1), (825.1, 408.6)]):
        for side, v in (("draft", dt), ("baseline", bt)):
            runs.append({"side": side, "level": 1, "repeat": r, "batch": 0, "file": f"{side}-{r}"})
            results[f"{side}-{r}"] = fig(v)
    rec = sp.record([b, d], runs, results, [1], paired=True)
    v, base = rec["draft"]["by_concurrency"]["1"], rec["baseline"]["by_concurrency"]["1"]
    assert v["output_tokens_per_s"]["spread"] == 0.0616 and base["output_tokens_per_s"]["spread"] == 0.0788
    assert v["ratio"]["spread"] == 0.0172 and v["noisy"] is False  # the figure: the paired ratio
    assert base["noisy"] is True  # its tokens/s, the baseline's figure, did move 7.9%
    # one ratio of the medians inherits both sides' spreads
    assert sp.record([b, d], runs, results, [1], paired=False)["draft"]["by_concurrency"]["1"]["noisy"] is True


def test_best_setting_per_level_and_its_deployment_line():
    rec = {"baseline": {"role": "baseline", "speculative_config": None, "vllm_args": [], "by_concurrency": {}},
           "draft": {"role": "draft", "speculative_config": {"method": "eagle3", "model": "/c", "num_speculative_tokens": 3},
                     "vllm_args": [], "by_concurrency": {
                         "1": {"output_tokens_per_s": {"median": 150.0}, "ratio": {"median": 1.5}},
                         "16": {"output_tokens_per_s": {"median": 900.0}, "ratio": {"median": 0.9}}}},
           "eagle3 k=1, async on": {"role": "tune", "speculative_config": {"method": "eagle3", "model": "/c",
                                                                           "num_speculative_tokens": 1},
                                    "vllm_args": ["--async-scheduling"], "by_concurrency": {
                                        "1": {"output_tokens_per_s": {"median": 130.0}, "ratio": {"median": 1.3}},
                                        "16": {"output_tokens_per_s": {"median": 1100.0}, "ratio": {"median": 1.1}}}},
           "ngram": {"role": "free", "speculative_config": {"method": "ngram"}, "vllm_args": [], "by_concurrency": {
               "1": {"output_tokens_per_s": {"median": 500.0}, "ratio": {"median": 5.0}}}}}

    def deploy(s):
        return sp.deploy_line("/m/v", s, tensor_parallel=2, user_args=["--max-num-seqs", "64"])

    best = sp.best(rec, [1, 16], deploy)
    assert best["1"]["side"] == "draft" and best["1"]["ratio"] == 1.5  # (a free method is no setting of the draft)
    assert best["16"]["side"] == "eagle3 k=1, async on" and best["16"]["output_tokens_per_s"] == 1100.0
    assert best["overall"]["side"] == "eagle3 k=1, async on"  # geometric mean 1.196 over 1.162
    assert best["overall"]["deploy"] == (
        "vllm serve /m/v --tensor-parallel-size 2 --speculative-config "
        "'{\"method\": \"eagle3\", \"model\": \"/c\", \"num_speculative_tokens\": 1}' --async-scheduling "
        "--max-num-seqs 64")


def test_laptop_timing_options_and_refusals(tmp_path):
    from specops.args import Refused
    from specops.ops import evaluate as ev

    assert ev.timing_args([1, 16]) == ["--repeats", "3"]
    assert ev.timing_args([1], repeats=1, tune=True, baselines="ngram", speedup_requests=4, speedup_tokens="16",
                          side_by_side="4") == [
        "--repeats", "1", "--tune-k", "1,2,3,4,5", "--tune-async", "--baselines", "ngram", "--speedup-requests", "4",
        "--speedup-tokens", "16", "--side-by-side", "4"]
    assert ev.timing_args([1], tune_k="2,3") == ["--repeats", "3", "--tune-k", "2,3"]  # (k only: no async sweep)
    # requests per level: N for every level, or LEVEL:N for some (a one-wave level at 16 is `short` on a GPU, while
    # its 1-request level at 16 requests already takes 25 s for an 8B on an H100)
    assert ev.timing_args([1, 16], speedup_requests=" 1:16, 16:64")[2:] == ["--speedup-requests", "1:16,16:64"]
    assert ev.timing_args([1, 16], speedup_requests="16:64")[2:] == ["--speedup-requests", "16:64"]
    assert ev.timing_args([1], tune=True, tune_k="2")[2:] == ["--tune-k", "2", "--tune-async"]
    check = ev.evaluate_run.refuse
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n{\"prompt\": \"\"}\n")
    notjson = tmp_path / "bad.jsonl"
    notjson.write_text("{\"prompt\": \"a\"}\nnot json\n")
    for kw, want in [
        ({"tune": True, "speedup": "none"}, "--tune times the draft's settings against the verifier alone: give "
                                            "--speedup levels (not none)"),
        ({"repeats": 0}, "--repeats 0: give 1 or more (each side timed that many times)"),
        ({"repeats": "-2"}, "--repeats -2: give 1 or more"),
        ({"speedup": "0,16"}, "--speedup '0,16': give concurrent request counts (1-1024) such as 1,16, or none"),
        ({"speedup": "0"}, "--speedup '0': give concurrent request counts (1-1024) such as 1,16, or none"),  # (not none)
        ({"baselines": "ngram", "speedup": "none"}, "--baselines ngram are timed: give --speedup levels (not none)"),
        ({"speedup_requests": "0"}, "--speedup-requests 0: give requests per level and side, 1 or more: N for "
                                    "every level, or LEVEL:N for some (e.g. 1:16,16:64; "),
        ({"speedup_requests": "1:16,16:0"}, "--speedup-requests 1:16,16:0: give requests per level and side"),
        ({"speedup_requests": "1:16,1:8"}, "--speedup-requests 1:16,1:8: give requests per level and side"),
        ({"speedup_requests": "8:64"}, "--speedup-requests 8:64: level 8 is not timed (--speedup 1,16): name the "
                                       "levels timed"),
        ({"baselines": "ngram,eagle"}, "--baselines ngram,eagle: the training-free methods are ngram, suffix (or none)"),
        ({"tune": True, "checkpoints": "all"}, "--tune measures one checkpoint's serving settings"),
        ({"prompts": str(empty)}, f"--prompts {empty}: no prompt in it"),
        ({"prompts": str(notjson)}, f"--prompts {notjson}: line 2 is not JSON"),
    ]:
        with pytest.raises(Refused) as e:
            check(run_id="r1", **kw)
        assert str(e.value).startswith(want) and "\n" not in str(e.value), (kw, str(e.value))
    check(run_id="r1", tune=True, repeats=1, baselines="ngram,suffix")  # (fine: nothing raised)


def test_host_refuses_bad_timing_options_in_one_line():
    import argparse

    from specops_host.contract import Refused
    from specops_host.serve import evaluate as host

    ap = argparse.ArgumentParser()
    host.speedup_options(ap)
    assert host.check_speedup_options(ap.parse_args(["--tune-k", "3,1,3", "--baselines", "suffix,ngram"]), [1]) == \
        ([3, 1], ["suffix", "ngram"])
    for given, want in (("", {}), ("0", {}), ("8", {1: 8, 16: 8}), ("16:64", {16: 64}), ("1:16,16:64", {1: 16, 16: 64})):
        a = ap.parse_args(["--speedup-requests", given])
        host.check_speedup_options(a, [1, 16])
        assert a.requests_given == want, (given, a.requests_given)
    for argv, levels, want in [
        (["--repeats", "0"], [1], "--repeats 0: give 1 or more"),
        (["--tune-k", "0,2"], [1], "--tune-k '0,2': give numbers 1-16 such as 1,2,3"),
        (["--baselines", "eagle"], [1], "--baselines 'eagle': the training-free methods are ngram, suffix"),
        (["--tune-k", "2"], [], "--tune and --baselines time the servers: give --speedup levels (not none)"),
        (["--speedup-requests", "1:4,16:x"], [1, 16], "--speedup-requests 1:4,16:x: give N (every level) or "
                                                       "LEVEL:N,... (e.g. 1:16,16:64), each 1 or more"),
        (["--speedup-requests", "4:8"], [1, 16], "--speedup-requests 4:8: level 4 is not timed (--speedup 1,16)"),
    ]:
        with pytest.raises(Refused, match="^" + want.replace("(", r"\(").replace(")", r"\)")):
            host.check_speedup_options(ap.parse_args(argv), levels)


def test_host_prompts_file_without_a_prompt(tmp_path):
    from specops_host.contract import Refused
    from specops_host.serve import evaluate as host

    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "hi"}\n\n{"input_ids": [1, 2]}\n')  # (a blank line is skipped)
    assert host.file_prompts(f, 8)[0] == [{"prompt": "hi"}, {"prompt": [1, 2]}]
    f.write_text('{"text": "hi"}\n{"prompt": ""}\n')
    with pytest.raises(Refused, match=r'line 2 holds no "prompt"'):
        host.file_prompts(f, 8)
    f.write_text("not json\n")
    with pytest.raises(Refused, match="line 1 is not JSON"):
        host.file_prompts(f, 8)
    f.write_text("\n")
    with pytest.raises(Refused, match="the file is empty"):
        host.file_prompts(f, 8)


def test_the_benchmarks_error_line_is_found(tmp_path):
    log = tmp_path / "bench.log"
    log.write_text("Starting...\nTraceback (most recent call last):\n  x\nValueError: JSONL file must contain a "
                   "'prompt' column.\nleaked type\n")
    assert sp.last_error(log) == "ValueError: JSONL file must contain a 'prompt' column."
    assert sp.last_error(tmp_path / "none") == ""


def test_a_side_whose_benchmark_failed_is_dropped_and_said_but_the_drafts_failure_ends_the_timing(tmp_path):
    """vllm_bench.py keeps a failed run's why in its result file ({"specops_error"}: a synthetic-acceptance server
    that died at its first request, say) and runs the rest; measure() drops that side, saying why, and stops where
    the draft's or the baseline's benchmark failed. The benchmark's process here: a stand-in interpreter that writes
    each run's result as vllm_bench.py does."""
    import sys
    from types import SimpleNamespace

    fake = tmp_path / "python"
    fake.write_text(f"""#!{sys.executable}
import json, sys
from pathlib import Path
for r in json.load(open(sys.argv[-1])):
    a = r["args"]
    out = Path(a[a.index("--result-dir") + 1]) / a[a.index("--result-filename") + 1]
    bad = r["side"] == open(Path(sys.argv[0]).with_name("fail")).read()
    out.write_text(json.dumps({{"specops_error": "ValueError: Initial test run failed"}} if bad else
                              {{"output_throughput": 100.0, "completed": 4, "total_output_tokens": 64}}))
""")
    fake.chmod(0o755)
    sides = [sp.Side("baseline", "baseline"), sp.Side("draft", "draft", {"num_speculative_tokens": 3}),
             sp.Side("synthetic 1", "ceiling", {"num_speculative_tokens": 3})]
    kw = dict(all_sides=sides, levels=[1], repeats=2, together=3, launch=None, wait=None, stop=lambda srv: None,
              dataset=tmp_path / "prompts.jsonl", tokenizer="t", trust_remote_code=False, requests_for=lambda c: 4,
              tokens=16, python=str(fake), ready={"draft", "baseline", "synthetic 1"})
    servers = {s.name: SimpleNamespace(url=f"http://x/{i}") for i, s in enumerate(sides)}
    (tmp_path / "fail").write_text("synthetic 1")
    runs, results, failed = sp.measure(up=dict(servers), out_dir=tmp_path / "a", **kw)
    assert failed == [{"side": "synthetic 1", "why": "vllm bench serve failed: ValueError: Initial test run failed"}]
    assert sorted({r["side"] for r in runs}) == ["baseline", "draft"] and len(runs) == len(results) == 4
    (tmp_path / "fail").write_text("draft")
    with pytest.raises(SystemExit, match=r"^speedup: draft: vllm bench serve failed: ValueError: Initial test run "
                                         r"failed \(its log: "):
        sp.measure(up=dict(servers), out_dir=tmp_path / "b", **kw)


def test_the_table_says_when_the_machine_drifted_and_when_a_figure_is_not_a_result_yet(capsys):
    from specops import views

    by = {"1": {"draft_tokens_per_s": 851.3, "baseline_tokens_per_s": 425.4, "ratio": 2.002, "ratio_min": 1.985,
                "ratio_max": 2.019, "ratio_spread": 0.0172, "draft_spread": 0.0616, "baseline_spread": 0.0788,
                "noisy": False},
          "16": {"draft_tokens_per_s": 7462.8, "baseline_tokens_per_s": 5946.3, "ratio": 1.251, "ratio_min": 1.193,
                 "ratio_max": 1.31, "ratio_spread": 0.0932, "draft_spread": 0.2208, "baseline_spread": 0.1283,
                 "noisy": True}}
    views.spreads({"by_concurrency": by, "paired": True, "noisy_above": 0.05, "repeats": 2})
    out = capsys.readouterr().out
    assert "at 1 concurrent: tokens/s moved up to 7.9% between repeats on both sides" in out
    assert "the paired speedup held within 1.7%" in out
    # 16: the ratio itself moved (the H200's 1B, 2026-12-04): not a result, and what narrows it
    assert ("at 16 concurrent: the speedup moved 9.3% across 2 repeats (over 5%): not a result yet; more repeats "
            "or longer runs (`inv evaluate --repeats`, `--speedup-requests`, `--speedup-tokens`)") in out
    assert "16 concurrent: tokens/s moved" not in out
    views.spreads({"by_concurrency": by, "paired": False, "noisy_above": 0.05, "repeats": 2})
    out = capsys.readouterr().out  # unpaired: the sides' spreads are the ratio's (no drift line)
    assert "tokens/s moved" not in out and "at 16 concurrent: the speedup moved 22.1% across 2 repeats" in out
    assert "a timed run lasted" not in out
    # a level whose timed runs lasted about a second (the third GPU bake-off's 16 requests at 16): said, and the fix
    views.spreads({"by_concurrency": {"16": {**by["16"], "short": True, "seconds": 1.04}}, "paired": True,
                   "noisy_above": 0.05, "short_below": 5.0, "repeats": 3})
    out = " ".join(capsys.readouterr().out.split())
    assert ("at 16 concurrent: a timed run lasted 1.0 s (under 5 s): mostly its start and end, not the steady state; "
            "more requests (`--speedup-requests`) or tokens (`--speedup-tokens`) make it a figure") in out, out


def test_the_table_says_when_the_speedup_saw_other_prompts_than_acceptance(capsys):
    from specops import views

    views.inexact({"prompts": 27, "prompts_inexact": 27})
    assert ("27 of 27 prompts do not tokenize back to their ids through the verifier's tokenizer: the speedup's "
            "runs saw other prompts than acceptance's") in capsys.readouterr().out
    views.inexact({"prompts": 27, "prompts_inexact": 0})
    views.inexact({"prompts": 27})  # (an evaluation.json from before the count)
    assert capsys.readouterr().out == ""


def test_a_run_whose_answers_came_in_one_piece_keeps_its_tokens_per_s_but_not_its_latencies(capsys):
    """Seen on 2 cores, runs back to back: TTFT the whole request's (178 ms of 179), TPOT 0.001 ms."""
    whole = {"output_throughput": 714.0, "median_ttft_ms": 178.1, "median_e2el_ms": 179.2, "median_tpot_ms": 0.001,
             "median_itl_ms": 0.002, "total_output_tokens": 4096, "completed": 32, "duration": 5.7}
    live = {**whole, "median_ttft_ms": 9.3, "median_tpot_ms": 1.35, "median_itl_ms": 4.5}
    assert not sp.streamed(whole) and sp.streamed(live)
    assert sp.streamed({**whole, "total_output_tokens": 32})  # (one token each: the first is the whole)
    f = sp.figures(whole)
    assert f["output_tokens_per_s"] == 714.0 and f["streamed"] is False
    assert f["tpot_ms"] is None and f["itl_ms"] is None and f["ttft_ms"] is None
    assert sp.figures(live)["tpot_ms"] == 1.35 and sp.figures(live)["ttft_ms"] == 9.3
    b, d = sp.Side("baseline", "baseline"), sp.Side("draft", "draft", {"method": "eagle3"})
    runs = [{"side": s, "level": 1, "repeat": r, "batch": 0, "file": f"{s}-{r}"} for r in (0, 1) for s in ("draft", "baseline")]
    results = {"draft-0": sp.figures(live), "draft-1": sp.figures(whole), "baseline-0": sp.figures(live),
               "baseline-1": sp.figures(live)}
    rec = sp.record([b, d], runs, results, [1], paired=True)
    v = rec["draft"]["by_concurrency"]["1"]
    assert v["unstreamed"] == 1 and v["tpot_ms"]["n"] == 1 and v["tpot_ms"]["median"] == 1.35
    assert v["output_tokens_per_s"]["n"] == 2 and rec["baseline"]["by_concurrency"]["1"]["unstreamed"] == 0
    from specops import views

    views.speedup({"sides": rec, "requests": {"1": 32}, "repeats": 2, "paired": True, "settings": "cpu"})
    assert "TTFT and TPOT leave out 1 run(s) whose answers reached the benchmark's client in one piece" in \
        capsys.readouterr().out


def test_each_sides_baseline_column_is_the_runs_its_paired_ratio_used(capsys):
    """issue 46 item 7: the draft paired with the baseline of pass 0, ngram with pass 1's (the baseline pools
    both: 30.4 tok/s beside the draft's 30.3 for a 1.09x speedup): each side's row shows its own baseline."""
    b, d, n = sp.Side("baseline", "baseline"), sp.Side("draft", "draft"), sp.Side("ngram", "baseline-method")
    runs, results = [], {}
    for batch, side, pairs in ((0, "draft", [(30.3, 27.8), (30.5, 28.0)]), (1, "ngram", [(33.0, 33.2), (32.8, 33.0)])):
        for r, (x, y) in enumerate(pairs):
            for s, v in ((side, x), ("baseline", y)):
                runs.append({"side": s, "level": 1, "repeat": r, "batch": batch, "file": f"{s}-{batch}-{r}"})
                results[f"{s}-{batch}-{r}"] = fig(v)
    rec = sp.record([b, d, n], runs, results, [1], paired=True)
    dv, pooled = rec["draft"]["by_concurrency"]["1"], rec["baseline"]["by_concurrency"]["1"]
    assert pooled["output_tokens_per_s"]["median"] == 30.5 and pooled["output_tokens_per_s"]["n"] == 4
    assert dv["baseline_tokens_per_s"]["median"] == 27.9 and dv["baseline_tokens_per_s"]["n"] == 2
    assert dv["ratio"]["median"] == pytest.approx(30.4 / 27.9, abs=0.002)
    assert rec["ngram"]["by_concurrency"]["1"]["baseline_tokens_per_s"]["median"] == 33.1
    unpaired = sp.record([b, d, n], runs, results, [1], paired=False)["draft"]["by_concurrency"]["1"]
    assert unpaired["baseline_tokens_per_s"] == pooled["output_tokens_per_s"]
    from specops import views

    views.speedup({"sides": rec, "requests": {"1": 8}, "repeats": 2, "paired": True, "settings": "cpu"})
    out = capsys.readouterr().out
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in out.splitlines() if "\t" in ln}
    assert rows["draft"][2:4] == ["30.4", "27.9"] and rows["ngram"][2:4] == ["32.9", "33.1"], out
    assert rows["baseline"][2:4] == ["30.5", ""], out
    assert "baseline tokens/s (its paired runs; the baseline row pools all)" in out
