"""evaluate: serve the verifier + a run's draft through vLLM; acceptance beside training accuracy."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Optional

from . import jobs, metrics
from .data import remote_input
from .errors import SpecopsError
from .remote_exec import run_script
from .transport import Transport

CAUSES = ("layer ids differ between extraction, training and serving; the vocabulary mapping (d2t/t2d) "
          "does not match the verifier's tokenizer; the chat template drifted between prepare-data and "
          "serving; the extracted hidden states were all zero (inspect-data reports that)")


def gap_flags(ev: dict, train_acc: dict) -> list[str]:
    flags = []
    cond = ev.get("conditional_acceptance_by_position") or []
    for k, acc in enumerate(cond):
        tr = train_acc.get("cond", {}).get(k)
        if tr is not None and tr >= 0.2 and acc < 0.5 * tr:
            flags.append(f"position {k}: served acceptance {acc:.2f} vs training cond_acc {tr:.2f}")
    return flags


def evaluate(t: Transport, run_id: str, *, checkpoint: str = "best", prompts: Optional[str] = None,
             num_spec_tokens: int = 3, max_prompts: int = 32, max_tokens: int = 64, dest: str = "runs",
             vllm_args: Optional[list] = None) -> Optional[dict]:
    jobs.validate_run_id(run_id)
    spec_raw = t.read_bytes(jobs.run_path(t, run_id, "train-spec.json"))
    if not spec_raw:
        raise SpecopsError(f"evaluate: no training run {run_id!r} on {t.host.name} (no train-spec.json): "
                           f"`{t.hint('status')}` lists the runs")
    spec = json.loads(spec_raw)
    args = ["--run-dir", jobs.run_path(t, run_id), "--verifier", spec["verifier"], "--kind", t.host.profile,
            "--checkpoint", str(checkpoint), "--num-spec-tokens", str(num_spec_tokens),
            "--max-prompts", str(max_prompts), "--max-tokens", str(max_tokens)]
    if prompts:
        args += ["--prompts", remote_input(t, prompts)]
    args += t.host.vllm_flags(list(vllm_args or []))
    pending = t.dry_run and prompts is not None and args[args.index("--prompts") + 1] in t.would_put
    if not pending:  # (a laptop prompts file is not on the host during a dry run: nothing to check yet)
        plan = run_script(t, "evaluate", args + ["--plan"], changes=False)
        if not plan.get("ok"):
            raise SpecopsError(f"evaluate {run_id} on {t.host.name} refused: {plan.get('error')}")
        if t.dry_run:  # the exact server command, to review -tp before GPU hours
            for cmd in plan.get("commands", []):
                t.plan("would start: " + shlex.join(map(str, cmd)))
    eid = f"{run_id}.eval-{time.strftime('%H%M%S')}"
    result = jobs.run_path(t, run_id, "evaluation.json")
    argv = [t.expand(t.host.python), "remote/evaluate.py", *args, "--result", result]
    code = jobs.run_attached(t, eid, argv, kind="evaluate", lock="evaluate")
    if code is None:  # --dry-run
        return None
    raw = t.read_bytes(result)
    ev = json.loads(raw) if raw else None
    if code != 0 or not ev or not ev.get("ok"):
        raise SpecopsError(f"evaluate {run_id} on {t.host.name} failed: "
                           f"{(ev or {}).get('error') or jobs.status(t, eid)[0].describe}", detail=jobs.tail(t, eid, 15))
    local = Path(dest) / run_id
    local.mkdir(parents=True, exist_ok=True)
    t.sync_down(jobs.run_path(t, run_id, "logs"), str(local / "logs"))  # the run's TensorBoard events
    ev["training_accuracy"] = metrics.training_accuracy(local)
    ev["flags"] = gap_flags(ev, ev["training_accuracy"])
    if ev["flags"]:
        ev["likely_causes"] = CAUSES
    (local / "evaluation.json").write_text(json.dumps(ev, indent=1))
    ev["plot"] = plot(ev, local / "acceptance.png")
    return ev


def plot(ev: dict, path: Path) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    acc = ev.get("acceptance_by_position") or []
    tr = ev.get("training_accuracy", {}).get("full", {})
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = list(range(len(acc)))
    ax.bar([x - 0.2 for x in xs], acc, width=0.4, label="served: accepted / drafts")
    ax.bar([x + 0.2 for x in xs], [tr.get(x, 0) for x in xs], width=0.4, label="training: val full_acc")
    ax.set_xlabel("draft position")
    ax.set_ylabel("rate")
    ax.set_ylim(0, 1)
    ax.set_xticks(xs)
    ax.legend()
    ax.set_title(f"mean acceptance length {ev.get('mean_acceptance_length', 0):.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
