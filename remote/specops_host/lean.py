"""A short-lived host program's fixed cost: the modules it loads (torch, transformers, speculators, vLLM: thousands)
loaded without cyclic garbage collection, and its end without the interpreter's teardown of them. Used by the trainer
(train/hooked.py) and the preflight (check/preflight.py), each started many times a test suite, most of them for a
few seconds of work (issue 44; failures rows 265 and 267; bench/results/trainer-start.md)."""

import atexit
import gc
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def imports_untraced() -> Callable[[], None]:
    """No cyclic garbage collection while the trainer's modules load (torch, transformers, speculators: some 4,300
    modules), then those objects frozen out of every later collection (speculators' own gc.collect() before training
    walked them all again): a 1-step CPU training took 6.5 CPU-s, 1.1 of it in collections that found next to
    nothing (failures row 265). Unfrozen at exit: the interpreter's last collection frees them as before (a frozen
    nanobind object left to exit makes triton print a leak report)."""
    gc.disable()

    def settled() -> None:
        gc.freeze()
        gc.enable()
        atexit.register(gc.unfreeze)

    return settled


def exit_without_teardown(code: object) -> NoReturn:
    """What the interpreter's exit does that anyone sees (its non-daemon threads joined, the atexit handlers run:
    logging's closes the TensorBoard writer, multiprocessing's ends DataLoader workers; stdout and stderr flushed),
    then the process ends without tearing down its 4,300 modules one object at a time: 1.2 CPU-s at the end of
    every CPU trainer, most of them a few seconds long in the tests (failures row 267). The usual exit where this
    Python has no threading._shutdown to join its threads as the interpreter does, or under a profiler or tracer
    (`python -m cProfile` writes its stats once the program has returned)."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None or not isinstance(code, int) or sys.getprofile() or sys.gettrace():
        raise SystemExit(code)
    shutdown()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):  # (a closed pipe: nothing more to say there)
            pass
    os._exit(code)
