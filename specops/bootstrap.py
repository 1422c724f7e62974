"""bootstrap: create/refresh the host venv from a pinned profile and push remote/.

Steps, each small and idempotent: workdir, push, venv (``base_python -m venv``: the only
bare interpreter specops ever starts on a host), install (remote/install_profile.py, which
does nothing but verify when the venv's stamp matches the profile).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Optional

from . import paths, profiles
from .errors import SpecopsError
from .push import push
from .remote_exec import run_script
from .transport import Transport
from .ui import console, step


@dataclass
class Outcome:
    venv_created: bool = False
    pushed: list[str] = field(default_factory=list)
    install: dict = field(default_factory=dict)


def venv_command(t: Transport) -> str:
    h = t.host
    return f"{shlex.quote(h.base_python)} -m venv {shlex.quote(t.expand(h.venv_path))}"


def ensure_venv(t: Transport) -> bool:
    h = t.host
    py = t.expand(h.python)
    if t.exists(py, "-x"):
        return False
    bp = shlex.quote(h.base_python)
    if not t.run(f"command -v {bp} >/dev/null", changes=False).ok:
        raise SpecopsError(
            f"base_python {h.base_python!r} not found on {h.name}: install it or set 'base_python' "
            f"in hosts.yaml to an interpreter that exists there"
        )
    r = t.run(venv_command(t))
    if not r.ok:
        err = (r.stderr or r.stdout).strip().splitlines()
        raise SpecopsError(
            f"creating venv {h.venv_path} on {h.name} with {h.base_python} failed: "
            f"{err[-1] if err else r.exited} (Debian/Ubuntu: apt-get install python3-venv)"
        )
    return True


def install(t: Transport, profile: profiles.Profile, *, force: bool = False,
            wheelhouse: Optional[str] = None) -> dict:
    log = f"{paths.LOGS}/install-{profile.name}.log"
    args = ["--profile", f"{paths.PROFILES}/{profile.name}.txt", "--sha256", profile.sha256, "--log", log]
    if wheelhouse:
        args += ["--wheelhouse", wheelhouse]
    if force:
        args.append("--force")
    res = run_script(t, "install_profile", args)
    if res.get("dry_run"):
        return {"ok": True, "action": "installed or verified (dry run)"}
    if not res.get("ok"):
        bad = ", ".join(f"{m['package']} want {m['want']} have {m['have']}" for m in res.get("mismatches", []))
        what = f"pins not satisfied ({bad})" if bad else f"pip exited {res.get('pip_exit')}"
        raise SpecopsError(
            f"installing profile {profile.name!r} on {t.host.name} failed: {what}; full log: "
            f"{t.expand(t.host.workdir_path)}/{log}",
            detail="\n".join(res.get("tail", [])),
        )
    return res


def bootstrap(t: Transport, *, profile: Optional[str] = None, force: bool = False,
              wheelhouse: Optional[str] = None) -> Outcome:
    h = t.host
    prof = profiles.load(profile or h.profile)
    out = Outcome()
    with step(f"push remote/ to {h.name}:{h.workdir_path}"):
        out.pushed = push(t)
    with step(f"venv {h.venv_path}"):
        out.venv_created = ensure_venv(t)
    with step(f"profile {prof.name} ({prof.sha256[:12]}) -> {h.venv_path}"):
        out.install = install(t, prof, force=force, wheelhouse=wheelhouse)
    console.print(
        f"[green]bootstrap {h.name}[/]: venv {'created' if out.venv_created else 'present'}, "
        f"{len(out.pushed)} file(s) pushed, profile {prof.name} {out.install.get('action')}"
        + (f" in {out.install.get('seconds')}s" if out.install.get("action") == "installed" else "")
    )
    return out
