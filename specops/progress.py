"""What a followed job's log says, for the quiet view (data only: specops.terminal renders it).

A job's output.log keeps everything (the trainer's per-step INFO panels, vLLM's own log, the
commands); a person following it wants the figures that matter. ``LogReader.feed(chunk)`` turns
the bytes of a followed log, as they come, into events:

- ``Event("progress", text)``: a host script's ``[specops] TEXT`` line (a server started, rows
  extracted, prompts answered, ...), except the commands it runs and the job's own start and
  exit lines (the laptop says those itself);
- ``Event("figures", record)``: one of speculators' metric records (``metric_logger.info``: a
  training step's ``train/loss=..., train/full_acc_0=..., profile/tokens_per_s=..., epoch=N,
  ..., global_step=S`` or an epoch's ``val/loss_epoch=..., epoch=N``), reassembled from the lines
  rich wrapped it over (the job runs the trainer at COLUMNS=120), as {key: float} with the
  epoch count of the trainer's last "Training epoch i/n started" line as ``epochs`` when known.

Every other line is left to output.log (`inv logs` shows it, `-v` streams it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from specops.metrics import PAIR

#: ANSI escapes (colours, cursor moves) and the prefix of a host script's own lines
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
PROGRESS = "[specops] "
#: [specops] lines a quiet follower leaves in the log: commands (`$ ...`, `vLLM server: $ ...`),
#: remote/specops_host/jobs/job.py's own `<date> start: ...` / `<date> exit code N` and a result as JSON
#: (`evaluation: {...}`: the laptop shows it as a result)
SKIP = re.compile(r"(^|: )\$ |^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (start: |exit code )|^[\w -]+: \{\"")
#: a log record's head as rich renders it: `[12:00:01] INFO     ...` or `           INFO     ...`
HEAD = re.compile(r"^(\[[^\]]*\]\s+)?\s*(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s")
EPOCH = re.compile(r"Training epoch (\d+)/(\d+) started")


@dataclass
class Event:
    kind: str  # "progress" | "figures"
    text: str = ""
    record: Optional[dict] = None


def clean(line: str) -> str:
    """A physical line as a terminal last showed it: its last carriage-return segment that says
    something, ANSI escapes out, trailing spaces out."""
    line = ANSI.sub("", line)
    shown = ""
    for seg in line.split("\r"):
        if seg.strip():
            shown = seg
    return shown.rstrip()


class LogReader:
    """Feed a followed log's bytes as they come; get its events (see the module's doc)."""

    def __init__(self) -> None:
        self.rest = b""
        self.record: dict = {}
        self.epochs: Optional[int] = None

    def feed(self, chunk: bytes) -> list[Event]:
        *whole, self.rest = (self.rest + chunk).split(b"\n")
        out: list[Event] = []
        for raw in whole:
            out += self.line(clean(raw.decode("utf-8", "replace")))
        return out

    def line(self, text: str) -> list[Event]:
        if text.startswith(PROGRESS):
            said = text[len(PROGRESS):].strip()
            return [] if not said or SKIP.search(said) else [Event("progress", said)]
        m = EPOCH.search(text)
        if m:
            self.epochs = int(m.group(2))
        pairs = PAIR.findall(text)
        if HEAD.match(text) or not pairs:  # (a new record, or another line: an unfinished one is dropped)
            self.record = {}
        if not pairs or not (self.record or any(k.startswith(("train/", "val/")) for k, _ in pairs)):
            return []
        for k, v in pairs:
            try:
                self.record[k] = float(v)
            except ValueError:
                continue
        keys = self.record
        done = "global_step" in keys or ("epoch" in keys and any(k.startswith("val/") for k in keys))
        if not done:
            return []
        rec, self.record = self.record, {}
        if self.epochs:
            rec["epochs"] = self.epochs
        return [Event("figures", record=rec)]


def accuracies(rec: dict, split: str = "train") -> list[float]:
    """Per draft position: full_acc_0, full_acc_1, ... of a record's split (val: the *_epoch keys)."""
    suffix = "_epoch" if split == "val" else ""
    out, k = [], 0
    while f"{split}/full_acc_{k}{suffix}" in rec:
        out.append(rec[f"{split}/full_acc_{k}{suffix}"])
        k += 1
    return out
