"""The laptop's side of the laptop-host contract: remote/specops_host/contract.py, imported from the
installed host package (the host imports the same file after `push`), so both sides share one name
rule, one set of job states and one payload frame; its refusals raised here as SpecopsError."""

from __future__ import annotations

from specops_host import contract as _mod
from specops_host.contract import Supervision

BEGIN, END = _mod.BEGIN, _mod.END
JobState = _mod.JobState
TERMINAL = _mod.TERMINAL
Refused = _mod.Refused
decode = _mod.decode
unframed = _mod.unframed
name_problem = _mod.name_problem
NAME_MAX = _mod.NAME_MAX
SPEEDUP_OFF = _mod.SPEEDUP_OFF
VLLM_RESERVED = _mod.VLLM_RESERVED
human_bytes = _mod.human_bytes


def supervision(**fields) -> Supervision:
    """A Supervision (a training's policy: restarts, back-off, stall, first step, notify, requeue)
    by the host's rules, a refusal raised as the laptop's one-line args.Refused (exit 2)."""
    from specops.args import USAGE, Refused as Refusal

    try:
        return Supervision(**fields)
    except Refused as e:
        raise Refusal(str(e), code=USAGE) from None


def check_name(kind: str, value: str) -> str:
    """The same rule as the host's, raised as the laptop's one-line SpecopsError."""
    from specops.errors import SpecopsError

    try:
        return _mod.check_name(kind, value)
    except Refused as e:
        raise SpecopsError(str(e)) from None


def concurrency_levels(text: str) -> list[int]:
    """evaluate's `--speedup` list, by the host's rule ("1,16" -> [1, 16], "none" -> []), raised
    as the laptop's one-line SpecopsError."""
    from specops.errors import SpecopsError

    try:
        return _mod.concurrency_levels(text)
    except Refused as e:
        raise SpecopsError(str(e)) from None
