"""The interpreter rule: the only way specops starts Python on a host.

``run_script(t, "check.preflight", [...])`` runs
``<venv>/bin/python3 -m specops_host.check.preflight ARGS`` in the host's workdir (after the
connection has pushed specops_host/, once) and decodes the one framed JSON payload from its stdout.
The only other interpreter ever started on a host is ``base_python -m venv`` (in bootstrap, at
creation).
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Optional, Sequence, Type, TypeVar

from pydantic import BaseModel

from specops import paths
from specops.contract import BEGIN, END, decode
from specops.errors import SpecopsError
from specops.host.transport import Transport
from specops.payloads import validated

NO_VENV, NO_SCRIPT = 97, 98
M = TypeVar("M", bound=BaseModel)
__all__ = ["BEGIN", "END", "decode_payload", "script_command", "run_script", "progress_args", "progress_notes",
           "NO_VENV", "NO_SCRIPT"]


def decode_payload(stdout: str) -> Optional[dict]:
    """The last framed JSON block in stdout, or None."""
    return decode(stdout)


def script_command(t: Transport, script: str, args: Sequence[str] = ()) -> str:
    """The exact shell command that runs host script `script` ("check.preflight": the module
    specops_host.check.preflight) with the venv interpreter, from the workdir."""
    py = shlex.quote(t.expand(t.host.python))
    path = shlex.quote(paths.host_file(script))
    argv = " ".join(shlex.quote(str(a)) for a in ["-m", paths.host_module(script), *args])
    return (
        f"cd {shlex.quote(t.workdir)} 2>/dev/null || exit {NO_SCRIPT}; "
        f"test -x {py} || exit {NO_VENV}; test -f {path} || exit {NO_SCRIPT}; "
        f"exec {py} {argv}"
    )


PROGRESS = "[specops] "


def progress_notes(t: Transport):
    """A line callback: a script's `[specops] TEXT` lines as the connection's progress notes
    (TEXT; the views show them as a live line on a terminal, a line each in a pipe)."""
    def on_line(line: str) -> None:
        if line.startswith(PROGRESS):
            t.note(line[len(PROGRESS):], "progress")
    return on_line


def progress_args() -> list[str]:
    """`--progress-every S` for a script that prints progress lines, when the laptop's
    SPECOPS_PROGRESS_EVERY sets S (else nothing: the script's default, every 15 s)."""
    every = os.environ.get("SPECOPS_PROGRESS_EVERY", "").strip()
    return ["--progress-every", every] if every else []


def run_script(t: Transport, script: str, args: Sequence[str] = (), *, timeout: Optional[float] = None,
               changes: bool = True, model: Optional[Type[M]] = None, via: Optional[str] = None,
               progress: bool = False, what: str = "", said: Optional[str] = None, writes: Sequence[str] = (),
               standin=None):
    """Run a remote script; return its payload (a dict carrying ``ok``, or ``model`` validated).
    Under --dry-run a script that changes the host (changes=True) is planned, not run (said as
    `said`, else its command; `writes`: the host paths it would write): its reply is `standin`
    when given, else a stand-in that stops the dry run where it is read (transport.Unmade, naming
    `what`).
    via: a launcher the whole command runs under (e.g. `srun --nodes=1 ...`: on a compute node).
    progress: the script's `[specops] ...` stdout lines become the connection's notes as they come
    (a long synchronous script, e.g. the profile's install, is never silent)."""
    h = t.host
    where = paths.host_file(script)
    t.ensure_pushed()
    cmd = script_command(t, script, args)
    if via:
        cmd = f"cd {shlex.quote(t.workdir)} 2>/dev/null || exit {NO_SCRIPT}; {via} sh -c {shlex.quote(cmd)}"
    stand = t.planned_change(cmd, what or f"{where}'s reply", said=said, writes=tuple(writes),
                             standin=standin) if changes else None
    if stand is not None:
        return stand
    r = (t.change if changes else t.fact)(cmd, timeout=timeout, on_line=progress_notes(t) if progress else None)
    if r.exited == NO_VENV:
        raise SpecopsError(
            f"venv {h.venv_path} is missing on {h.name} (no {h.python}): run `{t.hint('bootstrap')}`"
        )
    if r.exited == NO_SCRIPT:
        raise SpecopsError(
            f"{where} is not on {h.name} (workdir {h.workdir_path}): run `{t.hint('push')}`"
            + t.either("", " (it only copies specops' scripts), then the dry run again: it reads the host with "
                       "them and changes nothing")
        )
    try:
        payload = decode(r.stdout)
    except json.JSONDecodeError as e:
        raise SpecopsError(f"{where} on {h.name} printed a broken payload: {e}") from None
    if payload is None:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise SpecopsError(f"{where} on {h.name} exited {r.exited} without a result", detail=tail)
    payload.setdefault("exit", r.exited)
    if model is None:
        return payload
    return validated(model, payload, f"{where} on {h.name} answered outside the contract: ",
                     f" (push again: `{t.hint('push')}`)")
