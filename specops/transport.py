"""The transport interface: run, put, get and a bulk sync, for one host.

Two implementations: ``ssh.SSHTransport`` (Fabric, one connection per task) and
``local.LocalTransport`` (this machine). ``connect(host)`` picks one. Policy (what to run)
lives elsewhere; a transport only moves commands and bytes.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Optional

from .errors import SpecopsError
from .inventory import Host


@dataclass
class Result:
    command: str
    exited: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exited == 0


class Transport:
    host: Host
    #: --dry-run: commands and transfers that would change the host are printed, not run;
    #: read-only queries (changes=False) still run, so the plan shown is the real one.
    dry_run: bool = False
    #: a per-command timeout for every run() that names none (fan-out over several hosts)
    default_timeout: Optional[float] = None
    #: --dry-run: the host paths a real run would have put there (so later reads can allow for them)
    would_put: frozenset = frozenset()

    def run(self, cmd: str, *, timeout: Optional[float] = None, hide: bool = True, changes: bool = True) -> Result:
        """Run a shell command on the host; never raises on a non-zero exit."""
        timeout = timeout if timeout is not None else self.default_timeout
        if self.dry_run and changes:
            self.say(f"run: {cmd}")
            return Result(cmd, 0, "", "")
        return self._run(cmd, timeout=timeout, hide=hide)

    def put(self, local: str, remote: str) -> None:
        if self.dry_run:
            self.say(f"put: {shlex.quote(local)} -> {self.host.name}:{shlex.quote(remote)}")
            self.would_put = self.would_put | {remote}
            return
        self._put(local, remote)

    def sync_up(self, local_dir: str, remote_dir: str, *, delete: bool = False) -> None:
        """Make remote_dir hold local_dir's files (bulk, incremental)."""
        if self.dry_run:
            self.say(f"sync: {shlex.quote(local_dir)}/ -> {self.host.name}:{shlex.quote(remote_dir)}/"
                     + (" (--delete)" if delete else ""))
            return
        self._sync_up(local_dir, remote_dir, delete=delete)

    def say(self, what: str) -> None:
        print(f"DRY-RUN {self.host.name}: {what}", flush=True)

    def _run(self, cmd: str, *, timeout: Optional[float] = None, hide: bool = True) -> Result:
        raise NotImplementedError

    def _put(self, local: str, remote: str) -> None:
        raise NotImplementedError

    def _sync_up(self, local_dir: str, remote_dir: str, *, delete: bool = False) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: str) -> None:
        raise NotImplementedError

    def read_bytes(self, path: str, offset: int = 0, limit: int = 4 << 20) -> Optional[bytes]:
        """Bytes of a host file from offset (at most limit); None if the file does not exist."""
        raise NotImplementedError

    def sync_down(self, remote_dir: str, local_dir: str, *, partial: bool = True,
                  progress: bool = False, checksum: bool = False, bwlimit: int = 0) -> None:
        """Make local_dir hold remote_dir's files (bulk, incremental, resumable)."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    # -- helpers shared by both implementations -----------------------------------------
    _home: Optional[str] = None

    def home(self) -> str:
        if self._home is None:
            r = self.run('printf %s "$HOME"', changes=False)
            if not r.ok or not r.stdout.startswith("/"):
                raise SpecopsError(f"cannot read $HOME on {self.host.name}: {r.stderr.strip()}")
            self._home = r.stdout
        return self._home

    def expand(self, path: str) -> str:
        """Expand a leading ``~`` against the host's home (paths are always quoted later)."""
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    def check(self, cmd: str, what: str, hint: str = "", timeout: Optional[float] = None,
              changes: bool = True) -> Result:
        r = self.run(cmd, timeout=timeout, changes=changes)
        if not r.ok:
            err = (r.stderr or r.stdout).strip().splitlines()
            tail = err[-1] if err else f"exit {r.exited}"
            raise SpecopsError(f"{what} failed on {self.host.name}: {tail}" + (f": {hint}" if hint else ""))
        return r

    def exists(self, path: str, kind: str = "-e") -> bool:
        return self.run(f"test {kind} {shlex.quote(path)}", changes=False).ok

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(host: Host, **kw) -> Transport:
    if host.transport == "local":
        from .local import LocalTransport

        return LocalTransport(host)
    from .ssh import SSHTransport

    kw.setdefault("connect_timeout", host.connect_timeout)
    t = SSHTransport(host, **kw)
    t.open()
    return t
