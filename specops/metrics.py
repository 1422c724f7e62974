"""Training metrics from a run's log: metrics.jsonl and a PNG of loss and per-step accuracy.

speculators logs one rich console line per record (COLUMNS=1000 keeps it on one line), e.g.
``INFO train/loss_0=0.010, train/full_acc_0=0.575, ..., train/loss=0.024, epoch=8, global_step=95``
"""

from __future__ import annotations

import json
import re
from pathlib import Path

PAIR = re.compile(r"([A-Za-z_][\w/]*)=(-?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))", re.I)


def parse(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if "train/loss=" not in line and "val/loss_epoch=" not in line:
            continue
        rec = {}
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


def write(run_dir: Path) -> dict:
    """metrics.jsonl (+ metrics.png if matplotlib is installed) from run_dir/output.log."""
    log = run_dir / "output.log"
    recs = parse(log.read_text(errors="replace")) if log.is_file() else []
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = {"records": len(recs), "plot": None}
    train = [r for r in recs if r["split"] == "train" and "train/loss" in r]
    if not train:
        return res
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return res
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
    accs = sorted({k for r in train for k in r if k.startswith("train/full_acc_")},
                  key=lambda k: int(k.rsplit("_", 1)[1]))
    for k in accs:
        a2.plot(steps, [r.get(k) for r in train], label=k.split("/", 1)[1])
    a2.set_xlabel("global step")
    a2.set_ylabel("accuracy (per draft position)")
    a2.set_ylim(0, 1)
    if accs:
        a2.legend()
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    fig.savefig(run_dir / "metrics.png", dpi=100)
    plt.close(fig)
    res["plot"] = str(run_dir / "metrics.png")
    return res
