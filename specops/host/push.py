"""Push the host package specops_host/ (every subfolder) and the profiles to a host's workdir, by
content hash. The flat remote/ folder an older specops pushed is listed too: its files, in the old
manifest and no longer here, are deleted like any stale file (nothing imports them: the host runs
`python -m specops_host.<job>.<module>`)."""

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


#: (folder here, folder relative to the workdir) for everything specops pushes
PUSHED = ((paths.HOST_PKG_DIR, paths.HOST_PKG), (paths.PROFILES_DIR, paths.PROFILES))


def local_manifest() -> dict[str, str]:
    """{relative path on host: sha256} for everything specops pushes."""
    out = {}
    for src, dst in PUSHED:
        for f in sorted(src.rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and not f.name.endswith(".pyc"):
                rel = f"{dst}/{f.relative_to(src).as_posix()}"
                out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _source(rel: str) -> Path:
    for src, dst in PUSHED:
        if rel.startswith(dst + "/"):
            return src / rel[len(dst) + 1 :]
    raise KeyError(rel)


NOT_WRITABLE = 86


def _not_writable(t, wd: str) -> SpecopsError:
    return SpecopsError(f"workdir {wd} on {t.host.name} is not writable by {t.host.user}: "
                        f"fix its permissions or set 'workdir' in hosts.yaml")


#: between the host's listing and its manifest in push's one reply
SEP = "@@specops-pushed@@"


#: the host venv's hashlib, where the host has neither sha256sum nor shasum (lines as sha256sum's)
PY_SHA256 = ('import hashlib,sys;[print(hashlib.sha256(open(f,"rb").read()).hexdigest(),f,sep="  ") '
             'for f in sys.argv[1:]]')


def hasher(python: str) -> str:
    """The shell that sets "$@" to a sha256 lister of the files given after it: sha256sum (GNU),
    else `shasum -a 256` (macOS, BSD), else the host venv's python (hashlib), else none (then
    every file counts as changed and is sent)."""
    py = shlex.quote(python)
    return (f"if command -v sha256sum >/dev/null 2>&1; then set -- sha256sum --; "
            f"elif command -v shasum >/dev/null 2>&1; then set -- shasum -a 256 --; "
            f"elif test -x {py}; then set -- {py} -c {shlex.quote(PY_SHA256)}; else set -- false; fi")


def host_listing(wd: str, python: str) -> str:
    """The shell that lists sha256 of the pushed folders' files as they are on the host (not as
    the manifest says: a script edited or deleted there is seen), then the manifest."""
    dirs = " ".join(shlex.quote(d) for d in (paths.HOST_PKG, paths.LEGACY, paths.PROFILES))
    return (f"{hasher(python)}; cd {shlex.quote(wd)} 2>/dev/null && find {dirs} -type f ! -path '*/__pycache__/*' "
            f"! -name '*.pyc' -exec \"$@\" {{}} + 2>/dev/null; echo {SEP}; cat {shlex.quote(paths.MANIFEST)} "
            f"2>/dev/null; exit 0")


def parse_listing(out: str) -> tuple[dict[str, str], dict[str, str]]:
    """(what the host holds: {rel: sha256}, what the manifest says was pushed)."""
    listing, _, manifest = out.partition(SEP + "\n")
    held = {}
    for line in listing.splitlines():
        digest, sep, rel = line.partition("  ")
        if sep and len(digest) == 64:
            held[rel] = digest
    try:
        pushed = json.loads(manifest) if manifest.strip() else {}
    except json.JSONDecodeError:
        pushed = {}
    return held, pushed if isinstance(pushed, dict) else {}


def push(t) -> list[str]:
    """Upload the files the host does not hold as they are here (changed here, or edited or
    deleted there); return the relative paths sent (empty: already in sync)."""
    wd = t.expand(t.host.workdir_path)
    q = shlex.quote(wd)
    mine = local_manifest()
    py = t.expand(t.host.python)
    # one round trip: make sure the workdir is there and writable, and hash what it holds
    if t.dry_run:  # read what is there; change nothing
        r = t.fact(host_listing(wd, py))
    else:
        r = t.change(f"{{ mkdir -p {q}/{paths.STATE} && test -w {q}; }} 2>/dev/null || exit {NOT_WRITABLE}; "
                     + host_listing(wd, py))
    if r.exited == NOT_WRITABLE:
        raise _not_writable(t, wd)
    held, pushed = parse_listing(r.stdout if r.ok else "")
    changed = [rel for rel, h in mine.items() if held.get(rel) != h]
    restored = [rel for rel in changed if pushed.get(rel) == mine[rel]]  # (pushed as it is here, changed there)
    if restored:
        t.note(f"{t.host.name}: {len(restored)} host file(s) no longer as pushed (edited or deleted there): "
               f"restoring {', '.join(restored[:5])}" + (" ..." if len(restored) > 5 else ""), "warn")
    stale = [rel for rel in pushed if rel not in mine and rel in held]
    if not changed and not stale:
        return []
    dirs = sorted({os.path.dirname(rel) for rel in changed})
    cmds = [f"mkdir -p {' '.join(shlex.quote(wd + '/' + d) for d in dirs)}"] if dirs else []
    cmds += [f"rm -f {shlex.quote(wd + '/' + rel)}" for rel in stale]
    if cmds:
        t.check(" && ".join(cmds), f"preparing {paths.HOST_PKG}/ on the host")
    for rel in changed:
        t.put(str(_source(rel)), f"{wd}/{rel}")
    t.put_text(json.dumps(mine, indent=1, sort_keys=True), f"{wd}/{paths.MANIFEST}", label="(manifest)")
    return changed + [f"-{rel}" for rel in stale]
