"""The laptop-host contract, in one module: stdlib only, imported by every host script and by
the laptop (`from specops_host import contract`: specops/contract.py), so both sides share one
set of rules.

- the payload frame: a host script prints one framed JSON object on stdout (``emit``);
- ``main(fn)``: every script's entry point; whatever goes wrong, the laptop gets a framed
  ``{"ok": false, "error": "..."}`` (and a job script's ``--result`` file gets it too), never a
  bare traceback;
- ``Refused``: bad input, one line saying what, where and how to fix it;
- ``JobState``: the states of a detached job, and which of them are terminal;
- ``check_name``: the one rule for every name that becomes a path (run ids, dataset names,
  host names);
- ``concurrency_levels``: evaluate's `--speedup` list (concurrent requests per measurement);
- ``Supervision``: a training's supervision policy (restarts, back-off, stall, first step, notify,
  requeue), built once on the laptop, carried whole in job.json, read once on the host;
- ``progress`` / ``Every``: a long wait's progress line (`[specops] ...` on stdout, one every
  PROGRESS_EVERY seconds: the laptop shows a job's log as it grows, and a synchronous script's
  such lines as they come).
"""

import dataclasses
import enum
import json
import os
import sys
import time
import traceback
from pathlib import Path

BEGIN = "@@SPECOPS-PAYLOAD-BEGIN@@"
END = "@@SPECOPS-PAYLOAD-END@@"


def emit(obj) -> None:
    """Print the payload, framed (stray output around it is allowed: the laptop takes the last frame). Every '@'
    inside is written as its JSON escape, so a frame marker within a string (a log's last line that was itself a
    payload) cannot end or restart the frame."""
    sys.stdout.flush()
    sys.stdout.write("\n" + BEGIN + json.dumps(obj, default=str).replace("@", "\\u0040") + END + "\n")
    sys.stdout.flush()


def unframed(text):
    """text without its payload frames (what a person reads: a log's tail, an error's detail)."""
    import re

    return re.sub(re.escape(BEGIN) + r".*?(" + re.escape(END) + r"|$)\n?", "", text, flags=re.S)


def decode(stdout):
    """The last framed object in stdout, or None."""
    i = stdout.rfind(BEGIN)
    if i < 0:
        return None
    j = stdout.find(END, i)
    if j < 0:
        return None
    return json.loads(stdout[i + len(BEGIN):j])


class Refused(Exception):
    """Bad input or state: str(e) is one line (what, where, how to fix); exit code 2."""


class JobState(str, enum.Enum):
    STARTING = "starting"
    PENDING = "pending"  # (queued by a scheduler: Slurm, not started yet)
    RUNNING = "running"
    STALLED = "stalled"  # (running, but no training step logged for too long: jobs/watch.py; `inv status` only)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    def __str__(self) -> str:  # (f-strings and json show the value)
        return self.value


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.STOPPED, JobState.LOST})

#: letters, digits, '.', '_', '-'; 1-128 characters; not starting with '.' or '-'
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
NAME_MAX = 128


def name_problem(value):
    """Why value cannot be a name that becomes a path component, or None if it can."""
    if not isinstance(value, str) or not value:
        return "it is empty"
    if len(value) > NAME_MAX:
        return f"it is longer than {NAME_MAX} characters"
    bad = sorted(set(value) - NAME_CHARS)
    if bad:
        return "it holds " + ", ".join(repr(c) for c in bad[:5])
    if value[0] in ".-":
        return f"it starts with {value[0]!r}"
    return None


def check_name(kind, value):
    """value, if it is a valid `kind` name (run id, dataset name, host name); else Refused."""
    why = name_problem(value)
    if why:
        raise Refused(f"invalid {kind} {value!r}: {why}; use 1-{NAME_MAX} letters, digits, '.', '_' or '-' "
                      f"(not starting with '.' or '-')")
    return value


SPEEDUP_OFF = ("none", "off", "no")  # (not "0": a level of 0 is refused, docs/evaluation.md)
#: vLLM options specops sets itself on every server it starts (address, served model, the
#: extraction / evaluation configs): hosts.yaml `vllm_args` and a run's `--vllm-arg` may not set them
VLLM_RESERVED = ("--host", "--port", "--model", "--served-model-name", "--speculative-config",
                 "--kv-transfer-config")
CONCURRENCY_MAX = 1024


def concurrency_levels(text):
    """evaluate's `--speedup`: "1,16" -> [1, 16] (in the order given, once each); "none" (or
    off/no) -> [] (no speedup measured); anything else (a level of 0 too) Refused, in one line."""
    text = str(text).strip().lower()
    if text in SPEEDUP_OFF:
        return []
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= CONCURRENCY_MAX:
            raise Refused(f"--speedup {text!r}: give concurrent request counts (1-{CONCURRENCY_MAX}) such as 1,16, "
                          f"or none")
        if int(part) not in out:
            out.append(int(part))
    return out


#: a training's supervision: the first back-off (doubling, at most MAX_BACKOFF_S), and how long an
#: attempt may go without a sign of life before its first step (unless first_step_after says)
BACKOFF_S = 30.0
MAX_BACKOFF_S = 600.0
FIRST_STEP_S = 3600.0


@dataclasses.dataclass(frozen=True)
class Supervision:
    """What a training's supervisor does on its own: one policy, built once on the laptop
    (specops/ops/watch.py supervision(): `inv train`'s flags over hosts.yaml's defaults), carried
    whole in the job's record (job.json `supervision`: record()), read once on the host
    (Supervision.of, for jobs/watch.py's loop). On a Slurm host (requeue) Slurm restarts the job
    (`#SBATCH --requeue`, specops/slurm/script.py) and specops watches nothing.

    restarts: abnormal ends restarted from the last complete checkpoint (0: none); backoff: seconds
    before the first restart, doubling, at most MAX_BACKOFF_S; stall_after: seconds without a
    training step that make a stall (None: 20x the median step time, at least 300); first_step_after:
    the same before an attempt's first step (None: FIRST_STEP_S, or stall_after if larger);
    restart_on_stall: a stalled trainer is restarted (a restart: needs restarts >= 1); notify: where
    the end, a failure, a restart, a stall are told (a webhook URL or a command): a secret, it
    travels in the job's 0600 env file (jobs/notify.py VAR), never in job.json (record() leaves it out)."""

    restarts: int = 0
    backoff: "float | None" = None
    stall_after: "float | None" = None
    first_step_after: "float | None" = None
    restart_on_stall: bool = False
    notify: "str | None" = None
    requeue: bool = False

    def __post_init__(self):
        def number(name, v, low, strict):
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (v <= low if strict else v < low):
                bound = "above" if strict else "at least"
                raise Refused(f"supervision: {name} {v!r}: give a number of seconds, {bound} {low}")
            return float(v)
        if isinstance(self.restarts, bool) or not isinstance(self.restarts, int) or self.restarts < 0:
            raise Refused(f"supervision: restarts {self.restarts!r}: give a count, 0 or more")
        for name in ("restart_on_stall", "requeue"):
            if not isinstance(getattr(self, name), bool):
                raise Refused(f"supervision: {name} {getattr(self, name)!r}: give true or false")
        if self.notify is not None and not isinstance(self.notify, str):
            raise Refused(f"supervision: notify {self.notify!r}: give a webhook URL or a command")
        for name, low, strict in (("backoff", 0, False), ("stall_after", 0, True), ("first_step_after", 0, True)):
            object.__setattr__(self, name, number(name, getattr(self, name), low, strict))
        if self.restart_on_stall and not self.restarts:
            raise Refused("--restart-on-stall restarts a stalled trainer, but --restarts 0 allows no restart (given, "
                          "or hosts.yaml restarts: 0, or a cpu host's default): give --restarts N (N >= 1) or drop "
                          "--restart-on-stall")
        if self.requeue:
            asked = [f"--{n.replace('_', '-')}" for n in ("restart_on_stall", "stall_after", "first_step_after",
                                                          "backoff", "notify") if getattr(self, n)]
            if asked:
                raise Refused(f"{', '.join(asked)}: a Slurm job is restarted by Slurm's requeue (--restarts N), not "
                              f"watched by specops: stalls are not found and nobody is told there yet; drop them")
        elif self.backoff is None:
            object.__setattr__(self, "backoff", BACKOFF_S)

    def record(self):
        """What job.json keeps (`supervision`): every field but the notification target (a secret)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "notify"}

    @classmethod
    def of(cls, record, notify=None):
        """The policy of a job record's `supervision` (None: the job has none), with the target from
        its env file; a record of other fields or types: Refused."""
        if record is None:
            return None
        names = {f.name for f in dataclasses.fields(cls)} - {"notify"}
        if not isinstance(record, dict) or set(record) - names:
            raise Refused(f"supervision: {record!r}: give a JSON object of {', '.join(sorted(names))}")
        return cls(**record, notify=notify)

    @classmethod
    def of_json(cls, text):
        """The policy of its record as JSON text (jobs/job.py start's --supervision), or Refused."""
        try:
            record = json.loads(text)
        except ValueError:
            raise Refused(f"--supervision {text!r}: not JSON (a Supervision's record())") from None
        return cls.of(record)

    def delay(self, n):
        """The back-off before restart n (1, 2, ...)."""
        return min((BACKOFF_S if self.backoff is None else self.backoff) * 2 ** (n - 1), MAX_BACKOFF_S)

    def first_step_limit(self):
        """Seconds an attempt may go without a sign of life before its first step (then: stalled)."""
        return self.first_step_after or max(FIRST_STEP_S, self.stall_after or 0)


#: seconds between two progress lines of a long wait (a script's --progress-every; the laptop's
#: SPECOPS_PROGRESS_EVERY sets it for the scripts it starts)
PROGRESS_EVERY = 15.0


def progress(text):
    """One progress line on stdout, at once (what the laptop shows as it comes)."""
    print(f"[specops] {text}", flush=True)


def progress_option(ap):
    """A script's --progress-every SECONDS (default PROGRESS_EVERY)."""
    ap.add_argument("--progress-every", type=float, default=PROGRESS_EVERY,
                    help=f"seconds between two progress lines (default {PROGRESS_EVERY:g})")


def use_progress_every(seconds):
    """The parsed --progress-every, for every progress clock of this process (Refused unless > 0)."""
    global PROGRESS_EVERY
    if not seconds > 0:
        raise Refused(f"--progress-every {seconds:g}: give a number of seconds above 0 (SPECOPS_PROGRESS_EVERY)")
    PROGRESS_EVERY = float(seconds)


class Every:
    """A progress line's clock: due() is true once every `seconds` (default PROGRESS_EVERY)."""

    def __init__(self, seconds=None):
        self.seconds = seconds or PROGRESS_EVERY
        self.t0 = self.last = time.time()

    def due(self):
        now = time.time()
        if now - self.last < self.seconds:
            return False
        self.last = now
        return True

    def restart(self):
        """The next line `seconds` from now (after a line that took long to make)."""
        self.last = time.time()

    @property
    def elapsed(self):
        return time.time() - self.t0


def child_path(parent, name, kind="name"):
    """parent/name for a valid name: such a path never leaves parent."""
    return os.path.join(parent, check_name(kind, name))


def _result_path(argv):
    for i, a in enumerate(argv):
        if a == "--result" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--result="):
            return a.split("=", 1)[1]
    return None


#: the inputs a script reads while it runs, (what, path), as watch() recorded them
WATCHED: list = []


def watch(what, path):
    """Record an input the script reads while it runs (a checkpoint, the verifier, a dataset): if
    the script fails and the path is gone by then, its error names the path that vanished (the
    error it caused, an HFValidationError on a path that is no longer a folder, says nothing of it)."""
    if path and os.path.exists(path):
        WATCHED.append((what, os.path.abspath(path)))


def vanished():
    """(what, path) of the first watched input that is gone now, or None."""
    return next(((w, p) for w, p in WATCHED if not os.path.exists(p)), None)


def failure(e):
    """The failure payload of an exception: one line, with where it happened if it is a bug; a
    watched input that vanished meanwhile is named first (the cause, whatever the error says)."""
    gone = None if isinstance(e, Refused) else vanished()
    if gone:
        first = (e.code if isinstance(e, SystemExit) else f"{type(e).__name__}: {e}").strip().splitlines()
        return {"ok": False, "vanished": gone[1],
                "error": f"the {gone[0]} {gone[1]} vanished while this ran (removed or moved meanwhile): put it "
                         f"back and run again" + (f" (the error it caused: {first[0][:160]})" if first else "")}
    if isinstance(e, Refused):
        return {"ok": False, "error": str(e), "refused": True}
    if isinstance(e, SystemExit) and isinstance(e.code, str):
        return {"ok": False, "error": e.code}
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({os.path.basename(tb[-1].filename)}:{tb[-1].lineno})" if tb else ""
    msg = str(e).strip().splitlines()
    return {"ok": False, "error": f"{type(e).__name__}: {msg[0] if msg else ''}{where}".rstrip(": "),
            "bug": True}


def main(fn):
    """Run a script's main(): its return value is the exit code. A Refused, a SystemExit with a
    message or any other exception becomes a framed {"ok": false, "error": ...} (also written to
    --result PATH when the script was given one), exit 2 for refusals, 1 otherwise."""
    import argparse

    def _bad_arguments(parser, message):  # argparse would print usage and exit 2: one line instead
        raise Refused(f"{parser.prog}: {message}")

    argparse.ArgumentParser.error = _bad_arguments
    try:
        code = fn()
    except KeyboardInterrupt:
        raise
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            raise
        code, payload = 1, failure(e)
        _report(payload)
    except Exception as e:  # noqa: BLE001 - the laptop gets one line, never a bare traceback
        if not isinstance(e, Refused):
            traceback.print_exc(file=sys.stderr)
        code, payload = (2 if isinstance(e, Refused) else 1), failure(e)
        _report(payload)
    sys.exit(code or 0)


def human_bytes(b, top="GiB"):
    """Bytes in a unit that fits, up to `top`: 512 B, 5.0 MiB, 2.70 GiB (never "0.00 GiB")."""
    b = float(b)
    units = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
    for unit, scale in units[[u for u, _ in units].index(top):]:
        if b >= scale:
            return f"{b / scale:.2f} {unit}" if unit in ("TiB", "GiB") else f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def read_json(path, default=None):
    """The JSON in a file, or default when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def write_json(path, obj, indent=1):
    """obj as JSON at path, whole or not at all: a hidden temporary file of this writer's (several
    may write at once) beside it, renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=indent, default=str))
    os.replace(tmp, path)


def _report(payload):
    emit(payload)
    res = _result_path(sys.argv)
    if res:
        try:
            write_json(res, payload, indent=None)
        except OSError:
            pass
