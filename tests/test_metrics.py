"""Training metrics from TensorBoard event files (specops/metrics.py) and the status line
(remote/specops_host/jobs/loglines.py, remote/specops_host/jobs/records.py's last_line).

The event files are real: written with tensorboard's EventFileWriter, the writer under
torch.utils.tensorboard.SummaryWriter (what speculators' TensorBoard logger uses), each scalar
as SummaryWriter.add_scalar writes it; and, with the cpu-profile venv (heavy), by speculators'
own metric logger.
"""

import json
import subprocess
import time
from pathlib import Path

import pytest

from specops import metrics

from specops_host.jobs import loglines, records

PNG = b"\x89PNG\r\n\x1a\n"


class Writer:
    """SummaryWriter.add_scalar / add_text, as torch writes them (simple_value; text plugin)."""

    def __init__(self, logdir: Path):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.w = EventFileWriter(str(logdir))

    def log(self, d: dict, step: int):
        """One speculators metric_logger.info(d, extra={"step": step}): a nested dict, flattened."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        def flat(d, pre=""):
            for k, v in d.items():
                yield from (flat(v, f"{pre}{k}/") if isinstance(v, dict) else [(pre + k, v)])

        for tag, v in flat(d):
            if isinstance(v, str):
                from tensorboard.plugins.text.summary_v2 import text_pb

                summ = text_pb(tag, v)
            else:
                summ = Summary(value=[Summary.Value(tag=tag, simple_value=float(v))])
            self.w.add_event(Event(summary=summ, step=step, wall_time=time.time()))

    def close(self):
        self.w.close()


def train_dict(step, epoch, loss):
    return {"train": {"loss_0": loss, "full_acc_0": 0.5, "cond_acc_0": 0.5, "loss_1": loss,
                      "full_acc_1": 0.25, "cond_acc_1": 0.5, "loss": loss},
            "profile": {"step_s": 0.1, "note": "warmup"}, "epoch": epoch, "lr": 1e-3, "global_step": step}


def val_dict(epoch, acc):
    return {"val": {"loss_epoch": 1.5, "full_acc_0_epoch": acc, "cond_acc_0_epoch": acc,
                    "full_acc_1_epoch": acc / 2, "cond_acc_1_epoch": acc / 3}, "epoch": epoch}


def trainer_run(w: Writer, epochs=2, per_epoch=3, start=0):
    """The trainer's order: log_freq=1 train records, then validation at the next step."""
    step = start
    for e in range(epochs):
        for _ in range(per_epoch):
            w.log(train_dict(step, e, 2.0 / (step + 1)), step)
            step += 1
        w.log(val_dict(e, 0.4 + 0.1 * e), step)
    return step


def test_write_builds_records_and_png_from_event_files(tmp_path):
    run = tmp_path / "train-1"
    w = Writer(run / "logs" / "train-1")
    trainer_run(w)
    w.close()

    res = metrics.write(run)
    assert res["source"] == "events" and res["event_files"] == 1 and res["missing"] is None
    assert (res["records"], res["train"], res["val"]) == (8, 6, 2)
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in recs] == ["train"] * 3 + ["val"] + ["train"] * 3 + ["val"]
    assert [r["global_step"] for r in recs] == [0, 1, 2, 3, 3, 4, 5, 6]
    first = recs[0]
    assert first["train/loss"] == pytest.approx(2.0) and first["train/full_acc_1"] == 0.25
    assert first["epoch"] == 0 and first["lr"] == pytest.approx(1e-3) and first["profile/step_s"] == pytest.approx(0.1)
    assert "profile/note" not in first  # text, not a metric
    # validation at step 3 and the next epoch's first train step at step 3 stay two records
    assert recs[3] == {**recs[3], "split": "val", "epoch": 0, "val/loss_epoch": 1.5}
    assert not any(k.startswith("train/") for k in recs[3])
    assert recs[4]["epoch"] == 1 and not any(k.startswith("val/") for k in recs[4])
    assert Path(res["plot"]) == run / "metrics.png"
    assert (run / "metrics.png").read_bytes()[:8] == PNG and (run / "metrics.png").stat().st_size > 5000

    acc = metrics.training_accuracy(run)
    assert acc == {"full": {0: pytest.approx(0.5), 1: pytest.approx(0.25)},
                   "cond": {0: pytest.approx(0.5), 1: pytest.approx(0.5 / 3)}}
    assert metrics.training_accuracy(recs) == acc


def test_resumed_run_drops_what_the_first_start_logged_past_its_checkpoint(tmp_path):
    """A restart resumes from its epoch checkpoint and logs those steps again (a second event
    file in the same folder): the records follow the restart, as TensorBoard shows them."""
    logdir = tmp_path / "r" / "logs" / "r"
    w = Writer(logdir)
    trainer_run(w, epochs=1, per_epoch=3)  # steps 0-2, val at 3
    w.log(train_dict(3, 1, 9.0), 3)  # epoch 1 started, then the run was killed
    w.log(train_dict(4, 1, 9.0), 4)
    w.close()
    w = Writer(logdir)  # resumed from epoch 0's checkpoint: epoch 1 again from step 3
    trainer_run(w, epochs=1, per_epoch=2, start=3)
    w.close()

    res = metrics.write(tmp_path / "r")
    assert res["event_files"] == 2
    recs = [json.loads(ln) for ln in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["global_step"]) for r in recs] == [
        ("train", 0), ("train", 1), ("train", 2), ("val", 3), ("train", 3), ("train", 4), ("val", 5)]
    assert all(r["train/loss"] != 9.0 for r in recs if r["split"] == "train")


def test_run_without_metrics(tmp_path):
    res = metrics.write(tmp_path)
    assert (res["records"], res["source"], res["plot"]) == (0, "none", None)
    assert metrics.training_accuracy(tmp_path) == {"full": {}, "cond": {}}


def test_speculators_own_tensorboard_logger(tmp_path, cpu_box):
    """speculators' metric logger (setup_metric_logger, the TensorBoard handler, torch's
    SummaryWriter) writes what metrics.write reads, in the cpu-profile venv (the suite's own)."""
    venv = cpu_box["venv"]
    script = """
import json, logging, sys
from speculators.train.logger import setup_metric_logger, setup_root_logger
setup_root_logger()
setup_metric_logger(loggers="tensorboard", run_name="run-x", output_dir=sys.argv[1])
log = logging.getLogger("speculators.metrics")
log.info({"lr": 0.1, "epochs": 2, "layers": [1, 2]}, extra={"hparams": True})
for d, step in json.loads(sys.argv[2]):
    log.info(d, extra={"step": step})
logging.shutdown()
"""
    seq = [(train_dict(s, 0, 1.0 / (s + 1)), s) for s in range(3)] + [(val_dict(0, 0.7), 3)]
    run = tmp_path / "run-x"
    r = subprocess.run([f"{venv}/bin/python3", "-c", script, str(run / "logs"), json.dumps(seq)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list((run / "logs" / "run-x").glob("events.out.tfevents.*"))
    res = metrics.write(run)
    assert (res["train"], res["val"]) == (3, 1), res
    assert metrics.training_accuracy(run)["full"] == {0: pytest.approx(0.7), 1: pytest.approx(0.35)}
    assert (run / "metrics.png").read_bytes()[:8] == PNG


# ---- inv status's last line ---------------------------------------------------------------

PAD = " " * 1000
# What an old output.log ended with (rich at COLUMNS=1000): a record padded to the width, a
# progress bar redrawn with carriage returns, a traceback box's rule, blank lines.
CAPTURED = (
    "[12:00:01] \x1b[34mINFO\x1b[0m     train/loss_0=0.010, train/full_acc_0=0.575, train/loss=0.024, epoch=8, "
    "global_step=95" + PAD + "logger.py:212\n"
    + "\rTraining epoch 8 \x1b[38;5;197m━━━━━━╸\x1b[0m\x1b[38;5;237m━━━━━━━━━\x1b[0m  40% 0:00:12" + PAD
    + "\rTraining epoch 8 \x1b[38;5;197m━━━━━━━━━━━━━━━\x1b[0m 100% 0:00:00" + PAD + "\r" + PAD + "\n"
    + "\x1b[2K╭────────────────────────╮" + PAD + "\n"
    + "   " + PAD + "\n\n"
)


def test_last_meaningful_skips_padding_redraws_and_rules():
    assert loglines.last_meaningful(CAPTURED) == "Training epoch 8 ━━━━━━━━━━━━━━━ 100% 0:00:00"
    first = CAPTURED.split("\n", 1)[0]
    assert loglines.last_meaningful(first) == (
        "[12:00:01] INFO train/loss_0=0.010, train/full_acc_0=0.575, train/loss=0.024, epoch=8, "
        "global_step=95 logger.py:212")
    long = loglines.last_meaningful("x" * 3000 + PAD)
    assert len(long) == 200 and long.endswith("…")
    assert loglines.last_meaningful(PAD + "\n\r" + PAD + "\n─────\n") == ""


def test_job_last_line_reads_the_end_of_a_real_log(tmp_path):
    log = tmp_path / "output.log"
    log.write_text("[specops] train r: new run\n" + ("y" * 2900 + PAD + "\n") * 20 + CAPTURED)
    out = records.last_line(log, log.stat().st_size)
    assert out == "Training epoch 8 ━━━━━━━━━━━━━━━ 100% 0:00:00"
