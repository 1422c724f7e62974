"""Quiet by default: a followed job's log shows as its progress lines and the trainer's figures
(the whole log stays in the run's output.log); -v / SPECOPS_VERBOSE=1 streams it byte for byte."""

import io
import logging
import os
import random
import subprocess
import sys

import pytest
from rich.console import Console
from rich.logging import RichHandler

from conftest import REPO, inv
from specops.progress import LogReader
from specops.terminal import Throttle, figures, kind_of

STEP = ("train/loss_0={l0}, train/full_acc_0={a0}, train/cond_acc_0={a0}, train/loss_1=1.638, train/full_acc_1={a1}, "
        "train/cond_acc_1=0.00e+00, train/loss_2=1.638, train/full_acc_2=0.00e+00, train/cond_acc_2=0.00e+00, "
        "train/loss={loss}, train/error_records=0.00e+00, profile/fetch_ms=11.749, profile/fwd_ms=53.597, "
        "profile/step_ms=167.569, profile/tokens_per_s={tps}, profile/memory_mb/queue=6.69e+03, epoch={epoch}, "
        "lr/Muon=1.00e-06, lr/AdamW=1.00e-06, global_step={step}")
VAL = "val/loss_0_epoch=1.2, val/full_acc_0_epoch=0.512, val/full_acc_1_epoch=0.25, val/loss_epoch=3.3, epoch={epoch}"


def trainer_log(color: bool) -> bytes:
    """What speculators' trainer writes to a job's log: its records through rich's RichHandler
    (speculators' own handler), at the width the job gives it (COLUMNS=120): each record wrapped
    over several lines, with specops' own lines and other loggers' lines between."""
    buf = io.StringIO()
    log = logging.getLogger(f"speculators-{color}")
    log.handlers[:] = [RichHandler(console=Console(file=buf, width=120, force_terminal=color))]
    log.setLevel(logging.INFO)
    log.propagate = False
    buf.write("[specops] 2026-12-02 10:00:00 start: /venv/bin/python3 -m specops_host.train.run --spec s.json\n"
              "[specops] train r1: new run\n[specops] $ /venv/bin/python3 -m speculators train \\\n"
              "    --epochs 2 --lr 0.005\n")
    log.info("Training epoch 1/2 started")
    for step in range(3):
        log.info(STEP.format(l0=1.638, a0=f"{0.1 * step:.3f}", a1="0.00e+00", loss=f"{4.9 - step:.3f}", tps="4.88e+04",
                             epoch=0, step=step))
    log.info(VAL.format(epoch=0))
    log.info("Saving checkpoint to /w/runs/r1/checkpoints/0")
    buf.write("Training epoch 2 ━━━━━━╸━━━━━━━━━  40% 0:00:12\rTraining epoch 2 ━━━━━━━━━━━━━━━ 100% 0:00:00\n")
    buf.write("[specops] 2026-12-02 10:01:00 exit code 0\n")
    return buf.getvalue().encode()


@pytest.mark.parametrize("color", [False, True])
def test_the_trainers_wrapped_records_are_read_whole(color):
    """Each record comes back whole, however the bytes arrive (chunks cut anywhere); the job's own
    start/exit lines and the commands stay in the log, specops' other lines are progress."""
    raw = trainer_log(color)
    assert raw.count(b"\n") > 20  # (the records are wrapped: several lines each)
    rnd = random.Random(7)
    reader, events, i = LogReader(), [], 0
    while i < len(raw):
        n = rnd.randint(1, 40)
        events += reader.feed(raw[i:i + n])
        i += n
    assert [e.text for e in events if e.kind == "progress"] == ["train r1: new run"]
    recs = [e.record for e in events if e.kind == "figures"]
    assert [r.get("global_step") for r in recs] == [0, 1, 2, None]
    assert [r["train/loss"] for r in recs[:3]] == [4.9, 3.9, 2.9]
    assert recs[2]["train/full_acc_0"] == 0.2 and recs[2]["profile/tokens_per_s"] == 48800.0
    assert all(r["epochs"] == 2 for r in recs)
    assert figures(recs[2]) == "[train] step 2, epoch 1/2: loss 2.9, accuracy by position 0.200 0.000 0.000, " \
                               "48,800 tokens/s"
    assert figures(recs[3]) == "[train] validation after epoch 1/2: loss 3.3, accuracy by position 0.512 0.250"


def test_a_scripts_lines_in_a_followed_log():
    """[specops] lines: progress, except commands and the job's own start and exit lines; the rest
    (vLLM's own log, progress bars) stays in the log."""
    log = (b"[specops] vLLM server: $ /v/bin/python3 -m vllm.entrypoints.openai.api_server --port 1\n"
           b"[specops] vLLM server pid 12 (pgid 12) on port 41; log /w/runs/r/server/output.log\n"
           b"(APIServer pid=12) INFO 12-02 10:00:01 [api_server.py:1] vLLM API server version 0.32.0\n"
           b"[specops] vLLM server healthy after 41s\n"
           b"Extracting: 100%|##########| 267/267 [00:03<00:00, 80.1it/s]\n"
           b"[specops] untrained draft: $ python3 -m speculators train --dry-run\n"
           b"[specops] extract: 120 of 267 rows (4100 tokens, 30 s)\n"
           b"[specops] evaluation: {\"mean_acceptance_length\": 3.8}\n"
           b"[specops] 2026-12-02 10:00:09 exit code 0\n")
    assert [e.text for e in LogReader().feed(log)] == [
        "vLLM server pid 12 (pgid 12) on port 41; log /w/runs/r/server/output.log",
        "vLLM server healthy after 41s", "extract: 120 of 267 rows (4100 tokens, 30 s)"]


PROBE = """
import sys
from specops import views
from specops.host.transport import Note
log = open(sys.argv[1], "rb").read()
for i in range(0, len(log), 97):
    views.job_log(log[i:i + 97])
for i in range(12):
    views.note(Note("local", "progress", f"learnable verifier: step {i * 20}/260 ({i} s)"))
views.note(Note("local", "progress", "evaluate: 4 of 32 prompts answered"))
views.note(Note("local", "done", "✓ train the draft (3.1s)"))
"""


def probe(tmp_path, **env):
    if not (tmp_path / "log").exists():
        (tmp_path / "log").write_bytes(trainer_log(False))
    e = {k: v for k, v in os.environ.items() if k not in ("SPECOPS_VERBOSE", "SPECOPS_PLAIN")}
    return subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "log")], capture_output=True, cwd=REPO,
                          env={**e, **env}, timeout=60)


def test_quiet_in_a_pipe_and_verbose_streams_the_log(tmp_path):
    """In a pipe, by default: the progress lines and the trainer's figures, a kind of line at most
    BURST at once (the first figures line, every validation); verbose: the log itself, byte for
    byte, and every progress line."""
    r = probe(tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().splitlines() == [
        "[specops] train r1: new run",
        "[train] step 0, epoch 1/2: loss 4.9, accuracy by position 0.000 0.000 0.000, 48,800 tokens/s",
        "[train] validation after epoch 1/2: loss 3.3, accuracy by position 0.512 0.250",
        "[specops] learnable verifier: step 0/260 (0 s)", "[specops] learnable verifier: step 20/260 (1 s)",
        "[specops] learnable verifier: step 40/260 (2 s)", "[specops] evaluate: 4 of 32 prompts answered",
        "✓ train the draft (3.1s)"]
    r = probe(tmp_path, SPECOPS_VERBOSE="1")
    assert r.returncode == 0, r.stderr
    log = (tmp_path / "log").read_bytes()
    assert r.stdout.startswith(log), r.stdout[:2000]
    assert r.stdout[len(log):].decode().splitlines() == [
        *[f"[specops] learnable verifier: step {i * 20}/260 ({i} s)" for i in range(12)],
        "[specops] evaluate: 4 of 32 prompts answered", "✓ train the draft (3.1s)"]


def test_the_throttle_lets_a_burst_through_then_one_per_period():
    t = Throttle(every=0.2, burst=3)
    assert [t.allow("a") for _ in range(5)] == [True, True, True, False, False]
    assert t.allow("b")  # (another kind: its own bucket)
    import time

    time.sleep(0.25)
    assert t.allow("a") and not t.allow("a")
    assert kind_of("step 40/260 (9 s): loss 3.017") == kind_of("step 80/260 (14 s): loss 2.5")
    assert kind_of("vLLM server starting: 15s; its log: Triton is") == kind_of("vLLM server starting: 30s; its log: x")
    assert kind_of("vLLM server starting: 15s") != kind_of("vLLM server healthy after 41s")
    assert kind_of("install: byte-compiling") != kind_of("install: byte-compiled in 11.1 s")


def test_the_tasks_that_follow_a_job_take_verbose():
    """-v/--verbose on every task that follows a job (its flags as invoke parses them)."""
    import tasks
    from specops import cli

    for name in ("demo", "train", "pipeline", "extract", "prepare-data", "evaluate", "regenerate", "plan"):
        args = {a.name: a for a in tasks.ns.tasks[name].get_arguments()}
        assert args["verbose"].names == ("verbose", "v") and args["verbose"].help == cli.VERBOSE, name
    r = inv("train", "--help")
    assert r.returncode == 0 and "-v, --verbose" in r.stdout, r.stdout[-1500:]


def test_on_a_terminal_the_figures_are_one_live_line(tmp_path):
    """On a terminal (a real pty): the progress lines and each training step's figures drawn over
    one another in one live line (rich), the validation line and the finished step's line kept."""
    import pty

    (tmp_path / "log").write_bytes(trainer_log(False))
    env = {k: v for k, v in os.environ.items() if k not in ("SPECOPS_PLAIN", "SPECOPS_VERBOSE", "NO_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS="160", PYTHONPATH=str(REPO))
    out = bytearray()

    def read(fd):
        data = os.read(fd, 65536)
        out.extend(data)
        return data

    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        status = pty.spawn([sys.executable, "-c", PROBE, str(tmp_path / "log")], read)
    finally:
        os.environ.clear()
        os.environ.update(old)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "train/loss=" not in text, text
    before, _, after = text.partition("validation after epoch 1/2: loss 3.3")
    assert after and "[train] step 2, epoch 1/2: loss 2.9" in before, text  # (the live line, at its last step)
    assert before.count("\n") <= 1, text  # (drawn in place: no line scrolled before the validation's)
    live, step_done, _ = after.partition("✓ train the draft (3.1s)")
    assert step_done and live.count("\n") <= 2, text  # (the 13 progress lines: drawn in place too)
