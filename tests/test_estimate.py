"""The plan's arithmetic (specops/estimate.py) on numbers: step times from metric records, the
short run's parts, the extrapolation of each stage, auto's choice, the price."""

import re

import pytest

from specops import estimate as E


def recs(walls, *, tps=100.0, ms=500.0, val_wall=None, start_step=0):
    out = [{"split": "train", "global_step": start_step + i, "wall_time": w, "profile/tokens_per_s": tps,
            "profile/step_ms": ms} for i, w in enumerate(walls)]
    if val_wall is not None:
        out.append({"split": "val", "global_step": start_step + len(walls), "wall_time": val_wall})
    return out


def test_step_times_are_the_walls_between_logged_steps_per_step():
    st = E.step_times(recs([10.0, 11.0, 13.0, 14.0]))
    assert [s["seconds"] for s in st] == [1.0, 2.0, 1.0]
    # each step's tokens: speculators' tokens/s x its step_ms (100 x 0.5 s = 50), over the wall
    assert [s["tokens"] for s in st] == [50.0, 50.0, 50.0]
    assert [s["tokens_per_s"] for s in st] == [50.0, 25.0, 50.0]
    # log-freq 2: a gap of two steps is two steps' time
    two = [{"split": "train", "global_step": g, "wall_time": w} for g, w in ((0, 0.0), (2, 4.0))]
    assert E.step_times(two)[0]["seconds"] == 2.0 and E.step_times(two)[0]["tokens"] is None


def test_train_measurement_splits_start_steps_epoch_end_and_tail():
    m = E.train_measurement(recs([110.0, 111.0, 113.0, 114.0], val_wall=120.0), started=100.0, ended=125.0,
                            tokens=1000, train_ratio=0.9)
    assert m["startup_s"] == 10.0 and m["epoch_end_s"] == 6.0 and m["tail_s"] == 5.0 and m["wall_s"] == 25.0
    assert m["steps"] == 4 and m["timed_steps"] == 3
    assert m["step_s"] == {"n": 3, "min": 1.0, "median": 1.0, "max": 2.0}
    assert m["tokens_per_s"] == {"n": 3, "min": 25.0, "median": 50.0, "max": 50.0}
    assert m["val_tokens"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="no training step"):
        E.train_measurement([], started=0, ended=1, tokens=1)


def test_train_hours_extrapolates_tokens_at_the_median_rate_per_epoch():
    m = {"startup_s": 10.0, "tail_s": 5.0, "epoch_end_s": 6.0, "val_tokens": 150.0,
         "tokens_per_s": {"median": 50.0}}
    h = E.train_hours(m, tokens_full=10_000, epochs=3, train_ratio=0.9)
    # validation at 3x: the sample's 150 tokens took 1 s of the 6: the save is 5 s
    assert h["save_s"] == pytest.approx(5.0)
    # per epoch: 9000 / 50 = 180 s training, 5 s save, 1000 / 150 = 6.67 s validation
    assert h["epoch_s"] == pytest.approx(180 + 5 + 1000 / 150)
    assert h["seconds"] == pytest.approx(10 + 3 * (180 + 5 + 1000 / 150) + 5)
    assert h["tokens"] == 30_000


def test_data_hours_keeps_the_fixed_part_once_and_scales_the_rest():
    m = {"wall_s": 100.0, "prepare_s": 10.0, "extract_s": 30.0}
    off = E.data_hours(m, scale=10, mode="offline")
    on = E.data_hours(m, scale=10, mode="online")
    assert off == {"seconds": 60 + 400, "fixed_s": 60.0, "variable_s": 400.0}
    assert on["seconds"] == 60 + 100  # (online prepares only)


def test_auto_takes_offline_when_the_states_fit_the_budget_else_online():
    a = E.auto_choice(50 * 2**30, free_bytes=110 * 2**30, disk_budget=None, hours={"offline": 7200, "online": 3600})
    assert a["mode"] == "offline" and a["fits"] and a["budget_bytes"] == pytest.approx(100 * 2**30)
    assert "50.00 GiB, within the disk budget of 100.00 GiB (110.00 GiB free at the data dir, less 10%)" in a["reason"]
    assert "online is faster (1.00 h vs 2.00 h)" in a["reason"]
    b = E.auto_choice(50 * 2**30, free_bytes=None, disk_budget=10 * 2**30, hours={"offline": 1})
    assert b["mode"] == "online" and not b["fits"] and "over the disk budget of 10.00 GiB (--disk-budget)" in b["reason"]


def test_price_per_host_or_per_gpu():
    assert E.price(2.0, gpus=8, price_per_hour=None) is None
    assert E.price(2.0, gpus=8, price_per_hour=30.0) == 60.0
    assert E.price(2.0, gpus=8, price_per_hour=3.5, per="gpu") == 56.0
    assert E.price(2.0, gpus=0, price_per_hour=3.5, per="gpu") == 7.0


def measured():
    tr = {"startup_s": 20.0, "tail_s": 2.0, "epoch_end_s": 4.0, "val_tokens": 80.0, "timed_steps": 5,
          "step_s": {"n": 5, "min": 0.4, "median": 0.5, "max": 0.9}, "tokens_per_s": {"n": 5, "min": 300.0,
                                                                                   "median": 400.0, "max": 500.0}}
    return {"rows_total": 1000, "rows_sample": 10, "tokens_sample": 800,
            "data": {"wall_s": 50.0, "prepare_s": 5.0, "extract_s": 10.0, "tokens": 800},
            "bytes_per_token": 2048.0, "train": {"offline": tr, "online": {**tr, "startup_s": 60.0,
                                                                            "tokens_per_s": {"median": 200.0}}},
            "free_bytes": 2**40}


def test_rows_make_the_table_per_mode_with_totals_costs_and_auto():
    p = E.rows(measured(), epochs=2, gpus=8, price_per_hour=4.0, per="gpu")
    assert p["scale"] == 100 and p["tokens_full"] == 80_000
    off, on = p["modes"]["offline"], p["modes"]["online"]
    assert [s["stage"] for s in off["stages"]] == ["prepare + extract", "train"]
    d, tr = off["stages"]
    assert d["seconds"] == pytest.approx(35 + 15 * 100)  # 35 s fixed, 15 s x 100
    assert d["disk_bytes"] == pytest.approx(2048 * 80_000) and on["disk_bytes"] == 0
    assert on["stages"][0]["seconds"] == pytest.approx(35 + 5 * 100)
    assert tr["tokens"] == 160_000 and tr["gpu_hours"] == pytest.approx(tr["hours"] * 8)
    assert tr["cost"] == pytest.approx(tr["gpu_hours"] * 4.0)
    assert off["seconds"] == pytest.approx(d["seconds"] + tr["seconds"])
    assert off["cost"] == pytest.approx(off["hours"] * 8 * 4.0)
    assert "10 rows in 50 s (prepare 5.0 s, extract 10.0 s at 80 tokens/s; 35 s fixed) x 100.0" == d["basis"]
    assert "5 steps: 0.40/0.50/0.90 s per step (min/median/max), 300/400/500 tokens/s" in tr["basis"]
    assert p["auto"]["mode"] == "offline"  # (156 MiB fit a TiB)
    cpu = E.rows(measured(), epochs=1, gpus=0)
    assert cpu["modes"]["offline"]["gpu_hours"] is None and cpu["modes"]["offline"]["cost"] is None


def test_error_is_relative_to_the_actual():
    assert E.error(120, 100) == pytest.approx(0.2) and E.error(80, 100) == pytest.approx(-0.2)
    assert E.error(1, 0) is None


# -- hosts.yaml's price and inv plan's refusals, through the real CLI (no sshd, nothing connects) --
def _refused(r, code):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("specops: "), r.stderr
    return lines[0]


@pytest.mark.parametrize("fields,want", [
    ("price_per_hour: cheap",
     "field 'price_per_hour': must be a number, the price of an hour (e.g. 3.5) (got 'cheap')"),
    ("price_per_hour: -2", "field 'price_per_hour': Input should be greater than or equal to 0"),
    ("price_per_hour: 3\n    price_per: node", "field 'price_per': Input should be 'host' or 'gpu'"),
    ("price_per_hour: 3\n    price_per: gpu",
     "field 'price_per': gpu prices each GPU, but the host's `gpus` is not set"),
])
def test_bad_prices_are_one_line(tmp_path, fields, want):
    from conftest import inv

    f = tmp_path / "h.yaml"
    f.write_text(f"hosts:\n  g:\n    address: 127.0.0.1\n    {fields}\n")
    assert want in _refused(inv("hosts", "--hosts", str(f)), 1)


def test_a_good_price_loads(tmp_path):
    from specops import inventory

    f = tmp_path / "h.yaml"
    f.write_text("hosts:\n  g:\n    address: 127.0.0.1\n    gpus: 8\n    price_per_hour: 3.5\n    price_per: gpu\n")
    h = inventory.load(str(f)).get("g")
    assert (h.price_per_hour, h.price_per, h.gpus) == (3.5, "gpu", 8)
    assert inventory.builtin_local().price_per_hour is None


@pytest.mark.parametrize("args,code,want", [
    ((), 2, "plan needs --data FILE"),
    (("--data", "x.jsonl", "--sample", "1"), 2, "--sample 1: give how many rows to measure on, 2 or more"),
    (("--data", "x.jsonl", "--steps", "0"), 2, "--steps 0: give how many training steps, 1 or more"),
    (("--data", "x.jsonl", "--epochs", "x"), 2, "--epochs x: give how many epochs to train"),
    (("--data", "x.jsonl", "--host", "a,b"), 2, "plan measures one host"),
    (("--data", "x.jsonl", "--drafts", "eagle3"), 2, "--drafts 'eagle3': a bake-off compares two or more kinds"),
    (("--data", "x.jsonl", "--drafts", "eagle3,mtp"), 2, "--drafts mtp: not a draft kind specops trains"),
    (("--data", "x.jsonl", "--drafts", "eagle3,peagle", "--configs", "/nowhere"), 2,
     "--configs /nowhere: no /nowhere/eagle3.yaml, /nowhere/peagle.yaml"),
    (("--data", "x.jsonl", "--drafts", "eagle3,peagle", "--config", "configs/demo.yaml"), 2,
     "--config configs/demo.yaml with --drafts: a bake-off trains each kind from its own config"),
    (("--data", "x.jsonl", "--configs", "configs"), 2, "--configs configs is a bake-off's (with --drafts"),
])
def test_plan_refusals_before_anything_connects(args, code, want):
    from conftest import inv

    assert want in _refused(inv("plan", *args), code)


def test_pipeline_yes_needs_plan_first():
    from conftest import inv

    assert "--yes answers --plan-first" in _refused(inv("pipeline", "--data", "x.jsonl", "--yes"), 2)


LOG = """[specops] vLLM server healthy after 95s
2026-12-01 20:57:31,289 - speculators.data_generation.preprocessing - INFO -   Starting dataset preprocessing
Map (num_proc=1):   0%|          | 0/8 [00:00<?, ? examples/s]2026-12-01 20:57:32,123 - x - INFO -   Per-turn fan-out
2026-12-01 20:57:32,499 - speculators.data_generation.preprocessing - INFO -   Dataset preprocessing complete
[20:57:57] INFO     EAGLE Offline Data Generation   generate_offline_data.py:496
           INFO     Timing: 2.4s elapsed, 4.6       generate_offline_data.py:356
"""


def test_datagen_work_reads_speculators_own_timings_from_the_log():
    w = E.datagen_work(LOG)
    assert w["prepare_work_s"] == pytest.approx(1.21) and w["extract_work_s"] == pytest.approx(2.4)
    assert E.datagen_work("no timings here") == {"prepare_work_s": None, "extract_work_s": None}
    # the commands' own start (25.7 - 1.21 s, 24.93 - 2.4 s) is fixed, with the server's
    m = {"wall_s": 149.0, "prepare_s": 25.7, "extract_s": 24.93, **w}
    off = E.data_hours(m, scale=3, mode="offline")
    assert off["fixed_s"] == pytest.approx(149.0 - 1.21 - 2.4) and off["variable_s"] == pytest.approx(3 * 3.61)
    on = E.data_hours(m, scale=3, mode="online")  # (no generate-offline-data at all)
    assert on["fixed_s"] == pytest.approx(149.0 - 1.21 - 24.93) and on["variable_s"] == pytest.approx(3 * 1.21)
    # without the log's figures the commands' walls scale whole
    assert E.data_hours({"wall_s": 100.0, "prepare_s": 10.0, "extract_s": 30.0}, scale=2,
                        mode="offline")["seconds"] == pytest.approx(60 + 80)


def test_the_table_names_each_figure_and_its_basis(capsys):
    from specops import views

    m = measured()
    p = {**E.rows(m, epochs=2, gpus=8, price_per_hour=4.0, per="gpu"), "measured": {**m, "bytes_per_token_basis":
         "measured: the sample's hidden-state files"}, "host": "gpu1", "config": "configs/eagle3.yaml",
         "plan_seconds": 95.0, "price_per_hour": 4.0, "price_per": "gpu", "gpus": 8, "path": "/w/data/d/plan.json"}
    views.plan(p)
    out = capsys.readouterr().out
    assert "plan gpu1: 10 of 1000 row(s) measured (800 tokens, x 100.0 to the file's 80000 tokens), 2 epoch(s)" in out
    assert "# plan offline on gpu1 (8 GPU(s), 4/h per gpu)" in out and "# plan online on gpu1" in out
    assert "stage\ttokens\thours\tdisk\tGPU-hours\tcost\tmeasured on" in out
    off = [ln.split("\t") for ln in out.splitlines() if ln.startswith(("prepare + extract\t", "total\t"))]
    assert off[0][3] == "156.25 MiB" and float(off[0][5]) == pytest.approx(float(off[0][4]) * 4.0, abs=0.01)
    assert "auto would take: offline (the hidden states need 156.25 MiB, within the disk budget" in out
    assert re.search(r"total wall time \(offline\): [\d.]+ h \(\d+ s\); plan kept in /w/data/d/plan.json", out)
    views.plan({**p, "price_per_hour": None, "modes": {k: {**v, "stages": [{**s, "cost": None} for s in v["stages"]],
                                                         "cost": None} for k, v in p["modes"].items()}})
    assert "(no price_per_hour)" in capsys.readouterr().out


def test_a_bakeoff_is_priced_as_the_data_once_and_each_kinds_training_with_the_total(capsys):
    from specops import shown

    m = measured()
    p = E.rows(m, epochs=2, gpus=8, price_per_hour=4.0, per="gpu")
    slow = {**m["train"]["offline"], "tokens_per_s": {"n": 5, "min": 100.0, "median": 200.0, "max": 300.0}}
    b = E.bakeoff(p, {"eagle3": {"train": m["train"]["offline"], "epochs": 2, "train_ratio": 0.9, "config": "e.yaml"},
                      "peagle": {"train": slow, "epochs": 5, "train_ratio": 0.9, "config": "p.yaml"}},
                  mode="offline", gpus=8, price_per_hour=4.0, per="gpu")
    d, e, pe = b["rows"]
    assert (d["stage"], d["kind"], d["seconds"]) == ("prepare + extract", None, p["modes"]["offline"]["stages"][0]["seconds"])
    assert e["seconds"] == pytest.approx(p["modes"]["offline"]["stages"][1]["seconds"])  # (the same kind, epochs)
    assert pe["tokens"] == 80_000 * 5 and pe["seconds"] == pytest.approx(
        E.train_hours(slow, tokens_full=80_000, epochs=5)["seconds"]) and pe["cost"] == pytest.approx(pe["hours"] * 32)
    assert b["total"]["seconds"] == pytest.approx(d["seconds"] + e["seconds"] + pe["seconds"])
    assert b["total"]["cost"] == pytest.approx(b["total"]["hours"] * 8 * 4.0) and b["total"]["disk_bytes"] == d["disk_bytes"]
    shown._plan_bakeoff({"host": "gpu1", "price_per_hour": 4.0, "bakeoff": b})
    out = capsys.readouterr().out
    assert "# plan of the bake-off eagle3,peagle on gpu1 (offline)\nstage\tdraft\tconfig\tepochs\ttokens\thours\t" \
           "GPU-hours\tcost\tmeasured on\n" in out
    rows = [ln.split("\t") for ln in out.splitlines() if "\t" in ln][1:]
    assert [r[:4] for r in rows] == [["prepare + extract", "(shared)", "", ""], ["train", "eagle3", "e.yaml", "2"],
                                     ["train", "peagle", "p.yaml", "5"], ["total", "eagle3,peagle", "", ""]]
    assert float(rows[-1][7]) == pytest.approx(sum(float(r[7]) for r in rows[:-1]), abs=0.02)
    assert f"bake-off total (offline): {b['total']['hours']:.3f} h" in out and "not priced: each kind's serving" in out
    shown._plan_bakeoff({"host": "gpu1", "price_per_hour": None, "bakeoff": b})
    assert "(no price_per_hour)" in capsys.readouterr().out


def test_planned_vs_actual_rows(capsys):
    from specops import views

    views.plan_versus({"mode": "offline", "plan": "/w/plan.json", "rows": [
        {"stage": "train", "planned_s": 3600.0, "actual_s": 3000.0, "error": 0.2, "runs": ["R"]},
        {"stage": "total", "planned_s": 3600.0, "actual_s": None, "error": None, "runs": []}]})
    out = capsys.readouterr().out
    assert "# planned vs actual (offline; plan /w/plan.json)" in out and "train\t1.000\t0.833\t+20%\tR" in out
    views.plan_versus(None)
    assert capsys.readouterr().out == ""
