"""Numbers given on the command line (and in training configs): each converted with its type and
range in one place, before anything connects, so a bad one is one line, never a traceback.

`Number.parse(value)` returns the value or raises `BadNumber` (a `SpecopsError`) naming the range;
`flags(task, kwargs)` applies `FLAGS` (and `TASK_FLAGS`) to a task's arguments and turns a bad one
into invoke's `Exit(..., code=2)`: `specops: --grace abc: give a number of seconds, 0 or more (e.g. 120)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from specops.errors import SpecopsError

#: exit code of a refused argument (as argparse's)
USAGE = 2


#: the largest number a flag without an upper bound takes (2**31 - 1: any count or step beyond it is
#: a typo, and overflows an int32 somewhere in the trainer or vLLM)
INT_CAP = 2**31 - 1


class BadNumber(SpecopsError):
    pass


@dataclass(frozen=True)
class Number:
    """An int or float with bounds: ge (>=), gt (>), le (<=); `what` and `eg` make the hint."""

    kind: type
    what: str
    eg: Union[int, float]
    ge: Optional[float] = None
    gt: Optional[float] = None
    le: Optional[float] = None

    @property
    def range(self) -> str:
        lo = self.ge if self.ge is not None else self.gt
        if self.le is not None and lo is not None:
            return f"{'more than ' if self.gt is not None else ''}{lo:g} to {self.le:g}"
        if self.gt is not None:
            return f"more than {self.gt:g}"
        if self.ge is not None:
            return f"{self.ge:g} or more"
        return f"{self.le:g} or less" if self.le is not None else ""

    def hint(self, over: bool = False) -> str:
        cap = f", at most {INT_CAP}" if over else ""
        return f"give {self.what}, {self.range}{cap} (e.g. {self.eg})"

    def parse(self, value: Any) -> Union[int, float]:
        """value (a string from the command line, or a number) -> the number, or BadNumber."""
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise BadNumber(self.hint())
        try:
            v = self.kind(value.strip() if isinstance(value, str) else value)
        except (ValueError, OverflowError):
            raise BadNumber(self.hint()) from None
        if self.kind is int and isinstance(value, float) and v != value:
            raise BadNumber(self.hint())  # (2.5 is not a count)
        if isinstance(v, float) and not math.isfinite(v):
            raise BadNumber(self.hint())
        if self.le is None and abs(v) > INT_CAP:  # (a count past any real one: overflows the trainer's tensors)
            raise BadNumber(self.hint(over=True))
        if ((self.ge is not None and v < self.ge) or (self.gt is not None and v <= self.gt)
                or (self.le is not None and v > self.le)):
            raise BadNumber(self.hint())
        return v


def _i(what, eg, ge=1, le=None):
    return Number(int, what, eg, ge=ge, le=le)


def _f(what, eg, ge=None, gt=None):
    return Number(float, what, eg, ge=ge, gt=gt)


#: every numeric task flag, by parameter name (the same meaning in every task that has it)
FLAGS: dict[str, Number] = {
    "grace": _f("a number of seconds between SIGTERM and SIGKILL", 120, ge=0),
    "sample": _i("how many files to load fully", 8, ge=0),
    "streams": _i("how many SSH streams at once", 4, le=64),
    "bwlimit": _i("a bandwidth limit in KiB/s (0: none)", 10000, ge=0),
    "epochs": _i("how many epochs to train", 3),
    "max_steps": _i("how many steps to train at most", 100),
    "steps": _i("how many training steps", 2),
    "nproc": _i("processes (GPUs) per host", 8, le=1024),
    "rdzv_port": _i("a TCP port", 29500, le=65535),
    "nodes": _i("how many nodes of the batch job", 2, le=100000),
    "concurrency": _i("how many requests in flight", 32, le=65536),
    "num_spec_tokens": _i("how many draft tokens per step", 3, le=64),
    "max_prompts": _i("how many prompts", 32),
    "max_tokens": _i("how many tokens per response", 64),
    "repeats": _i("how many times each side of the speedup is timed", 3),
    "speedup_tokens": _i("how many output tokens per timed request", 256),
    "side_by_side": _i("how many vLLM servers up at once", 2, le=64),
    "max_model_len": _i("vLLM's max model length in tokens", 4096),
    "limit": _i("how many prompts", 100),
    "seq_length": _i("the longest row in tokens", 2048),
    "hidden": _i("the hidden size", 256, le=1 << 16),
    "rank": _i("a node's rank", 0, ge=0),
    "task": _i("a task of the Slurm job array", 0, ge=0),
    "shards": _i("how many tasks of the Slurm job array (shares of the rows)", 2, le=1000),
    "seconds": _f("a time cap in seconds", 90, gt=0),
    "timeout": _f("seconds per attempt", 300, gt=0),
    "min_free_gb": _f("the free disk in GiB", 5, ge=0),
    "disk_budget": _f("the GiB of hidden states the disk may hold", 500, gt=0),
    "restarts": _i("how many times a failed training restarts", 3, ge=0, le=100),
    "stall_after": _f("seconds without a training step before the run counts as stalled", 1800, gt=0),
    "first_step_after": _f("seconds a training may go quiet before its first step", 3600, gt=0),
    "backoff": _f("seconds before the first restart (doubling, at most 600)", 30, ge=0),
}

#: flags numeric in one task only (elsewhere `layers` is a list of layer ids); None: not a number in that task
TASK_FLAGS: dict[str, dict[str, Optional[Number]]] = {
    "bakeoff": {"num_spec_tokens": None},  # (K or KIND:K each: ops/bakeoff.py per_kind() checks it)
    "inspect_data": {"layers": _i("the stored layers per position", 4),
                     "seed": _i("the seed of the files loaded fully", 12345, ge=0, le=2**63)},
    "make_verifier": {"layers": _i("how many decoder layers", 6, le=1024)},
    "plan": {"sample": _i("how many rows to measure on", 32, ge=2)},
    "pipeline": {"sample": _i("how many rows --plan-first measures on", 32, ge=2)},
    "synthesize": {"rows": _i("how many conversations to write", 1000),
                   "seed": _i("the seed of the questions' sampling", 0, ge=0, le=2**31 - 1),
                   "question_tokens": _i("how many tokens a question has at most", 128),
                   "attempts": _i("how many candidate conversations at most", 4000),
                   "servers": _i("how many vLLM servers of the verifier", 4, le=64)},
}


#: text flags that name something: given empty (`--dataset "$D"` with D unset) each is refused, never
#: read as "not given" (which would pick a default: data/default, the newest run, configs/eagle3.yaml)
NAMES: dict[str, str] = {
    "dataset": "a dataset name", "run_id": "a run id (`inv status` lists them)", "config": "a training config file",
    "prompts": "a prompts file (.jsonl)", "data": "a data file", "verifier": "the verifier's path on the host",
    "checkpoint": "a checkpoint", "kind": "a job kind", "path": "a path", "dest": "a folder", "dst": "a path",
    "src": "a path", "out": "a file name", "profile": "a profile name", "layers": "layer ids", "shard": "a shard i/n",
    "rows": "a row range a:b", "older_than": "an age such as 7d", "wheelhouse": "a folder",
}


def layer_ids(value: Any) -> list[int]:
    """--layers as a list of layer ids (comma-separated integers, 0 or more), or BadNumber saying why."""
    text = str(value).replace(" ", "")
    parts = text.split(",")
    if not text.strip(",") or any(p == "" for p in parts[:-1]):
        raise BadNumber("give comma-separated layer ids, e.g. 2,16,29,32 (the last: the verifier's layer count)")
    try:
        ids = [int(p) for p in parts if p != ""]
    except ValueError:
        raise BadNumber("give comma-separated integers, e.g. 2,16,29,32") from None
    if min(ids) < 0:
        raise BadNumber(f"layer id {min(ids)} is negative: ids count from 0 (the embeddings), e.g. 2,16,29,32")
    return ids


def shard_of(value: Any) -> str:
    """--shard i/n, 0 <= i < n, or BadNumber."""
    i, sep, n = str(value).strip().partition("/")
    try:
        ok = sep and 0 <= int(i) < int(n)
    except ValueError:
        ok = False
    if not ok:
        raise BadNumber("use i/n with 0 <= i < n, e.g. 0/4 (the first of four shares)")
    return f"{int(i)}/{int(n)}"


def requests_of(value: Any) -> str:
    """--speedup-requests as N (every level) or LEVEL:N,... (those levels; the others their default), each 1 or
    more (the host's parser: speedup.request_counts): its normal form (`16`, `1:16,16:64`), or BadNumber."""
    from specops_host.serve.speedup import request_counts

    try:
        counts = request_counts(value)
    except ValueError:
        counts = {}
    if not counts:
        raise BadNumber("give requests per level and side, 1 or more: N for every level, or LEVEL:N for some "
                        "(e.g. 1:16,16:64; the levels not named take their default)")
    return str(counts[None]) if None in counts else ",".join(f"{lv}:{n}" for lv, n in counts.items())


#: flags of a shape other than a number: checked as the numbers are (`layers` where it is not a count)
SHAPED = {"layers": layer_ids, "shard": shard_of, "speedup_requests": requests_of}


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def shown(value: Any) -> str:
    """A value as typed, quoted where it would not read back (empty, spaces, control characters)."""
    s = str(value)
    return s if s and s.strip() == s and s.isprintable() and " " not in s else repr(s)


def flags(task: str, kwargs: dict) -> dict:
    """A task's arguments with every numeric flag converted (None stays None); a bad one raises
    invoke's Exit (code 2) naming the flag, the value and the range."""
    from invoke.exceptions import Exit

    spec = {**FLAGS, **TASK_FLAGS.get(task, {})}
    out = dict(kwargs)
    for name, value in kwargs.items():
        if name in NAMES and isinstance(value, str) and not value.strip():
            raise Exit(f"specops: {flag_name(name)} {shown(value)}: nothing given: give {NAMES[name]}, or leave the "
                       f"flag out (an unset variable in a script?)", code=USAGE)
        if name in SHAPED and name not in spec and value is not None:
            try:
                SHAPED[name](value)
            except BadNumber as e:
                raise Exit(f"specops: {flag_name(name)} {shown(value)}: {e}", code=USAGE) from None
        number = spec.get(name)
        if number is not None and value is not None:
            try:
                out[name] = number.parse(value)
            except BadNumber as e:
                raise Exit(f"specops: {flag_name(name)} {shown(value)}: {e}", code=USAGE) from None
    return out


class Refused(SpecopsError):
    """Flags that cannot go together (or one a task needs, missing): one line, refused before
    anything connects; the CLI exits `code` (1, or USAGE where argparse would say so)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def refusing(check):
    """Mark an operation with the check of its flags (check(**flags) raises Refused): the CLI's
    executor runs it with the task's flags before anything connects, next to the operation it guards."""
    def mark(fn):
        fn.refuse = check
        return fn
    return mark
