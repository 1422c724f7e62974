"""The interpreter rule: the only way specops starts Python on a host.

``run_script(t, "check", [...])`` runs ``<venv>/bin/python3 remote/check.py ARGS`` in the
host's workdir and decodes the one framed JSON payload from its stdout. The only other
interpreter ever started on a host is ``base_python -m venv`` (in bootstrap, at creation).
"""

from __future__ import annotations

import json
import shlex
from typing import Optional, Sequence

from .errors import SpecopsError
from .transport import Transport

BEGIN = "@@SPECOPS-PAYLOAD-BEGIN@@"
END = "@@SPECOPS-PAYLOAD-END@@"
NO_VENV, NO_SCRIPT = 97, 98


def decode_payload(stdout: str) -> Optional[dict]:
    """The last framed JSON block in stdout, or None."""
    i = stdout.rfind(BEGIN)
    if i < 0:
        return None
    j = stdout.find(END, i)
    if j < 0:
        return None
    return json.loads(stdout[i + len(BEGIN) : j])


def script_command(t: Transport, script: str, args: Sequence[str] = ()) -> str:
    """The exact shell command that runs remote/<script>.py with the venv interpreter."""
    py = shlex.quote(t.expand(t.host.python))
    path = shlex.quote(f"remote/{script}.py")
    argv = " ".join(shlex.quote(str(a)) for a in args)
    return (
        f"cd {shlex.quote(t.expand(t.host.workdir_path))} 2>/dev/null || exit {NO_SCRIPT}; "
        f"test -x {py} || exit {NO_VENV}; test -f {path} || exit {NO_SCRIPT}; "
        f"exec {py} {path} {argv}"
    )


def run_script(t: Transport, script: str, args: Sequence[str] = (), *, timeout: Optional[float] = None,
               changes: bool = True) -> dict:
    """Run a remote script; return its payload (which carries ``ok``). Under --dry-run a script
    that changes the host (changes=True) is shown, not run."""
    h = t.host
    cmd = script_command(t, script, args)
    if t.dry_run and changes:
        t.say(f"run: {cmd}")
        return {"ok": True, "dry_run": True}
    r = t.run(cmd, timeout=timeout, changes=changes)
    if r.exited == NO_VENV:
        raise SpecopsError(
            f"venv {h.venv_path} is missing on {h.name} (no {h.python}): run `inv bootstrap --host {h.name}`"
        )
    if r.exited == NO_SCRIPT:
        raise SpecopsError(
            f"remote/{script}.py is not on {h.name} (workdir {h.workdir_path}): run `inv push --host {h.name}`"
            + (" (it only copies specops' scripts), then the dry run again: it reads the host with them and "
               "changes nothing" if t.dry_run else "")
        )
    try:
        payload = decode_payload(r.stdout)
    except json.JSONDecodeError as e:
        raise SpecopsError(f"remote/{script}.py on {h.name} printed a broken payload: {e}") from None
    if payload is None:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise SpecopsError(f"remote/{script}.py on {h.name} exited {r.exited} without a result", detail=tail)
    payload.setdefault("exit", r.exited)
    return payload
