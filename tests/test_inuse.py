"""A dataset in use is not touched, and a failed prepare-data leaves nothing behind (issue 24,
item 1). A real training reads the dataset; `inv extract --overwrite` and `inv prepare-data
--overwrite` on it are refused naming the run. Over the real sshd, with the real cpu venv."""

import json
import shlex
import time

from conftest import inv, wait_for
from specops import inventory
from specops.host.connection import connect
from specops.ops import jobs
from test_train import LONG  # (the long CPU training config)


def one_line(r):
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_overwrite_of_the_dataset_a_running_train_reads_is_refused(pipeline_run, hosts_file, work, verifier,
                                                                  tmp_path):
    hf = str(hosts_file)
    base = ["--host", "box", "--hosts", hf]
    cfg = tmp_path / "long.yaml"
    cfg.write_text(LONG)
    rid = "t-inuse-" + str(int(time.time()))
    h = inventory.load(hf).get("box")
    with connect(h) as t:
        src, ds = f"{work}/data/pipe", f"{work}/data/inuse"
        t.check(f"rm -rf {shlex.quote(ds)} && cp -a {shlex.quote(src)} {shlex.quote(ds)}", "a copy of the dataset")
        before = t.check(f"cd {shlex.quote(ds)} && find . -type f | sort | xargs sha256sum", "its files").stdout
        r = inv("train", *base, "--config", str(cfg), "--run-id", rid, "--dataset", "inuse", "--no-serve-check")
        assert r.returncode == 0, r.stdout + r.stderr
        try:
            log = jobs.run_path(t, rid, "output.log")
            wait_for(lambda: b"train/loss=" in (t.read_bytes(log) or b""), 300, "the first training step")
            r = inv("extract", *base, "--dataset", "inuse", "--verifier", verifier, "--layers", "1,3,4,6",
                    "--backend", "hf", "--overwrite")
            assert r.returncode != 0
            line = one_line(r)
            assert f"is the dataset of the running train '{rid}'" in line and f"inv stop --run-id {rid}" in line, line
            assert "nothing was changed" in line
            convs = tmp_path / "convs.jsonl"
            convs.write_text(json.dumps({"conversations": [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "content": "hello"}]}) + "\n")
            r = inv("prepare-data", *base, "--dataset", "inuse", "--data", str(convs), "--verifier", verifier,
                    "--overwrite", "--seq-length", "512")
            assert r.returncode != 0
            assert f"is the dataset of the running train '{rid}'" in one_line(r)
            after = t.check(f"cd {shlex.quote(ds)} && find . -type f | sort | xargs sha256sum", "its files").stdout
            # (the trainer itself adds its vocabulary mapping, d2t-N.npy / t2d-N.npy, beside the data)
            assert set(before.splitlines()) <= set(after.splitlines()), "a refused --overwrite changed the dataset"
            assert jobs.status(t, rid)[0].state == "running"
        finally:
            jobs.stop(t, rid, grace=120)
        # once the run has ended, --overwrite is the user's call again (here: only its plan, a dry run)
        r = inv("extract", *base, "--dataset", "inuse", "--verifier", verifier, "--layers", "1,3,4,6",
                "--backend", "hf", "--overwrite", "--dry-run")
        assert r.returncode == 0, r.stdout + r.stderr
        t.check(f"rm -rf {shlex.quote(ds)}", "cleanup")


def test_a_data_file_that_is_not_utf8_is_refused_before_any_server(verifier, hosts_file, work, tmp_path):
    """failures row 163: a data file with a non-UTF-8 byte in a message started a vLLM server (healthy
    after 86 s) before speculators failed on UnicodeDecodeError. Now the data's cheap checks read the
    encoding first: one line naming the file, the line and the byte offset; no server, no dataset."""
    hf = str(hosts_file)
    good = json.dumps({"conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    raw = (good + "\n" + good.replace("yo", "caf\u00e9") + "\n").encode("utf-8").replace(b"caf\xc3\xa9", b"caf\xe9")
    bad, at = tmp_path / "latin1.jsonl", raw.index(b"\xe9")
    bad.write_bytes(raw)
    with connect(inventory.load(hf).get("box")) as t:
        ds = f"{work}/data/latin1"
        t.check(f"rm -rf {shlex.quote(ds)}", "no earlier copy")
        before = t.run(f"ls {work}/runs").stdout.split()
        r = inv("prepare-data", "--host", "box", "--hosts", hf, "--dataset", "latin1", "--data", str(bad),
                "--verifier", verifier, "--seq-length", "64")
        line = one_line(r)
        assert r.returncode != 0 and line.endswith(
            f"latin1.jsonl: line 2 is not UTF-8: byte 0xe9 at byte offset {at} of the file (invalid "
            f"continuation byte); speculators and vLLM read it as UTF-8: save it as UTF-8 (e.g. iconv -f latin1 -t "
            f"utf-8) (nothing was started)"), line
        assert line.startswith("specops: ") and "--prepare " in line, line
        assert not t.exists(ds) and t.run(f"ls {work}/runs").stdout.split() == before  # (no job, no server)
        assert not t.run('pgrep -u "$(id -u)" -f -- vllm.entrypoints').stdout.strip()


def test_a_failed_prepare_data_leaves_nothing_that_blocks_the_rerun(verifier, hosts_file, work, tmp_path):
    """Pre-tokenised rows speculators rejects (input_ids and loss_mask of other lengths): the
    subprocess's own error in one line; no dataset folder, no staging folder, no .hs_stage left;
    the re-run with good rows is not refused."""
    hf = str(hosts_file)
    base = ["--host", "box", "--hosts", hf]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"input_ids": [1, 2, 3, 4, 5], "loss_mask": [0, 1]}) + "\n" for _ in range(4)))
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"input_ids": [1, 2, 3, 4, 5], "loss_mask": [0, 0, 1, 1, 1]}) + "\n"
                            for _ in range(4)))
    h = inventory.load(hf).get("box")
    with connect(h) as t:
        ds = f"{work}/data/failprep"
        t.check(f"rm -rf {shlex.quote(ds)} {shlex.quote(f'{work}/data/.failprep.preparing')}", "no earlier copy")
        r = inv("prepare-data", *base, "--dataset", "failprep", "--data", str(bad), "--verifier", verifier,
                "--seq-length", "64")
        assert r.returncode != 0
        first = r.stderr.strip().splitlines()[0]
        assert first.startswith("specops: prepare ") and "failed" in first, r.stderr
        # the program's own error line, its traceback shown once (the log tail), not specops' too
        assert "ValueError: Speculator-format row shape mismatch: input_ids=5, loss_mask=2" in first, first
        assert r.stderr.count("Traceback") <= 1 and "datagen.py" not in r.stderr, r.stderr
        assert not t.exists(ds), t.run(f"ls -la {shlex.quote(ds)}").stdout
        assert not t.exists(f"{work}/data/.failprep.preparing")
        r = inv("prepare-data", *base, "--dataset", "failprep", "--data", str(good), "--verifier", verifier,
                "--seq-length", "64")
        assert r.returncode == 0, r.stdout + r.stderr
        assert t.exists(f"{ds}/state.json", "-f") and not t.exists(f"{ds}/.hs_stage")
        assert not t.exists(f"{work}/data/.failprep.preparing")
        t.check(f"rm -rf {shlex.quote(ds)}", "cleanup")


def test_a_draft_vocab_larger_than_the_verifiers_is_refused_at_plan_time(pipeline_run, hosts_file):
    """A draft vocabulary of 32000 (the default config's before it was sized to the data: `--draft-vocab-size
    32000` now) against the tiny verifier's vocabulary is refused in one line, a dry run shows it. An
    online plan (remote/specops_host/train/online.py) is refused the same way, before any vLLM server starts (the
    draft-serves preflight is left on: it never runs)."""
    h = inventory.load(str(hosts_file)).get("box")
    for extra in (["--dry-run"], [], ["--hidden-states", "online", "--dry-run"], ["--hidden-states", "online"]):
        rid = "t-vocab-" + str(int(time.time()))
        serve = [] if "online" in extra else ["--no-serve-check"]
        r = inv("train", "--host", "box", "--hosts", str(hosts_file), "--dataset", "pipe", *serve,
                "--run-id", rid, "--draft-vocab-size", "32000", *extra)
        assert r.returncode != 0
        line = one_line(r)
        assert "eagle3.yaml: draft-vocab-size 32000 is larger than the verifier's vocabulary (1024 tokens, " \
            "vocab_size in " in line and "/config.json): set draft-vocab-size to 1024 or less" in line, line
        assert "(nothing was started)" in line
        assert "draft-serves preflight" not in r.stdout and "would start the vLLM server" not in r.stdout, r.stdout
        with connect(h) as t:  # (no run folder, no server, no preflight left behind)
            assert not t.exists(jobs.run_path(t, rid)), rid
            assert not t.run(f"pgrep -u \"$(id -u)\" -f {shlex.quote('vllm[.]entrypoints')}").stdout.strip()


def test_a_training_whose_loss_is_not_finite_fails_pointing_at_inspect_data(pipeline_run, hosts_file, tmp_path):
    """lr 2e9 (the largest specops takes): the loss turns NaN/Inf within steps. The run is stopped and fails in one line that
    points at inspect-data; `inv status` marks it."""
    cfg = tmp_path / "nan.yaml"
    cfg.write_text(LONG.replace("  log-freq: 1\n", "  log-freq: 1\n  lr: 2.0e+9\n"))
    rid = "t-nan-" + str(int(time.time()))
    base = ["--host", "box", "--hosts", str(hosts_file)]
    t0 = time.time()
    r = inv("train", *base, "--config", str(cfg), "--run-id", rid, "--dataset", "pipe", "--no-serve-check",
            "--follow")
    assert r.returncode != 0, r.stdout[-3000:]
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith(f"specops: train {rid} on box failed (exit 1: non-finite loss (") and \
        "NonFiniteLossError: " in first and "inspect-data" in first, r.stderr[-3000:]
    assert time.time() - t0 < 600, "the run went on after its loss was NaN"
    r = inv("status", *base, "--run-id", rid)
    row = next(ln.split("\t") for ln in r.stdout.splitlines() if ln.startswith(rid + "\t"))
    assert row[2].startswith("failed (exit 1: non-finite loss ("), row


def test_a_run_keeps_its_history_and_is_not_resumed_on_new_data_unasked(pipeline_run, hosts_file, work, tmp_path):
    """A run resumed with other settings or on another dataset is refused unless
    --continue-on-new-data; every start's data and settings are appended to run.json."""
    hf = str(hosts_file)
    base = ["--host", "box", "--hosts", hf, "--no-serve-check"]
    rid = "t-history-" + str(int(time.time()))
    r = inv("train", *base, "--config", "configs/demo.yaml", "--run-id", rid, "--dataset", "pipe",
            "--epochs", "1", "--max-steps", "2", "--follow")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    other = tmp_path / "other.yaml"
    other.write_text(LONG)
    r = inv("train", *base, "--config", str(other), "--run-id", rid, "--dataset", "pipe", "--epochs", "1",
            "--max-steps", "3", "--dry-run")
    assert r.returncode != 0
    line = one_line(r)
    assert line.startswith(f"specops: run {rid} on box was trained on other data or settings (") and \
        "--continue-on-new-data" in line and "(nothing was started)" in line, line
    h = inventory.load(hf).get("box")
    with connect(h) as t:
        t.check(f"rm -rf {shlex.quote(f'{work}/data/pipe2')} && cp -a {shlex.quote(f'{work}/data/pipe')} "
                f"{shlex.quote(f'{work}/data/pipe2')}", "another dataset")
    r = inv("train", *base, "--config", "configs/demo.yaml", "--run-id", rid, "--dataset", "pipe2",
            "--epochs", "1", "--max-steps", "3")
    assert r.returncode != 0 and f"dataset {work}/data/pipe -> {work}/data/pipe2" in one_line(r), r.stderr
    r = inv("train", *base, "--config", "configs/demo.yaml", "--run-id", rid, "--dataset", "pipe2",
            "--epochs", "1", "--max-steps", "3", "--continue-on-new-data", "--follow")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with connect(h) as t:
        rec = json.loads(t.read_bytes(jobs.run_path(t, rid, "run.json")))
        t.check(f"rm -rf {shlex.quote(f'{work}/data/pipe2')}", "cleanup")
    starts = rec["starts"]
    assert len(starts) == 2 and [s["data"] for s in starts] == [f"{work}/data/pipe", f"{work}/data/pipe2"], starts
    assert starts[0]["config"]["max-steps"] == 2 and starts[1]["config"]["max-steps"] == 3
    assert starts[1]["changed"] == [f"dataset {work}/data/pipe -> {work}/data/pipe2"], starts[1]


def test_the_extractions_disk_budget_is_in_units_that_fit(pipeline_run):
    """Issue 24 item 12: the pipeline's extraction of a small dataset shows its disk budget in a unit
    that fits (KiB/MiB), never "0.00 GiB"."""
    import re

    lines = [ln for ln in pipeline_run["out"].splitlines() if "disk budget: " in ln]
    assert lines, pipeline_run["out"][-3000:]
    assert all(re.search(r"= \d+(\.\d)? (B|KiB|MiB)( needed)? \(\+10%\)", ln) for ln in lines), lines
    assert "0.00 GiB" not in pipeline_run["out"]


def test_a_full_disk_during_prepare_data_is_its_own_error_line(verifier, hosts_file, work, tmp_path):
    """Issue 24 item 7: prepare-data onto a disk that fills (a 16 KiB tmpfs holding the dataset's
    folder) fails with the program's own `No space left on device` line, once, no specops
    traceback; nothing is left on that disk. (A tmpfs needs root: the rig's tests run as root.)"""
    import os
    import subprocess

    assert os.geteuid() == 0, "mounting the small tmpfs needs root (as the rig's test user does)"
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"input_ids": [(7 * i + j) % 1000 for j in range(64)],
                                        "loss_mask": [0] * 8 + [1] * 56}) + "\n" for i in range(200)))
    h = inventory.load(str(hosts_file)).get("box")
    full = work / "full"
    full.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k,mode=0777", "specops-full", str(full)], check=True)
    try:
        r = inv("prepare-data", "--host", "box", "--hosts", str(hosts_file), "--dataset", f"{full}/ds",
                "--data", str(rows), "--verifier", verifier, "--seq-length", "64")
        assert r.returncode != 0, r.stdout[-2000:]
        first = r.stderr.strip().splitlines()[0]
        assert first.startswith("specops: prepare ") and "failed" in first, r.stderr
        assert "No space left on device" in first, r.stderr[-3000:]
        print(first)
        assert r.stderr.count("Traceback") <= 1 and "datagen.py" not in r.stderr, r.stderr
        with connect(h) as t:
            assert not t.run(f"ls -A {shlex.quote(str(full))}").stdout.strip()  # (no half dataset, no stage)
    finally:
        subprocess.run(["umount", str(full)], check=False)
