"""Training metrics of a fetched run: metrics.jsonl and a PNG of loss and per-position accuracy.

speculators writes its metrics through its TensorBoard logger (remote/specops_host/train/run.py always passes
``--logger tensorboard``): runs/R/logs/R/events.out.tfevents.*. They are read here with the
``tensorboard`` package's own event-file reader (no torch, no TensorFlow).

Records keep the shape the console-scraped metrics.jsonl had: one JSON object per
``metric_logger.info`` call of the trainer, e.g.

    {"train/loss": 0.024, "train/full_acc_0": 0.575, ..., "epoch": 1, "lr": 0.001,
     "global_step": 95, "split": "train", "wall_time": 1796115141.6}
    {"val/loss_epoch": 0.03, "val/full_acc_0_epoch": 0.6, ..., "epoch": 1, "global_step": 96,
     "split": "val", "wall_time": ...}

(``global_step`` is the event's step: speculators logs validation at the step after the
epoch's last training step.) Runs from before the TensorBoard logger (no event files) fall
back to the old one-line-per-record console log (``parse``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Union

EVENTS = "events.out.tfevents.*"
SPLITS = ("train/", "val/")
PLOT_EXTRA = "specops[plot]"
TB_PIN = "tensorboard>=2.16,<3"
NO_TB = "events (tensorboard not installed)"


# ---- TensorBoard event files -------------------------------------------------------------

def event_files(run_dir: Path) -> list[Path]:
    """run_dir/logs/**/events.out.tfevents.*, oldest first (a resumed run adds newer ones)."""
    logs = Path(run_dir) / "logs"
    files = [p for p in logs.rglob(EVENTS) if p.is_file()] if logs.is_dir() else []

    def key(p: Path):  # events.out.tfevents.<unix time>.<hostname>.<pid>.<n>: the time, then
        parts = p.name.split(".")  # (several writers within one second) the file's first event
        return (int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else 0, _started(p), str(p))

    return sorted(files, key=key)


def _started(path: Path) -> float:
    """The wall time of a file's first event (its file_version record, written when it was opened)."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        for ev in EventFileLoader(str(path)).Load():
            return float(ev.wall_time)
    except Exception:  # noqa: BLE001 - unreadable: sorts by name only
        pass
    return 0.0


def _scalars(path: Path):
    """(step, wall_time, tag, value) of every scalar in one event file, in the order written.
    A file still being written (a truncated last record) yields what is complete."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    for ev in EventFileLoader(str(path)).Load():
        if ev.WhichOneof("what") != "summary":
            continue
        for v in ev.summary.value:
            kind = v.WhichOneof("value")
            if kind == "simple_value":
                x = float(v.simple_value)
            elif kind == "tensor" and v.metadata.plugin_data.plugin_name == "scalars":
                try:
                    x = float(tensor_util.make_ndarray(v.tensor).item())
                except (ValueError, TypeError):
                    continue
            else:  # text, hparams, histograms: not metrics
                continue
            yield int(ev.step), float(ev.wall_time), v.tag, x


def _group(scalars) -> list[dict]:
    """Consecutive scalars of one logger call -> one record. A call writes its scalars one after
    the other with one step, its split's keys (train/..., val/...) first; a new record starts
    at another step, at a tag already in the record, or at a split key after other keys."""
    out: list[dict] = []
    cur: dict = {}
    step, wall = -1, 0.0  # (set with the first scalar, before any record is finished)
    for s, w, tag, x in scalars:
        split = next((p for p in SPLITS if tag.startswith(p)), None)
        if cur and (s != step or tag in cur or (split and any(not k.startswith(split) for k in cur))):
            out.append(_finish(cur, step, wall))
            cur = {}
        if not cur:
            wall = w
        step = s
        cur[tag] = x
    if cur:
        out.append(_finish(cur, step, wall))
    return out


def _finish(rec: dict, step: int, wall: float) -> dict:
    rec["global_step"] = int(rec.get("global_step", step))
    rec["split"] = "val" if any(k.startswith("val/") for k in rec) else "train"
    rec["wall_time"] = wall
    return rec


def from_events(files: Iterable[Path]) -> list[dict]:
    """The records of a run's event files (oldest file first). A restart (resume) logs again from
    its checkpoint's step: what an earlier file logged past that step is dropped, as TensorBoard
    itself purges orphaned steps."""
    recs: list[dict] = []
    for f in files:
        new = [r for r in _group(_scalars(f)) if any(k.startswith(SPLITS) for k in r)]
        if not new:
            continue
        s = new[0]["global_step"]
        recs = [r for r in recs if r["global_step"] < s or (r["global_step"] == s and r["split"] == "val")]
        recs += new
    return recs


# ---- the console log (runs from before the TensorBoard logger) ---------------------------

PAIR = re.compile(r"([A-Za-z_][\w/]*)=(-?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))", re.I)


def parse(text: str) -> list[dict]:
    """Records from an old output.log (speculators' console lines, when COLUMNS=1000 kept each on
    one line). Kept for runs trained before the TensorBoard logger."""
    out = []
    for line in text.splitlines():
        if "train/loss=" not in line and "val/loss_epoch=" not in line:
            continue
        rec: dict[str, Any] = {}
        for k, v in PAIR.findall(line):
            try:
                rec[k] = float(v)
            except ValueError:
                continue
        if not rec:
            continue
        rec["split"] = "val" if any(k.startswith("val/") for k in rec) else "train"
        out.append(rec)
    return out


# ---- one run -----------------------------------------------------------------------------

def missing_tensorboard() -> dict | None:
    try:
        import tensorboard.backend.event_processing.event_file_loader  # noqa: F401
    except ImportError:
        return {"package": "tensorboard", "install": TB_PIN,
                "why": "reading the run's TensorBoard event files"}
    return None


def records(run_dir: Path) -> tuple[list[dict], str]:
    """(records, source): from the event files, else (older runs) from output.log."""
    run_dir = Path(run_dir)
    files = event_files(run_dir)
    if files:
        if missing_tensorboard():
            return [], NO_TB
        return from_events(files), "events"
    log = run_dir / "output.log"
    if log.is_file():
        return parse(log.read_text(errors="replace")), "output.log"
    return [], "none"


def training_accuracy(run: Union[Path, str, list]) -> dict:
    """The last validation record's per-position accuracies: {"full": {k: v}, "cond": {k: v}}
    (val/full_acc_k_epoch, val/cond_acc_k_epoch); both empty when there is no validation record.
    `run` is a fetched run directory (its logs/ event files) or a list of records."""
    recs = run if isinstance(run, list) else records(Path(run))[0]
    vals = [r for r in recs if r.get("split") == "val"]
    out: dict = {"full": {}, "cond": {}}
    if not vals:
        return out
    for k, v in vals[-1].items():
        for kind in ("full", "cond"):
            pre = f"val/{kind}_acc_"
            if k.startswith(pre) and k.endswith("_epoch") and k[len(pre):-len("_epoch")].isdigit():
                out[kind][int(k[len(pre):-len("_epoch")])] = v
    return out


def write(run_dir: Path) -> dict:
    """metrics.jsonl and metrics.png from run_dir's TensorBoard event files (run_dir/logs/**).

    Returns {"records", "train", "val", "source", "event_files", "plot", "missing"}: "plot" is the
    PNG's path or None; "missing" is None, or {"package", "install", "why"} when a package this
    needs is not installed (matplotlib -> install specops[plot]; tensorboard)."""
    run_dir = Path(run_dir)
    recs, source = records(run_dir)
    res = {"records": len(recs), "train": sum(r["split"] == "train" for r in recs),
           "val": sum(r["split"] == "val" for r in recs), "source": source,
           "event_files": len(event_files(run_dir)), "plot": None, "missing": None}
    if source == NO_TB:
        res["missing"] = missing_tensorboard()
        return res  # no metrics.jsonl: an empty one would read as "no metrics were logged"
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    train = [r for r in recs if r["split"] == "train" and "train/loss" in r]
    if not train:
        return res
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        res["missing"] = {"package": "matplotlib", "install": PLOT_EXTRA, "why": "drawing metrics.png"}
        return res
    res["plot"] = str(plot(run_dir, recs, plt))
    return res


def plot(run_dir: Path, recs: list[dict], plt) -> Path:
    train = [r for r in recs if r["split"] == "train" and "train/loss" in r]
    steps = [r.get("global_step", i) for i, r in enumerate(train)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    a1.plot(steps, [r["train/loss"] for r in train], label="train/loss")
    val = [r for r in recs if r["split"] == "val" and "val/loss_epoch" in r]
    if val:
        a1.plot([r.get("global_step", steps[-1]) for r in val], [r["val/loss_epoch"] for r in val], "o-",
                label="val/loss_epoch")
    a1.set_xlabel("global step")
    a1.set_ylabel("loss")
    a1.legend()
    accs = sorted({k for r in train for k in r if re.fullmatch(r"train/full_acc_\d+", k)},
                  key=lambda k: int(k.rsplit("_", 1)[1]))
    for k in accs:
        a2.plot(steps, [r.get(k, float("nan")) for r in train], label=k.split("/", 1)[1])
    a2.set_xlabel("global step")
    a2.set_ylabel("accuracy (per draft position)")
    a2.set_ylim(0, 1)
    if accs:
        a2.legend()
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = run_dir / "metrics.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
