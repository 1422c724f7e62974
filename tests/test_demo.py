"""`inv demo`: the README's main job, on the built-in `local` host (no SSH): the learnable
verifier, the pipeline, and the trained draft served by vLLM beside its two controls."""

import json
import re

import pytest

pytestmark = [pytest.mark.heavy]


def test_demo_end_to_end(demo_run):
    """The demo on `local`, with hosts.yaml pointing `local` at the test run's cpu venv (built
    once per run by the cpu_box fixture) and a fresh workdir (conftest demo_run: run once, also
    read by test_learnable): learnable verifier trained on the fly, data, vLLM extraction,
    inspection, training, fetched with checkpoints and plot, then the issue's target on held-out
    prompts: mean acceptance length >= 2.0 with 3 draft tokens for the trained draft, <= 1.2 for
    the untrained control, the wrong-layers control clearly worse."""
    r, tmp_path = demo_run["r"], demo_run["tmp"]
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "profile cpu unchanged" in r.stdout
    rid = re.search(r"pipeline done: run (\S+)", r.stdout).group(1)
    run = tmp_path / "runs" / rid
    assert (run / "metrics.png").is_file() and (run / "metrics.jsonl").stat().st_size > 0
    assert any(p.name.isdigit() for p in (run / "checkpoints").iterdir())
    # the acceptance table, as printed (tab-separated on a pipe) and as written
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in r.stdout.splitlines() if "\t" in ln}
    shown = {k: float(rows[k][1]) for k in ("the trained draft", "untrained (speculators' step 0)",
                                            "trained, fed other layers")}
    ev = json.loads((run / "evaluation.json").read_text())
    ctl = {p.name.rsplit(".", 1)[-1]: json.loads((p / "evaluation.json").read_text())
           for p in (run / "controls").iterdir()}
    trained, untrained, wrong = (ev["mean_acceptance_length"], ctl["untrained"]["mean_acceptance_length"],
                                 ctl["wrong-layers"]["mean_acceptance_length"])
    assert shown["the trained draft"] == pytest.approx(trained, abs=1e-3)
    assert shown["untrained (speculators' step 0)"] == pytest.approx(untrained, abs=1e-3)
    assert ev["num_spec_tokens"] == 3 and ev["prompts"] >= 16
    assert trained >= 2.0, (trained, untrained, wrong)
    assert untrained <= 1.2, (trained, untrained, wrong)
    assert wrong < trained - 0.5, (trained, untrained, wrong)
    # the trained draft's speedup over the verifier alone (CPU: near 1, can be below, and said); not the controls'
    sp = ev["speedup"]
    assert all(sp["by_concurrency"][c]["draft_tokens_per_s"] > 0 and sp["by_concurrency"][c]["baseline_tokens_per_s"] > 0
               and sp["by_concurrency"][c]["ratio"] > 0 for c in ("1", "16")), sp
    assert "speedup" not in ctl["untrained"] and "speedup" not in ctl["wrong-layers"]
    assert float(rows["the trained draft"][rows["draft"].index("speedup @1 concurrent")]) == \
        pytest.approx(ev["speedup_at_1"], abs=1e-3)
    assert "speedup of the trained draft" in r.stdout and "can be below 1" in r.stdout
    # never silent: the verifier's training says its agreement so far, each evaluation its prompts
    assert re.search(r"^\[specops\] learnable verifier: step \d+/260 \(\d+ s\): loss [\d.]+, greedy agreement "
                     r"[\d.]+ \(4 held-out answers\)$", r.stdout, re.M), r.stdout[-4000:]
    assert re.search(r"^\[specops\] evaluate: \d+ of \d+ prompts answered \(\d+ tokens, \d+s\)", r.stdout, re.M)
    # and ends with the time each stage took, kept beside the run
    st = json.loads((run / "demo-stages.json").read_text())
    names = [s["stage"] for s in st["stages"]]
    assert names[0].startswith("push specops_host/") and any(n.startswith("train a tiny Llama verifier") for n in names)
    for want in ("data: prepare + extract (vllm)", "inspect-data", "train the draft", f"fetch {rid}"):
        assert want in names, names
    assert [n for n in names if n.startswith(("serve ", "control: "))] == [
        f"serve {rid}'s draft with the verifier (vLLM, 3 draft tokens)",
        "control: the untrained draft (speculators' step 0), served the same way",
        "control: the trained draft fed other layers' hidden states, served the same way"], names
    assert sum(s["seconds"] for s in st["stages"]) == pytest.approx(st["seconds"], abs=1.0)
    tail = r.stdout[r.stdout.index("# time each stage took"):]
    print(tail)  # (the stage table, for bench/results: pytest -s shows it)
    assert "stage\tseconds\tshare" in tail and re.search(r"^demo: \d+m\d\ds in all (\(.*\) )?on \d+ cores, load", tail, re.M)
    # quiet by default: the figures that matter, never the trainer's per-step panels nor vLLM's own
    # log (both stay whole in the runs' output.log), in 150 lines or fewer (stdout and stderr), the
    # acceptance table and the stage times last
    out = r.stdout.splitlines()
    (tmp_path / "demo-output.txt").write_text(r.stdout + r.stderr)
    assert len(out) + len(r.stderr.splitlines()) <= 150, f"{len(out)} lines: {tmp_path / 'demo-output.txt'}"
    assert "train/loss=" not in r.stdout and "train/loss=" in (run / "output.log").read_text()
    assert re.search(r"^\[train\] step \d+, epoch \d+/\d+: loss [\d.]+, accuracy by position [\d. ]+, [\d,]+ tokens/s$",
                     r.stdout, re.M), r.stdout
    assert re.search(r"^\[train\] validation after epoch \d+/\d+: loss [\d.]+, accuracy by position [\d. ]+$",
                     r.stdout, re.M), r.stdout
    assert re.search(r"^\[specops\] vLLM server healthy after \d+s$", r.stdout, re.M), r.stdout
    last = r.stdout[r.stdout.index("# drafts served by vLLM with the verifier"):]
    assert "# time each stage took" in last and out[-1].startswith("demo: ")
    assert not re.search(r"^(\[specops\]|\[train\]|✓)", last, re.M), last  # (nothing but the two tables and their lines)
