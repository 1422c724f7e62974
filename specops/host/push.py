"""Push remote/ (and the profiles) to a host's workdir, by content hash."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

from specops import paths
from specops.errors import SpecopsError

# (no import of the connection's module: the connection calls push(t), and push only uses the
# connection it is given: `t` below is a transport.Transport)


def local_manifest() -> dict[str, str]:
    """{relative path on host: sha256} for everything specops pushes."""
    out = {}
    for src, dst in ((paths.REMOTE_DIR, paths.REMOTE), (paths.PROFILES_DIR, paths.PROFILES)):
        for f in sorted(src.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and not f.name.endswith(".pyc"):
                rel = f"{dst}/{f.relative_to(src).as_posix()}"
                out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _source(rel: str) -> Path:
    for src, dst in ((paths.REMOTE_DIR, paths.REMOTE), (paths.PROFILES_DIR, paths.PROFILES)):
        if rel.startswith(dst + "/"):
            return src / rel[len(dst) + 1 :]
    raise KeyError(rel)


NOT_WRITABLE = 86


def _not_writable(t, wd: str) -> SpecopsError:
    return SpecopsError(f"workdir {wd} on {t.host.name} is not writable by {t.host.user}: "
                        f"fix its permissions or set 'workdir' in hosts.yaml")


def push(t) -> list[str]:
    """Upload changed files; return the relative paths sent (empty: already in sync)."""
    wd = t.expand(t.host.workdir_path)
    q = shlex.quote(wd)
    mine = local_manifest()
    # one round trip: make sure the workdir is there and writable, and read what it holds
    if t.dry_run:  # read what is there; change nothing
        r = t.run(f"cat {shlex.quote(wd + '/' + paths.MANIFEST)} 2>/dev/null; exit 0", changes=False)
    else:
        r = t.run(f"{{ mkdir -p {q}/{paths.STATE} && test -w {q}; }} 2>/dev/null || exit {NOT_WRITABLE}; "
                  f"cat {shlex.quote(wd + '/' + paths.MANIFEST)} 2>/dev/null; exit 0")
    if r.exited == NOT_WRITABLE:
        raise _not_writable(t, wd)
    try:
        theirs = json.loads(r.stdout) if r.ok and r.stdout.strip() else {}
    except json.JSONDecodeError:
        theirs = {}
    changed = [rel for rel, h in mine.items() if theirs.get(rel) != h]
    stale = [rel for rel in theirs if rel not in mine]
    if not changed and not stale:
        return []
    dirs = sorted({os.path.dirname(rel) for rel in changed})
    cmds = [f"mkdir -p {' '.join(shlex.quote(wd + '/' + d) for d in dirs)}"] if dirs else []
    cmds += [f"rm -f {shlex.quote(wd + '/' + rel)}" for rel in stale]
    if cmds:
        t.check(" && ".join(cmds), "preparing remote/ on the host")
    for rel in changed:
        t.put(str(_source(rel)), f"{wd}/{rel}")
    t.put_text(json.dumps(mine, indent=1, sort_keys=True), f"{wd}/{paths.MANIFEST}", label="(manifest)")
    return changed + [f"-{rel}" for rel in stale]
