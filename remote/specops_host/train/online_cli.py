"""`speculators train` for an online run (what train/run.py starts beside the vLLM server).

Launch (train/online.py runs it; under torchrun each rank runs it):
    <venv>/bin/python3 -m specops_host.train.online_cli [--cpu] --on-missing generate --vllm-endpoint URL ...
    (any `speculators train` flags; --cpu first: train/cpu.py's CPU placement too)

One fix to speculators 0.9.0, for online runs: its SIGTERM/SIGINT handler raises
TrainingInterruptedError (an Exception) wherever the main process is. With --num-workers 0 the
main process spends most of an online step inside the hidden-state request, whose retry layers
(`with_retries`, GenerationRecoveryGuard) catch every Exception: the interrupt is swallowed as
one more failed request and the run neither stops nor saves checkpoints/interrupted (`inv stop`
then ends in SIGKILL). Made a BaseException here, it passes those `except Exception` layers and
reaches the trainer's own `except TrainingInterruptedError`, which saves and exits as offline.
"""

import sys

import speculators.train.graceful_shutdown as _shutdown

_shutdown.TrainingInterruptedError.__bases__ = (BaseException,)

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--cpu"]:
        args = args[1:]
        from specops_host.train import cpu as train_cpu  # noqa: F401 - its CPU placement patches (train/cpu.py)
    from speculators.cli import app

    sys.argv = ["speculators", "train", *args]
    app()
