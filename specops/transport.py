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

    def run(self, cmd: str, *, timeout: Optional[float] = None, hide: bool = True) -> Result:
        """Run a shell command on the host; never raises on a non-zero exit."""
        raise NotImplementedError

    def put(self, local: str, remote: str) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: str) -> None:
        raise NotImplementedError

    def read_bytes(self, path: str, offset: int = 0, limit: int = 4 << 20) -> Optional[bytes]:
        """Bytes of a host file from offset (at most limit); None if the file does not exist."""
        raise NotImplementedError

    def sync_up(self, local_dir: str, remote_dir: str, *, delete: bool = False) -> None:
        """Make remote_dir hold local_dir's files (bulk, incremental)."""
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
            r = self.run('printf %s "$HOME"')
            if not r.ok or not r.stdout.startswith("/"):
                raise SpecopsError(f"cannot read $HOME on {self.host.name}: {r.stderr.strip()}")
            self._home = r.stdout
        return self._home

    def expand(self, path: str) -> str:
        """Expand a leading ``~`` against the host's home (paths are always quoted later)."""
        if path == "~" or path.startswith("~/"):
            return self.home() + path[1:]
        return path

    def check(self, cmd: str, what: str, hint: str = "", timeout: Optional[float] = None) -> Result:
        r = self.run(cmd, timeout=timeout)
        if not r.ok:
            err = (r.stderr or r.stdout).strip().splitlines()
            tail = err[-1] if err else f"exit {r.exited}"
            raise SpecopsError(f"{what} failed on {self.host.name}: {tail}" + (f": {hint}" if hint else ""))
        return r

    def exists(self, path: str, kind: str = "-e") -> bool:
        return self.run(f"test {kind} {shlex.quote(path)}").ok

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def connect(host: Host, **kw) -> Transport:
    if host.transport == "local":
        from .local import LocalTransport

        return LocalTransport(host)
    from .ssh import SSHTransport

    t = SSHTransport(host, **kw)
    t.open()
    return t
