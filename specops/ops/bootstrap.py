"""bootstrap: create/refresh the host venv from a pinned profile and push specops_host/.

Steps, each small and idempotent: workdir, push, venv (``base_python -m venv``: the only
bare interpreter specops ever starts on a host), install (remote/specops_host/install/profile.py, which
does nothing but verify when the venv's stamp matches the profile).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from specops import paths, profiles
from specops.errors import SpecopsError
from specops.payloads import Install, Installed
from specops.host.remote_exec import progress_args, run_script
from specops.host.transport import Transport


@dataclass
class Outcome:
    profile: str = ""
    venv_created: bool = False
    pushed: list[str] = field(default_factory=list)
    install: Optional[Install] = None


def venv_command(t: Transport) -> str:
    h = t.host
    return f"{shlex.quote(h.base_python)} -m venv {shlex.quote(t.expand(h.venv_path))}"


def ensure_venv(t: Transport) -> bool:
    h = t.host
    py = t.expand(h.python)
    if t.exists(py, "-x"):
        return False
    if h.venv_existing:
        raise SpecopsError(f"{h.name} declares venv_existing: true but {h.python} is not there: point "
                           f"'venv' in hosts.yaml at the existing environment (specops never creates it)")
    bp = shlex.quote(h.base_python)
    if not t.fact(f"command -v {bp} >/dev/null").ok:
        raise SpecopsError(
            f"base_python {h.base_python!r} not found on {h.name}: install it or set 'base_python' "
            f"in hosts.yaml to an interpreter that exists there"
        )
    r = t.change(venv_command(t))
    if not r.ok:
        err = (r.stderr or r.stdout).strip().splitlines()
        raise SpecopsError(
            f"creating venv {h.venv_path} on {h.name} with {h.base_python} failed: "
            f"{err[-1] if err else r.exited} (Debian/Ubuntu: apt-get install python3-venv)"
        )
    return True


#: install()'s reply under --dry-run (nothing installed)
NOT_INSTALLED = Install(ok=True, action="not installed (a dry run)")


def install(t: Transport, profile: profiles.Profile, *, force: bool = False,
            wheelhouse: Optional[str] = None) -> Install:
    """The profile into the host venv (remote/specops_host/install/profile.py). Under --dry-run: said, and
    NOT_INSTALLED stands for its reply (what follows, e.g. a pipeline's plan, goes on)."""
    log = f"{paths.LOGS}/install-{profile.name}.log"
    args = ["--profile", f"{paths.PROFILES}/{profile.name}.txt", "--sha256", profile.sha256, "--log", log]
    if wheelhouse:
        args += ["--wheelhouse", wheelhouse]
    if force:
        args.append("--force")
    if os.environ.get("SPECOPS_INSTALLER"):  # (uv or pip: the host's installer; default auto, uv where it fits)
        args += ["--installer", os.environ["SPECOPS_INSTALLER"]]
    if t.host.venv_existing:
        args += ["--existing", "--env-file", f"{paths.STATE}/env-{t.host.profile}.txt"]
    res = run_script(t, "install.profile", args + progress_args(), progress=True,  # (pip's progress as it goes)
                     model=Install, standin=NOT_INSTALLED)
    if res.error:
        raise SpecopsError(f"installing profile {profile.name!r} on {t.host.name} refused: {res.error}")
    if res.mode == "existing" and not res.ok:
        what = (f"it changed {', '.join(f'{n} {a}->{b}' for n, (a, b) in res.changed.items())}"
                if res.changed else f"pip exited {res.pip_exit} (nothing present may be upgraded: "
                f"the missing wheels must fit what is installed)" if res.pip_exit else
                f"what it added does not fit: {'; '.join(res.broken[:3])}" if res.broken else
                f"still missing: {', '.join(res.missing)}")
        raise SpecopsError(f"topping up the existing venv {t.host.venv_path} on {t.host.name} failed: {what}; "
                           f"full log: {t.expand(t.host.workdir_path)}/{log}", detail="\n".join(res.tail))
    if not res.ok:
        bad = ", ".join(f"{m['package']} want {m['want']} have {m['have']}" for m in res.mismatches)
        what = f"pins not satisfied ({bad})" if bad else f"pip exited {res.pip_exit}"
        raise SpecopsError(
            f"installing profile {profile.name!r} on {t.host.name} failed: {what}; full log: "
            f"{t.expand(t.host.workdir_path)}/{log}",
            detail="\n".join(res.tail),
        )
    return res


def push_wheelhouse(t: Transport, local: str, prof: profiles.Profile) -> str:
    """Check a laptop wheelhouse folder against the profile, sync it to <workdir>/.specops/wheelhouse/<profile>
    (incremental), return the host path."""
    from specops.ops import wheelhouse as wh

    man = wh.load_manifest(local)
    if man and man.get("profile") != prof.name:
        raise SpecopsError(f"--wheelhouse {local} was built for profile {man.get('profile')!r}, not {prof.name!r}: "
                           f"run `inv wheelhouse --profile {prof.name}`")
    if man and man.get("profile_sha256") != prof.sha256:
        t.note(f"{local} was built from another version of profile {prof.name}: missing wheels will make pip "
               f"fail (rebuild with `inv wheelhouse`)", "warn")
    if man.get("mode") == "top-up" and not t.host.venv_existing:
        raise SpecopsError(f"--wheelhouse {local} is a top-up for an existing environment ({man.get('have')}), "
                           f"but {t.host.name} gets a fresh venv: build a full one (`inv wheelhouse` without --have)")
    dest = f"{t.expand(t.host.workdir_path)}/{paths.STATE}/wheelhouse/{prof.name}"
    t.sync_up(str(Path(local).expanduser()), dest, delete=True)
    return dest


def existing_profile(t: Transport, prof: profiles.Profile) -> profiles.Profile:
    """An existing venv keeps its torch: the profile of prof's family built on that torch
    (profiles.for_existing), said in one line when it is another one."""
    try:
        res = run_script(t, "install.profile", ["--list-installed"], changes=False, model=Installed)
    except SpecopsError:
        if not t.pending(f"{t.workdir}/{paths.MANIFEST}"):  # (remote/ pushed by this dry run: not there yet)
            raise
        t.would(f"would pick the profile of family {prof.name} built on the venv's torch "
                f"(once specops_host/ is pushed)")
        return prof
    chosen, why = profiles.for_existing(prof.name, res.installed.get("torch", ""))
    if why:
        t.note(f"{t.host.name}: {why}", "warn" if chosen is prof else "info")
    return chosen


def bootstrap(t: Transport, *, profile: Optional[str] = None, force: bool = False,
              wheelhouse: Optional[str] = None) -> Outcome:
    """The venv, specops_host/ pushed, the profile installed or verified (a dry run: each said)."""
    h = t.host
    prof = profiles.load(profile or h.profile)
    with t.step(f"push specops_host/ to {h.name}:{h.workdir_path}"):
        pushed = t.ensure_pushed()
    with t.step(f"venv {h.venv_path}" + (" (existing: never created or upgraded)" if h.venv_existing else "")):
        created = ensure_venv(t)
    if h.venv_existing and not profile:  # (--profile P: the user's choice stands)
        prof = existing_profile(t, prof)
    out = Outcome(profile=prof.name, venv_created=created, pushed=pushed)
    if wheelhouse:
        with t.step(f"wheelhouse {wheelhouse} -> {h.name}"):
            wheelhouse = push_wheelhouse(t, wheelhouse, prof)
    top_up = " (top-up)" if h.venv_existing else ""
    with t.step(f"profile {prof.name} ({prof.sha256[:12]}) -> {h.venv_path}{top_up}"):
        out.install = install(t, prof, force=force, wheelhouse=wheelhouse)
    if out.install.mode == "existing":
        for line in top_up_lines(h.name, out.install):
            t.note(line)
    t.note(t.either(f"bootstrap {h.name}: venv {'created' if out.venv_created else 'present'}, {len(out.pushed)} "
                    f"file(s) pushed, profile {prof.name} {out.install.action}"
                    + (f" in {out.install.seconds}s" if out.install.action == "installed" else ""),
                    f"bootstrap {h.name} would: {'create the venv' if out.venv_created else 'keep the venv'}, push "
                    f"{len(out.pushed)} file(s), install or verify profile {prof.name}"), "done")
    return out


def top_up_lines(name: str, res: Install) -> list[str]:
    """What a top-up of an existing venv added, kept as it was, and could not bring."""
    added = res.added
    return ([f"top-up {name}: added {len(added)} package(s)"
             + (": " + ", ".join(f"{n} {v}" for n, v in sorted(added.items())) if added else " (nothing missing)")]
            + profiles.kept_lines(res.kept, "want", "there")
            + [f"  not installed {d['package']}: {d['reason']}" for d in res.absent]
            + [f"  pip check (left as is): {line}" for line in res.pip_check]
            + overrides_lines(res.overrides, bool(added)))


def overrides_lines(overrides: list, installed: bool) -> list[str]:
    """The pip check lines the profile declares (`#@ keep` / `#@ omit`): each one when the top-up
    installed something, else one line (they were shown when it did)."""
    if not overrides:
        return []
    if not installed:
        return [f"  {len(overrides)} pip check line(s) the profile declares (kept at the venv's version or "
                f"omitted), as when it was installed"]
    return [f"  pip check (declared by the profile): {o['line']} -- {o['why']}" for o in overrides]


class Pushed(list):
    """push_remote(): the relative paths sent (a deleted one as -PATH); empty: already in sync."""


def push_remote(t: Transport) -> Pushed:
    """`inv push`: remote/ (and the profiles) on the host, only what changed."""
    return Pushed(t.ensure_pushed())
