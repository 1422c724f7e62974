"""A Slurm training requeued (a preemption, a node failure, `scontrol requeue`): Slurm starts the
same batch script again, SLURM_RESTART_COUNT > 0; its batch shell calls this first
(specops/slurm/script.py, `#SBATCH --requeue` where `inv train --restarts N` allows N > 0):

    <venv>/bin/python3 -m specops_host.jobs.requeued --run-dir RUN --of N --count "$SLURM_RESTART_COUNT"

Within N: the restart and its cause (requeued by Slurm, at the last step the run's log shows) are
appended to RUN/run.json's `restarts`, as the SSH supervisor appends its own (jobs/watch.py), and
kept in RUN/slurm-restart.json for `inv status`; the trainer then resumes from the last complete
checkpoint, as any start of the run does (train/run.py). Past N: `restarts stopped`, exit 3 (the
batch shell records it as the run's exit code).
"""

import argparse
import re
import time
from pathlib import Path

from specops_host import contract
from specops_host.contract import read_json, write_json
from specops_host.jobs.records import update_json

#: what `inv status` reads of a Slurm run's restart (specops/slurm/cluster.py)
RECORD = "slurm-restart.json"
STEP = re.compile(rb"global_step=(\d+)")
CAUSE = "requeued by Slurm"


def last_step(log: Path):
    """The last `global_step=N` of the run's log (None before any step); its end read only."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4 * 2 ** 20))
            found = STEP.findall(f.read())
    except OSError:
        return None
    return int(found[-1]) if found else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--of", type=int, required=True, help="the restarts allowed (inv train --restarts N)")
    ap.add_argument("--count", type=int, required=True, help="SLURM_RESTART_COUNT")
    a = ap.parse_args(argv)
    run = Path(a.run_dir)
    step = last_step(run / "output.log")
    at = f"at step {step:,}" if step is not None else "before any step"
    entry = {"when": time.time(), "n": a.count, "of": a.of, "cause": CAUSE, "step": step}
    if a.count > a.of:
        why = f"{a.of} of {a.of} used; Slurm requeued the job again ({at})"
        print(f"[specops] restarts stopped: {why}", flush=True)
        write_json(run / RECORD, {**entry, "gave_up": why})
        return 3
    print(f"[specops] restart {a.count} of {a.of}: {CAUSE} {at}; the trainer resumes from the last complete "
          f"checkpoint", flush=True)
    write_json(run / RECORD, entry)
    have = read_json(run / "run.json") if (run / "run.json").is_file() else {}
    have = have if isinstance(have, dict) else {}
    update_json(run / "run.json", restarts=[*(have.get("restarts") or []), entry])
    return 0


if __name__ == "__main__":
    contract.main(main)
