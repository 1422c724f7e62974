"""`speculators train` with its checkpoint saves marked complete (what train/run.py starts).

Launch (train/run.py; under torchrun each rank runs it):
    <venv>/bin/python3 -m specops_host.train.hooked [--cpu] [--online] ARGS...   (any `speculators train` flags)

--cpu first: train/cpu.py's CPU placement; --online: train/online_cli.py (its interrupt fix, applied to every run
here: interrupt_passes()). Then:
- each save (Trainer.maybe_save_checkpoint, and maybe_update_best under save-best) removes the
  folder's marker before it writes and, on rank 0, writes checkpoints/N/specops-complete.json once
  the save has returned (ckpt.py): a trainer killed mid-save leaves no marker;
- --max-steps ends the training in the epoch that reaches it (stop_at_max_steps(): speculators 0.9.0 breaks that
  epoch's loop, then still runs each later epoch's first step, save and validation: a resumed 200-epoch run with
  --max-steps 1 went on through its remaining epochs so, 112 CPU-s on the rig; failures row 235);
- its modules load without cyclic garbage collection, then frozen out of it (lean.py's imports_untraced(): failures row
  265); a CPU trainer ends without the interpreter's teardown of them (lean.exit_without_teardown(): row 267);
- SIGUSR2 dumps every thread's Python stack (faulthandler) into RUN/stacks/faulthandler-<pid>.txt (RUN: the job's
  run folder, SPECOPS_JOB_DIR): what the supervisor asks for when the trainer stalls (jobs/watch.py).
"""

import faulthandler
import importlib
import os
import signal
import sys
from pathlib import Path

from specops_host import ckpt
from specops_host.lean import exit_without_teardown, imports_untraced

#: kept open for faulthandler (it writes to the file descriptor when the signal comes)
_STACKS = []


def rank0():
    try:
        import torch.distributed as dist

        return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    except Exception:  # noqa: BLE001  (no torch.distributed to ask: a single process is rank 0)
        return True


def folder_of(trainer, epoch):
    return Path(trainer.checkpointer.path) / str(epoch)


def install():
    """Wrap the trainer's saves (see the module's doc)."""
    import speculators.train.trainer as _trainer

    T = _trainer.Trainer
    save, best = T.maybe_save_checkpoint, T.maybe_update_best

    def maybe_save_checkpoint(self, epoch, local_step=0):
        f = folder_of(self, epoch)
        if rank0():
            ckpt.unmark(f)
        out = save(self, epoch, local_step=local_step)
        if rank0() and f.is_dir():
            ckpt.mark(f)
        return out

    def maybe_update_best(self, epoch, val_metrics):
        f = folder_of(self, epoch)
        rewrites = bool(getattr(self.config, "save_best", False))
        if rank0() and rewrites:
            ckpt.unmark(f)
        out = best(self, epoch, val_metrics)
        if rank0() and f.is_dir():
            ckpt.mark(f)  # (val_metrics.json written beside: the marker lists it)
        return out

    T.maybe_save_checkpoint, T.maybe_update_best = maybe_save_checkpoint, maybe_update_best
    stop_at_max_steps(T)


class StepsDone(BaseException):
    """--max-steps reached before an epoch starts (a BaseException: speculators' graceful-shutdown wrapper, which
    saves checkpoints/interrupted on TrainingInterruptedError, lets it pass)."""


def stop_at_max_steps(T):
    """No epoch after the one in which the trainer's global step reached config.max_steps: speculators 0.9.0 stops
    only that epoch's step loop (Trainer.train_epoch), and its run_training goes on through every epoch asked, each
    one step, a checkpoint and a validation pass. The first epoch this process runs always starts (a resumed run past
    its --max-steps: speculators' own one step and save, as before); every rank stops at the same epoch (the same
    global step)."""
    epoch_fn, run_fn = T.train_epoch, T.run_training

    def train_epoch(self, epoch, *args, **kwargs):
        cap = getattr(self.config, "max_steps", None)
        if cap is not None and getattr(self, "_specops_epochs", 0) and self.global_step >= cap:
            if rank0():
                print(f"[specops] --max-steps {cap}: reached at step {self.global_step}; no later epoch", flush=True)
            raise StepsDone
        self._specops_epochs = getattr(self, "_specops_epochs", 0) + 1
        return epoch_fn(self, epoch, *args, **kwargs)

    def run_training(self, *args, **kwargs):
        try:
            return run_fn(self, *args, **kwargs)
        except StepsDone:
            return None

    T.train_epoch, T.run_training = train_epoch, run_training


def stacks_on_signal():
    """SIGUSR2: the Python stacks of every thread into RUN/stacks/faulthandler-<pid>.txt."""
    run = os.environ.get("SPECOPS_JOB_DIR")
    if not run:
        return
    d = Path(run) / "stacks"
    d.mkdir(exist_ok=True)
    f = open(d / f"faulthandler-{os.getpid()}.txt", "a")
    _STACKS.append(f)
    faulthandler.register(signal.SIGUSR2, file=f, all_threads=True, chain=False)


def interrupt_passes():
    """speculators' SIGTERM/SIGINT handler raises TrainingInterruptedError (an Exception) wherever the main process
    is; any `except Exception` layer it lands in (a request's retries online: train/online_cli.py; a library's
    fallback during one of an offline run's per-epoch saves) swallows it, and the run neither stops nor saves
    checkpoints/interrupted. A BaseException passes them all and reaches the trainer's own handler, offline too."""
    import speculators.train.graceful_shutdown as shutdown

    shutdown.TrainingInterruptedError.__bases__ = (BaseException,)


def main(args):
    settled = imports_untraced()
    cpu = args[:1] == ["--cpu"]
    if cpu:
        args = args[1:]
        importlib.import_module("specops_host.train.cpu")  # (its CPU placement patches)
    if args[:1] == ["--online"]:
        args = args[1:]
        importlib.import_module("specops_host.train.online_cli")  # (its interrupt fix)
    stacks_on_signal()
    interrupt_passes()
    install()
    from speculators.cli import app

    settled()
    sys.argv = ["speculators", "train", *args]
    try:
        app()
    except SystemExit as e:  # (typer's app ends so, its code the run's; an error's traceback exits as usual)
        if not cpu:
            raise
        exit_without_teardown(0 if e.code is None else e.code)


if __name__ == "__main__":
    main(sys.argv[1:])
