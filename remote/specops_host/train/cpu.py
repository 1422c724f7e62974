"""Run `speculators train` on a CPU-only torch build (what train/run.py runs on cpu hosts).

Launch:
    <venv>/bin/python3 -m specops_host.train.cpu --verifier-name-or-path V --data-path D \
        --draft-attn-impl sdpa --loss-implementation eager ...   (any `speculators train` flags)

speculators 0.9.0 has no device flag. Without an accelerator it breaks in
four places (all in speculators.train):
  * Trainer.local_rank = get_local_rank() -> int 0; `model.to(0)` /
    `batch.to(0)` then raise "Cannot access accelerator device when none is
    available".
  * Trainer.device_type falls back to "cuda" -> torch.autocast("cuda") on CPU
    (autocast silently disabled / warns).
  * checkpointer.get_current_device() falls back to "cuda:0" -> resume
    (load_model_state_dict / load_optimizer_state_dict) would fail.
  * trainer._StepTimer calls torch.accelerator.synchronize() on every logged
    step (log_freq) -> same RuntimeError; made a no-op when no accelerator
    exists (it would only raise).
This wrapper patches exactly those names and then runs the normal CLI,
so every `speculators train` flag works unchanged:

One torch thread unless OMP_NUM_THREADS says otherwise: the CPU drafts are tiny, and with two threads
one busy core (a vLLM server's worker, another job) slows every step several times over (a demo run:
4 min 15 s with two threads beside a loaded core, 45 s with one).

(FlexAttention has no CPU backward: --draft-attn-impl sdpa; the fused Triton loss needs a GPU:
--loss-implementation eager. torchrun is not used on CPU: LOCAL_RANK switches on distributed mode.)
"""

import functools
import inspect
import os
import sys

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))


def compiled_when_called(fn=None, /, **kwargs):
    """torch.compile(fn) at fn's first call instead of at once: what speculators compiles as it is imported
    (speculators.models.dflash.core's create_block_mask, used only under simple_flex_attention, which a CPU run does
    not use) then costs nothing here, where compiling it made torch import inductor and dynamo's debugging backends
    (0.9 CPU-s of every CPU trainer start, failures row 266). Other forms (a module, the decorator with options)
    compile as before."""
    if not (inspect.isfunction(fn) and not kwargs):
        return _compile(fn, **kwargs) if fn is not None else _compile(**kwargs)
    compiled = []

    @functools.wraps(fn)
    def first_call_compiles(*a, **k):
        if not compiled:
            compiled.append(_compile(fn))
        return compiled[0](*a, **k)

    return first_call_compiles


_compile, torch.compile = torch.compile, compiled_when_called
try:
    import speculators.train.checkpointer as _ckpt  # noqa: E402  (after torch's thread count is set)
    import speculators.train.trainer as _trainer  # noqa: E402
finally:
    torch.compile = _compile

_trainer.get_local_rank = lambda: "cpu"  # used only for .to(...) placement
_ckpt.get_current_device = lambda: "cpu"

if not torch.accelerator.is_available():
    torch.accelerator.synchronize = lambda device=None: None

_orig_init = _trainer.Trainer.__init__


def _cpu_init(self, *args, **kwargs):
    _orig_init(self, *args, **kwargs)
    self.device_type = "cpu"  # torch.autocast("cpu", dtype=bf16)


_trainer.Trainer.__init__ = _cpu_init

if __name__ == "__main__":
    from speculators.cli import app

    sys.argv = ["speculators", "train", *sys.argv[1:]]
    app()
