"""Detached jobs on a host (remote/job.py does the work there): start, status, stop, follow."""

from __future__ import annotations

import os
import re
import shlex
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

from .errors import SpecopsError
from .push import push
from .remote_exec import run_script
from .transport import Transport

RUN_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
ENDED = ("succeeded", "failed", "killed", "stopped", "lost")


def new_run_id(kind: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}"


def validate_run_id(run_id: str) -> str:
    if not RUN_ID.match(run_id or ""):
        raise SpecopsError(
            f"invalid run id {run_id!r}: use 1-128 letters, digits, '.', '_' or '-' (not starting with '.' or '-')"
        )
    return run_id


def run_path(t: Transport, run_id: str, *parts: str) -> str:
    return "/".join([t.expand(t.host.workdir_path), "runs", validate_run_id(run_id), *parts])


def start(t: Transport, run_id: str, argv: Sequence[str], *, kind: str, lock: Optional[str] = None,
          env: Optional[dict] = None, term: str = "group") -> dict:
    """Start argv detached on the host (survives the SSH session). Secrets go through `env`,
    which travels as a 0600 file, never on a command line."""
    validate_run_id(run_id)
    push(t)
    env = {**t.host.env, **(env or {})}  # the host's own job environment (hosts.yaml `env:`)
    args = ["start", "--run-id", run_id, "--kind", kind, "--term", term]
    if lock:
        args += ["--lock", lock]
    if env:
        remote_env = run_path(t, run_id) + ".env"  # (the values never appear in a command)
        t.check(f"mkdir -p {shlex.quote(os.path.dirname(remote_env))} && umask 077 && : > {shlex.quote(remote_env)}",
                "preparing the env file")
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("".join(f"{k}={v}\n" for k, v in env.items()))
        try:
            os.chmod(f.name, 0o600)
            t.put(f.name, remote_env)
        finally:
            os.unlink(f.name)
        args += ["--env-file", remote_env]
    res = run_script(t, "job", [*args, "--", *argv])
    if res.get("dry_run"):
        return {**res, "pid": None, "run_id": run_id}
    if not res.get("ok"):
        raise SpecopsError(f"cannot start {kind} on {t.host.name}: {res.get('error')}")
    return res


def status(t: Transport, run_id: Optional[str] = None) -> list[dict]:
    push(t)
    res = run_script(t, "job", ["status"] + (["--run-id", validate_run_id(run_id)] if run_id else []), changes=False)
    if not res.get("ok"):
        raise SpecopsError(f"{res.get('error')} on {t.host.name}: `inv status --host {t.host.name}` lists the runs")
    return res["jobs"]


def get(t: Transport, run_id: Optional[str], kind: Optional[str] = None) -> dict:
    """One job: the given run id, else the newest (of `kind`)."""
    if run_id:
        return status(t, run_id)[0]
    jobs = [j for j in status(t) if kind is None or j.get("kind") == kind]
    if not jobs:
        raise SpecopsError(f"no {kind or ''} runs on {t.host.name}: start one first".replace("  ", " "))
    return jobs[-1]


def stop(t: Transport, run_id: str, grace: float = 60.0) -> dict:
    push(t)
    res = run_script(t, "job", ["stop", "--run-id", validate_run_id(run_id), "--grace", str(grace)])
    if res.get("dry_run"):
        return {"state": "unchanged (dry run)"}
    if not res.get("ok"):
        raise SpecopsError(f"stop {run_id} on {t.host.name}: {res.get('error')}")
    return res


def ended(state: str) -> bool:
    return state.startswith(ENDED)


def follow(t: Transport, run_id: str, *, offset: int = 0, write: Callable[[bytes], None] = None,
           poll: float = 0.5, until_end: bool = True, reconnect: Callable[[], Transport] = None,
           tries: int = 5) -> tuple[int, Optional[int]]:
    """Print the job's log from byte `offset` as it grows, until the job ends (exit code) or
    forever if not until_end. Lost connections are retried with backoff (`reconnect`), from the
    byte last printed: no line is lost or repeated. Returns (offset, exit code or None)."""
    write = write or (lambda b: (sys.stdout.buffer.write(b), sys.stdout.flush()))
    where = None
    failures = 0
    while True:
        try:
            if where is None:  # (needs the host's $HOME: inside the retry loop too)
                where = run_path(t, run_id, "output.log"), run_path(t, run_id, "exit_code")
            log, code_file = where
            code = t.read_bytes(code_file)
            chunk = t.read_bytes(log, offset)
            failures = 0
        except SpecopsError:
            if reconnect is None or failures >= tries:
                raise
            failures += 1
            delay = min(2 ** failures, 30)
            print(f"[specops] connection to {t.host.name} lost; reconnecting in {delay}s "
                  f"({failures}/{tries})", file=sys.stderr)
            time.sleep(delay)
            try:
                t = reconnect()
            except SpecopsError:
                if failures >= tries:
                    raise SpecopsError(f"gave up following {run_id} on {t.host.name} after {tries} "
                                       f"reconnects: the job keeps running; `inv logs -f` resumes") from None
            continue
        if chunk:
            write(chunk)
            offset += len(chunk)
        if code is not None and until_end:
            rest = t.read_bytes(log, offset) or b""
            if rest:
                write(rest)
                offset += len(rest)
            return offset, int(code.decode().strip() or 0)
        if not chunk:
            time.sleep(poll)


def tail(t: Transport, run_id: str, n: int = 25) -> str:
    data = t.read_bytes(run_path(t, run_id, "output.log"), 0) or b""
    return "\n".join(data.decode(errors="replace").splitlines()[-n:])


def run_attached(t: Transport, run_id: str, argv: Sequence[str], *, kind: str, lock: Optional[str] = None,
                 detach: bool = False, stop_on_interrupt: bool = True, term: str = "group") -> Optional[int]:
    """Start a job and follow its log until it ends. Ctrl-C stops it (stop_on_interrupt) or
    detaches. Returns the exit code (None if detached)."""
    from .ui import console, err_console

    j = start(t, run_id, argv, kind=kind, lock=lock, term=term)
    if t.dry_run:
        return None
    console.print(f"\\[specops] {kind} started on {t.host.name}: run {run_id} (pid {j['pid']}); "
                  f"`inv logs -f --run-id {run_id}` follows it")
    if detach:
        return None
    if not stop_on_interrupt:
        from .runs_view import follow as follow_or_detach

        return follow_or_detach(t, run_id)
    try:
        _, code = follow(t, run_id, reconnect=getattr(t, "reopen", None))
    except KeyboardInterrupt:
        err_console.print(f"\n\\[specops] interrupted: stopping {run_id} (and the processes it started) ...")
        res = stop(t, run_id, grace=60)
        err_console.print(f"\\[specops] {run_id}: {res['state']}")
        raise SpecopsError(f"{kind} {run_id} interrupted and stopped on {t.host.name}") from None
    return code
