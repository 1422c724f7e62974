"""Local transport: the same operations on this machine, without SSH (Invoke's runner)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from invoke import Context
from invoke.exceptions import CommandTimedOut

from specops.errors import SpecopsError
from specops.inventory import Host
from specops.host.transport import Result, Transport


class LocalTransport(Transport):
    def __init__(self, host: Host, **kw):
        super().__init__(host, **kw)
        self.ctx = Context()

    def _run(self, cmd: str, *, timeout: Optional[float] = None, hide=True, out_stream=None) -> Result:
        try:
            r = self.ctx.run(cmd, hide=hide, warn=True, timeout=timeout, in_stream=False, shell="/bin/sh",
                             out_stream=out_stream)
        except CommandTimedOut:
            raise SpecopsError(f"command timed out after {timeout}s on {self.host.name}: {cmd[:80]}") from None
        assert r is not None  # (warn=True: invoke returns the result, never raises on an exit code)
        return Result(cmd, r.exited, r.stdout, r.stderr)

    def home(self) -> str:
        return os.path.expanduser("~")

    def _put(self, local: str, remote: str) -> None:
        shutil.copy2(local, self.expand(remote))

    def get(self, remote: str, local: str) -> None:
        shutil.copy2(self.expand(remote), local)

    def _read_bytes(self, path: str, offset: int = 0, limit: int = 4 << 20) -> Optional[bytes]:
        try:
            with open(self.expand(path), "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return None

    def _copy_tree(self, src: str, dst: str, extra: list[str]) -> None:
        Path(dst).mkdir(parents=True, exist_ok=True)
        if shutil.which("rsync"):
            p = subprocess.run(["rsync", "-a", *extra, src.rstrip("/") + "/", dst.rstrip("/") + "/"],
                               capture_output=True, text=True)
            if p.returncode != 0:
                raise SpecopsError(f"rsync {src} -> {dst} failed: {p.stderr.strip()[-300:]}")
        else:
            shutil.copytree(src, dst, dirs_exist_ok=True)

    def _sync_up(self, local_dir: str, remote_dir: str, *, delete: bool = False) -> None:
        self._copy_tree(local_dir, self.expand(remote_dir), ["--delete"] if delete else [])

    def sync_down(self, remote_dir: str, local_dir: str, *, partial: bool = True,
                  progress: bool = False, checksum: bool = False, bwlimit: int = 0) -> None:
        extra = (["--partial"] if partial else []) + (["--checksum"] if checksum else [])
        self._copy_tree(self.expand(remote_dir), local_dir, extra)
