"""The connection to one host: run, put, get and a bulk sync, plus what every task shares.

Two implementations: ``ssh.SSHTransport`` (Fabric, one connection per task) and
``local.LocalTransport`` (this machine); ``connection.connect(host, dry_run=...)`` picks one.
Policy (what to run) lives elsewhere. The connection owns the concerns every operation shares:

- reads and changes are separate verbs (pyinfra's facts and operations): ``fact(cmd)`` reads the
  host and always runs, ``change(cmd)`` (and put, put_text, sync_up) changes it: under --dry-run
  a change is recorded, not run, so the plan is the real one and a read is never planned by
  mistake; ``run(cmd, changes=...)`` is the one both go through;
- dry-run: the connection alone knows it (pyinfra's model: operations say what they do, the
  executor runs or shows it). The changes are kept as a ``Plan`` (commands, transfers, the host
  files it would write, the other steps it would take: ``plan_of()``), each also a "plan" note as
  it comes; a planned change answers with a stand-in (``Unmade``: ok, and reading anything else
  of it stops the dry run), and a read of a host path a planned change would have written stops
  it too: ``NotDone``, one line, rendered by the CLI under the plan so far. Operations never ask
  whether it is a dry run: ``would(what)`` says a step (a plan line under --dry-run, nothing on a
  real run), ``either(done, would)`` picks a sentence's tense, ``pending(path)`` tells a path a
  planned change would have written;
- push: ``ensure_pushed()`` sends specops_host/ at most once per connection (every remote script call
  goes through it);
- reconnect: ``reconnect()`` re-opens the same object in place after a drop;
- output: library code never prints; it hands lines to ``note()`` and the connection passes them
  to its ``on_note`` sink (the views module renders them; by default they are only kept in
  ``notes``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from specops.errors import SpecopsError
from specops.inventory import Host

#: what a note is: progress ("info"), a warning, a finished step, a dry-run plan line
NOTE_KINDS = ("info", "warn", "done", "plan")


@dataclass
class Result:
    command: str
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


@dataclass
class Note:
    host: str
    kind: str
    text: str


@dataclass
class Plan:
    """What a --dry-run on one host would have done: the shell commands it would run, the transfers
    it would make, the host files they would write, and the other steps (a job it would start, a
    preflight it would run), each as said."""
    host: str
    commands: list[str] = field(default_factory=list)
    transfers: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.commands or self.transfers or self.steps)


class NotDone(Exception):
    """Under --dry-run: what follows reads what a planned change would have made (a job's log, a
    script's reply, a file it writes), which a dry run did not make: the dry run stops here, with
    this one line under the plan so far (exit 0: nothing went wrong, nothing was changed). Not a
    SpecopsError: no retry, refusal or clean-up path takes it for a failure."""

    def __init__(self, message: str, host: str = ""):
        super().__init__(message)
        self.host = host


class Unmade:
    """The stand-in reply of a change a dry run planned and did not make: `ok` (exit 0), and
    reading anything else of it stops the dry run (NotDone, naming the change)."""

    ok = True
    exited = 0
    exit = 0

    def __init__(self, what: str, host: str = ""):
        object.__setattr__(self, "_what", what)
        object.__setattr__(self, "_host", host)

    def _stop(self, name: str = "") -> NotDone:
        return NotDone(f"stops here: what follows reads {self._what}" + (f" ({name})" if name else "")
                       + ", which only a real run makes", self._host)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._stop(name)

    def __setattr__(self, name: str, value) -> None:
        raise self._stop(name)

    def __getitem__(self, key):
        raise self._stop(str(key))

    def get(self, key, default=None):
        raise self._stop(str(key))

    def __repr__(self) -> str:
        return f"Unmade({self._what!r})"


class Lines:
    """A stream (invoke's out_stream) handing each whole line written to it to a callback, as it comes."""

    def __init__(self, on_line: Callable[[str], None]):
        self.on_line, self.rest = on_line, ""

    def write(self, text: str) -> None:
        *whole, self.rest = (self.rest + text).split("\n")
        for ln in whole:
            self.on_line(ln.rstrip("\r"))

    def flush(self) -> None:
        pass


class Transport:
    host: Host

    def __init__(self, host: Host, *, dry_run: bool = False, on_note: Optional[Callable[[Note], None]] = None,
                 on_log: Optional[Callable[[bytes], None]] = None, default_timeout: Optional[float] = None,
                 hint_args: str = ""):
        self.host = host
        self.dry_run = dry_run
        self.on_note = on_note
        #: where a followed job log goes (the views' writer; by default nowhere)
        self.on_log = on_log
        #: the --host/--hosts the user gave, repeated in every hint (`inv logs -f ... --hosts F`)
        self.hint_args = hint_args or (f"--host {shlex.quote(host.name)}" if host.name != "local" else "")
        #: a per-command timeout for every run() that names none (fan-out over several hosts)
        self.default_timeout = default_timeout
        #: --dry-run: the host paths a real run would have written (a read of one stops the dry run)
        self._unmade: set[str] = set()
        self.planned: list[str] = []
        self._plan = Plan(host.name)
        self.notes: list[Note] = []
        self.pushed: Optional[list[str]] = None
        #: (stage, seconds) of every outermost stage or step that ended well, in order (stage())
        self.timings: list[tuple[str, float]] = []
        self._depth = 0
        self._home: Optional[str] = None

    # -- output -------------------------------------------------------------------------
    def note(self, text: str, kind: str = "info") -> None:
        n = Note(self.host.name, kind, text)
        self.notes.append(n)
        if self.on_note is not None:
            self.on_note(n)

    def log(self, chunk: bytes) -> None:
        if self.on_log is not None:
            self.on_log(chunk)

    def hint(self, task: str) -> str:
        """`inv TASK` as the user should type it next: with the --host/--hosts they gave."""
        return f"inv {task}" + (f" {self.hint_args}" if self.hint_args else "")

    def plan(self, what: str, *, command: Optional[str] = None, transfer: bool = False,
             file: Optional[str] = None) -> None:
        """Under --dry-run: what a real run would do here (said as `what`): a shell command, a
        transfer (writing `file` on the host, when it is one file), or another step."""
        self.planned.append(what)
        if command is not None:
            self._plan.commands.append(command)
        elif transfer:
            self._plan.transfers.append(what)
        else:
            self._plan.steps.append(what)
        if file is not None:
            self._plan.files.append(file)
        self.note(what, "plan")

    def would(self, what: str) -> None:
        """A step a real run takes here, said (`what`, "would ..."): a plan line under --dry-run,
        nothing on a real run (the step itself says it as it is done)."""
        if self.dry_run:
            self.plan(what)

    def either(self, done: str, would: str) -> str:
        """A sentence's tense: `done` on a real run, `would` under --dry-run."""
        return would if self.dry_run else done

    def wrote(self, *paths: str) -> None:
        """The changes just made write these host paths: under --dry-run they are not there, and
        a later read of one (or of a path under it) stops the dry run; pending() tells them."""
        if self.dry_run:
            self._unmade.update(p.rstrip("/") for p in paths)

    def pending(self, path: str) -> bool:
        """Whether `path` is one a change of this dry run would have written (it is not there yet)."""
        return any(path == p or path.startswith(p + "/") for p in self._unmade)

    def planned_change(self, cmd: str, what: str, *, said: Optional[str] = None, writes: tuple = (),
                       standin=None):
        """Under --dry-run: the change `cmd` planned (said as `said`, else `run: cmd`), the paths it
        writes kept (wrote()), and the reply the dry run goes on with: `standin`, else an Unmade
        naming `what`. None on a real run: the caller runs it."""
        if not self.dry_run:
            return None
        self.plan(said or f"run: {cmd}", command=None if said else cmd)
        self.wrote(*writes)
        return standin if standin is not None else Unmade(what, self.host.name)

    def plan_of(self) -> Plan:
        """What this connection's --dry-run would have done so far (a copy)."""
        p = self._plan
        return Plan(p.host, list(p.commands), list(p.transfers), list(p.files), list(p.steps))

    @contextlib.contextmanager
    def stage(self, what: str) -> Iterator[None]:
        """Time a part of a task, no line printed: an outermost one that ends well (not under
        --dry-run) is kept in `timings` as (what, seconds), in order (the demo's stage table)."""
        t0, self._depth = time.time(), self._depth + 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth and not self.dry_run:
            self.timings.append((what, time.time() - t0))

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        """A named step (a stage): a 'done' note with its time when it ends (a 'warn' one if it
        fails); under --dry-run a 'would' line, no tick and no time (nothing was done)."""
        t0 = time.time()
        try:
            with self.stage(what):
                yield
        except NotDone:  # (the dry run stops inside it: said as a step it would take)
            self.note(f"would: {what}", "info")
            raise
        except BaseException:
            self.note(f"✗ {what} ({time.time() - t0:.1f}s)", "warn")
            raise
        if self.dry_run:
            self.note(f"would: {what}", "info")
        else:
            self.note(f"✓ {what} ({time.time() - t0:.1f}s)", "done")

    # -- push ---------------------------------------------------------------------------
    def ensure_pushed(self) -> list[str]:
        """specops_host/ (and the profiles) on the host, sent at most once per connection."""
        if self.pushed is None:
            from specops.host.push import push  # (push uses this connection's own operations)

            self.pushed = push(self)
        return self.pushed

    # -- operations ----------------------------------------------------------------------
    def fact(self, cmd: str, *, timeout: Optional[float] = None,
             on_line: Optional[Callable[[str], None]] = None) -> Result:
        """Read the host with a shell command that changes nothing: it runs, --dry-run or not."""
        return self.run(cmd, timeout=timeout, changes=False, on_line=on_line)

    def change(self, cmd: str, *, timeout: Optional[float] = None,
               on_line: Optional[Callable[[str], None]] = None) -> Result:
        """Change the host with a shell command: under --dry-run planned (exit 0, no output), not run."""
        return self.run(cmd, timeout=timeout, changes=True, on_line=on_line)

    def run(self, cmd: str, *, timeout: Optional[float] = None, hide: bool = True, changes: bool = True,
            on_line: Optional[Callable[[str], None]] = None) -> Result:
        """Run a shell command on the host (fact and change name which it is); never raises on a
        non-zero exit. on_line gets each line of its stdout as it comes (stdout is still captured whole)."""
        timeout = timeout if timeout is not None else self.default_timeout
        if self.dry_run and changes:
            self.plan(f"run: {cmd}", command=cmd)
            return Result(cmd, 0, "", "")
        if on_line is not None:
            return self._run(cmd, timeout=timeout, hide="stderr", out_stream=Lines(on_line))
        return self._run(cmd, timeout=timeout, hide=hide)

    def put(self, local: str, remote: str) -> None:
        if self.dry_run:
            self.plan(f"put: {shlex.quote(local)} -> {self.host.name}:{shlex.quote(remote)}", transfer=True,
                      file=remote)
            self.wrote(remote)
            return
        self._put(local, remote)

    def put_text(self, text: str, remote: str, *, label: str = "(text)", private: bool = False,
                 whole: bool = False) -> None:
        """Write text to a host file (through a local temporary file). private: mode 0600 (the
        remote file must already exist with that mode, or be created under a umask); whole: sent
        beside it, then renamed over it, so a reader never sees it half-written. Under --dry-run
        the plan names it `label`."""
        if self.dry_run:
            self.put(label, remote)
            return
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write(text)
        try:
            if private:
                os.chmod(f.name, 0o600)
            part = f"{remote}.{os.getpid()}.part" if whole else remote
            self._put(f.name, part)
            if whole:
                self.check(f"mv -f {shlex.quote(part)} {shlex.quote(remote)}", f"replacing {remote}")
        finally:
            os.unlink(f.name)

    def sync_up(self, local_dir: str, remote_dir: str, *, delete: bool = False) -> None:
        """Make remote_dir hold local_dir's files (bulk, incremental)."""
        if self.dry_run:
            self.plan(f"sync: {shlex.quote(local_dir)}/ -> {self.host.name}:{shlex.quote(remote_dir)}/"
                      + (" (--delete)" if delete else ""), transfer=True)
            return
        self._sync_up(local_dir, remote_dir, delete=delete)

    def _run(self, cmd: str, *, timeout: Optional[float] = None, hide=True, out_stream=None) -> Result:
        raise NotImplementedError

    def _put(self, local: str, remote: str) -> None:
        raise NotImplementedError

    def _sync_up(self, local_dir: str, remote_dir: str, *, delete: bool = False) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: str) -> None:
        raise NotImplementedError

    def read_bytes(self, path: str, offset: int = 0, limit: int = 4 << 20) -> Optional[bytes]:
        """Bytes of a host file from offset (at most limit); None if the file does not exist. Under
        --dry-run a file a planned change would have written stops the dry run (NotDone)."""
        if self.pending(path):
            raise NotDone(f"stops here: what follows reads {path}, which only a real run writes", self.host.name)
        return self._read_bytes(path, offset, limit)

    def _read_bytes(self, path: str, offset: int = 0, limit: int = 4 << 20) -> Optional[bytes]:
        raise NotImplementedError

    def sync_down(self, remote_dir: str, local_dir: str, *, partial: bool = True,
                  progress: bool = False, checksum: bool = False, bwlimit: int = 0) -> None:
        """Make local_dir hold remote_dir's files (bulk, incremental, resumable)."""
        raise NotImplementedError

    def open(self) -> None:
        pass

    def reconnect(self) -> None:
        """Re-open this connection in place after a drop (same object, same settings)."""

    def close(self) -> None:
        pass

    # -- helpers shared by both implementations -----------------------------------------
    def home(self) -> str:
        if self._home is None:
            r = self.fact('printf %s "$HOME"')
            if not r.ok or not r.stdout.startswith("/"):
                raise SpecopsError(f"cannot read $HOME on {self.host.name}: {r.stderr.strip()}")
            self._home = r.stdout
        return self._home

    def expand(self, path: str) -> str:
        """Expand a leading ``~`` against the host's home (paths are always quoted later)."""
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    @property
    def workdir(self) -> str:
        return self.expand(self.host.workdir_path)

    def check(self, cmd: str, what: str, hint: str = "", timeout: Optional[float] = None,
              changes: bool = True) -> Result:
        r = (self.change if changes else self.fact)(cmd, timeout=timeout)
        if not r.ok:
            err = (r.stderr or r.stdout).strip().splitlines()
            tail = err[-1] if err else f"exit {r.exited}"
            raise SpecopsError(f"{what} failed on {self.host.name}: {tail}" + (f": {hint}" if hint else ""))
        return r

    def exists(self, path: str, kind: str = "-e") -> bool:
        if self.pending(path):
            raise NotDone(f"stops here: what follows looks for {path}, which only a real run writes", self.host.name)
        return self.fact(f"test {kind} {shlex.quote(path)}").ok

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
