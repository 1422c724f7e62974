r"""A recording connection for the command-building logic (as patchwork's tests do: assert the
exact command). It adds to the real-sshd tests, never replaces them: nothing here proves a
command works on a host, only that specops builds the one it means to.

    t = RecordingTransport(host, answers=[(r"printf %s \"\$HOME\"", 0, "/home/u")])
    run_script(t, "check.preflight", ["--json"])
    assert t.commands[-1] == "cd ... exec ... -m specops_host.check.preflight --json"

answers: (regex, exit, stdout[, stderr]) tried in order against each command; the first match
answers, else exit 0 and no output. files: host path -> bytes for read_bytes. Every operation is
recorded in `ops` as (verb, ...) in order; `commands` lists the commands alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from specops.host.transport import Result, Transport


class RecordingTransport(Transport):
    def __init__(self, host, *, answers=(), files=None, home: str = "/home/u", pushed: bool = True, **kw):
        super().__init__(host, **kw)
        self.answers = [(re.compile(a[0]), *a[1:]) for a in answers]
        self.files = dict(files or {})
        self.ops: list[tuple] = []
        self._home = home
        if pushed:  # (push itself is tested against the real sshd)
            self.pushed = []

    @property
    def commands(self) -> list[str]:
        return [op[1] for op in self.ops if op[0] == "run"]

    def _run(self, cmd: str, *, timeout: Optional[float] = None, hide: bool = True, out_stream=None) -> Result:
        self.ops.append(("run", cmd))
        for pat, code, out, *err in self.answers:
            if pat.search(cmd):
                if out_stream is not None:  # (a command whose lines are read as they come: all at once here)
                    out_stream.write(out)
                return Result(cmd, code, out, err[0] if err else "")
        return Result(cmd, 0, "", "")

    def _put(self, local: str, remote: str) -> None:
        self.ops.append(("put", remote, Path(local).read_bytes()))

    def _sync_up(self, local_dir: str, remote_dir: str, *, delete: bool = False) -> None:
        self.ops.append(("sync_up", local_dir, remote_dir, delete))

    def get(self, remote: str, local: str) -> None:
        self.ops.append(("get", remote, local))
        Path(local).write_bytes(self.files[remote])

    def _read_bytes(self, path: str, offset: int = 0, limit: int = 4 << 20) -> Optional[bytes]:
        self.ops.append(("read", path, offset))
        data = self.files.get(path)
        return None if data is None else data[offset:offset + limit]
