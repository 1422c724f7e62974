"""wheelhouse: a profile's wheels in one folder, for hosts that cannot reach a package index.

    inv wheelhouse --profile cuda [--python 3.12] [--platform manylinux_2_31_x86_64] [--dest DIR]
                   [--have FREEZE.txt | --host H] [--skip NAME,...] [--laptop]

Runs `pip download --only-binary=:all:` on this machine for the host's interpreter and platform
(``--platform manylinux_2_N_ARCH`` is expanded to every manylinux tag such a host accepts, as
pip does for its own interpreter). Two modes:

- **full** (a fresh venv): the whole profile. An exact profile (``#@ mode: exact``) is fetched
  ``--no-deps``; a resolve profile with its dependencies, resolved by pip.
- **top-up** (``--have`` / ``--host``: an existing environment, e.g. a preinstalled torch venv):
  only what is missing there. pip's own resolver decides (``pip install --dry-run
  --ignore-installed --report``: metadata only, no wheel downloaded), with every package the host
  has pinned to its version (``-c``). Packages already present are never replaced: a profile pin
  that cannot resolve against the host's pins is *dropped* with pip's reason (and, with it, the
  pins that only it needed), the others still resolve. Of pip's answer only what the host lacks
  is downloaded, ``--no-deps``. An exact profile brings only its own missing packages.

pip runs through a small shim that makes it judge environment markers and Requires-Python for
the host's interpreter and platform rather than this machine's.

The folder gets ``specops-wheelhouse.json``: profile and its hash, python, platforms, mode, the
wheels with sha256, what was kept and dropped and why. `inv bootstrap --wheelhouse DIR` pushes
the folder and installs from it with ``--no-index --find-links``. ``--laptop`` adds specops' own
laptop-side dependencies (pyproject) under ``DIR/laptop/`` (full resolution), to run specops
itself on a machine with no index.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from specops import paths, profiles
from specops.args import Refused, refusing
from specops.errors import SpecopsError
from specops.ops.resolve import Pip, Requirement, norm, resolve_top_up
from specops.ops.resolve import Graph, constraints_text, pip_reason  # noqa: F401 (callers' names)


MANIFEST = "specops-wheelhouse.json"
DEFAULT_PYTHON = "3.12"
DEFAULT_PLATFORM = "manylinux_2_31_x86_64"  # the lowest the cuda profile resolves for (llguidance 1.7: 2_31)
PY_RE = re.compile(r"^3\.(\d{1,2})$")
PLAT_RE = re.compile(r"^[a-z0-9_]+$")
MANYLINUX = re.compile(r"^manylinux_2_(\d+)_(x86_64|aarch64|i686|ppc64le|s390x)$")


def expand_platform(tag: str) -> list[str]:
    """manylinux_2_28_x86_64 -> [manylinux_2_28 .. manylinux_2_17, manylinux2014, (2010, 1)]:
    every tag a glibc-2.28 host accepts (pip matches --platform tags exactly)."""
    if not PLAT_RE.match(tag or ""):
        raise SpecopsError(f"--platform {tag!r}: give a wheel platform tag such as {DEFAULT_PLATFORM}")
    m = MANYLINUX.match(tag)
    if not m:
        return [tag]
    n, arch = int(m.group(1)), m.group(2)
    if n < 5:
        raise SpecopsError(f"--platform {tag!r}: manylinux_2_N needs N >= 5 (glibc 2.5)")
    out = [f"manylinux_2_{k}_{arch}" for k in range(n, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    for k, name in legacy.items():
        if n >= k and (arch in ("x86_64", "i686") or name == "manylinux2014"):
            out.append(f"{name}_{arch}")
    return out


def host_platform(glibc: str, machine: str) -> str:
    """The wheel platform of a host from its glibc version and machine (what
    `install_profile.py --list-installed` reports): ("2.35", "x86_64") -> manylinux_2_35_x86_64."""
    m = re.match(r"^2\.(\d+)", str(glibc or ""))
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(str(machine or "").lower(), str(machine or "").lower())
    tag = f"manylinux_2_{m.group(1)}_{arch}" if m else ""
    if not m or not MANYLINUX.match(tag):
        raise SpecopsError(f"the host reports glibc {glibc or '(none)'!s} on {machine or '(unknown)'!s}: not a "
                           f"manylinux host; give its wheel platform with --platform (e.g. {DEFAULT_PLATFORM})")
    return tag


def check_python(python: str) -> str:
    if not PY_RE.match(str(python or "")):
        raise SpecopsError(f"--python {python!r}: give the host interpreter's version as 3.N, e.g. {DEFAULT_PYTHON}")
    return str(python)


def parse_profile(text: str) -> list[tuple[str, Optional[str]]]:
    """-> [(requirement, index URL or None)] (the same reading as remote/specops_host/install/profile.py)."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        req, _, comment = line.partition("#")
        idx = re.search(r"index:\s*(\S+)", comment)
        out.append((req.strip(), idx.group(1) if idx else None))
    return out


def read_have(path: str) -> dict[str, Optional[str]]:
    """`pip freeze` / `pip list --format=freeze` output -> {normalized name: version or None}."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise SpecopsError(f"--have {path}: no such file (give the host venv's `pip list --format=freeze` output)")
    have: dict[str, Optional[str]] = {}
    for n, raw in enumerate(p.read_text(errors="replace").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^\s;]+)|@\s*\S+)?\s*$", line)
        if not m:
            raise SpecopsError(f"--have {path}, line {n}: {raw.strip()!r} is not `name==version` "
                               f"(use `pip list --format=freeze`)")
        have[norm(m.group(1))] = m.group(2)
    if not have:
        raise SpecopsError(f"--have {path}: no packages listed (use `pip list --format=freeze`)")
    return have


def sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def laptop_requirements() -> list[str]:
    text = (paths.REPO / "pyproject.toml").read_text()
    try:
        import tomllib

        return list(tomllib.loads(text)["project"]["dependencies"])
    except ImportError:  # Python 3.10
        m = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
        if m is None:
            raise SpecopsError("pyproject.toml: no `dependencies = [...]` list: the laptop's requirements are "
                               "unknown") from None
        return re.findall(r'"([^"]+)"', m.group(1))


def host_environment(t, python: str, platform: Optional[str] = None) -> dict:
    """An existing host venv read over the connection t (remote/specops_host/install/profile.py
    --list-installed, changes nothing): {"installed": {name: version}, "source": "HOST:VENV",
    "python": its version, "platform": its wheel platform (platform if given, else
    host_platform() of the host's glibc and machine)}. Refuses a venv of another Python."""
    from specops.host.remote_exec import run_script

    from specops.payloads import Installed

    res = run_script(t, "install.profile", ["--list-installed"], changes=False, model=Installed)
    if res.python and res.python != python:
        raise SpecopsError(f"{t.host.name}'s venv is Python {res.python}, not {python}: "
                           f"pass --python {res.python}")
    return {"installed": res.installed, "source": f"{t.host.name}:{t.host.venv_path}", "python": res.python,
            "platform": platform or host_platform(res.glibc, res.machine)}


def build(profile: str, *, python: str = DEFAULT_PYTHON, platform: Optional[str] = DEFAULT_PLATFORM,
          dest: Optional[str] = None, have: Optional[dict] = None, have_source: str = "",
          skip: Iterable[str] = (), laptop: bool = False, note=None) -> dict:
    """Build the wheelhouse folder; returns its manifest (plus "dest"). note(line): progress
    lines (default: none); the manifest is rendered with summary_lines()."""
    note = note or (lambda _msg: None)
    if Requirement is None:
        raise SpecopsError(f"`inv wheelhouse` runs pip download: {sys.executable} has no pip (python -m ensurepip)")
    prof = profiles.load(profile)
    picked = ""
    if have is not None:  # a top-up keeps the host's torch: the profile of this family built on it
        chosen, picked = profiles.for_existing(prof.name, have.get("torch") or "")
        if picked:
            note(picked)
        prof = chosen
    python = check_python(python)
    platform = platform or DEFAULT_PLATFORM
    tags = expand_platform(platform)
    out = Path(dest or f"wheelhouse/{prof.name}-py{python}-{platform}").expanduser()
    if out.exists() and not out.is_dir():
        raise SpecopsError(f"--dest {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "pip-download.log"
    log.write_text(f"# specops wheelhouse {prof.name} python {python} {platform} {time.ctime()}\n")
    reqs = parse_profile(prof.text)
    pip = Pip(python, tags, [i for _, i in reqs if i], log=log)
    t0 = time.time()
    man: dict[str, Any] = {"profile": prof.name, "profile_sha256": prof.sha256, "python": python, "platform": platform,
           "platforms": tags, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "mode": "full",
           "requirements": [r for r, _ in reqs], "kept": [], "dropped": []}
    skip = [s.strip() for s in skip if s.strip()]
    if have is not None:
        if picked:
            man["picked"] = picked
        man["mode"], man["have"] = "top-up", have_source
        note(f"resolving what {have_source or 'the host'} lacks for profile {prof.name} (metadata only) ...")
        res = resolve_top_up(reqs, have, pip, skip, exact=prof.mode == "exact", keep=prof.keep, note=note)
        man.update(kept=res["kept"], dropped=res["dropped"], requirements=res["requirements"],
                   overrides=res["overrides"], omitted=prof.omit,
                   install={n: {"version": v["version"], "for": v["for"]} for n, v in res["install"].items()})
        pins = [f"{v['name']}=={v['version']}" for v in res["install"].values()]
        note(f"downloading {len(pins)} wheel(s) ...")
        pip.download(pins, out, deps=False)
    else:
        keep = [(r, i) for r, i in reqs if norm(Requirement(r).name) not in {norm(s) for s in skip}]
        man["dropped"] = [{"package": Requirement(r).name, "requirement": r, "reason": "skipped (--skip)"}
                          for r, _ in reqs if (r, _) not in keep]
        man["requirements"] = [r for r, _ in keep]
        how = "no deps" if prof.mode == "exact" else "resolved by pip"
        note(f"downloading profile {prof.name} ({prof.mode}: {how}) ...")
        pip.download([r for r, _ in keep], out, deps=prof.mode != "exact")
    if laptop:
        lap = out / "laptop"
        lap.mkdir(exist_ok=True)
        note("downloading specops' laptop-side dependencies (pyproject) into laptop/ ...")
        Pip(python, tags, log=log).download(laptop_requirements(), lap, deps=True)
        man["laptop"] = sorted(p.name for p in lap.glob("*.whl"))
    wheels = sorted(out.glob("*.whl"))
    man["wheels"] = {p.name: sha256(p) for p in wheels}
    man["bytes"] = sum(p.stat().st_size for p in wheels)
    man["seconds"] = round(time.time() - t0, 1)
    (out / MANIFEST).write_text(json.dumps(man, indent=1) + "\n")
    man["dest"] = str(out)
    return man


def load_manifest(path: str) -> dict:
    """A wheelhouse folder's manifest (bootstrap's input check): one line if it is not one."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise SpecopsError(f"--wheelhouse {path}: no such folder (build one with `inv wheelhouse --profile P`)")
    m = p / MANIFEST
    if not m.is_file():
        if not list(p.glob("*.whl")):
            raise SpecopsError(f"--wheelhouse {path}: no wheels and no {MANIFEST} there "
                               f"(build one with `inv wheelhouse --profile P`)")
        return {}
    try:
        return json.loads(m.read_text())
    except ValueError as e:
        raise SpecopsError(f"{m}: not valid JSON ({e}): rebuild it with `inv wheelhouse`") from None


def summary_lines(man: dict) -> list[str]:
    """What `inv wheelhouse` built (build()'s manifest) as plain-text lines, no markup: wheels,
    what the host keeps, what was dropped and why, the next command."""
    lines = [f"wheelhouse {man['dest']}: {len(man['wheels'])} wheel(s), {man['bytes'] / 2**20:.1f} MiB "
             f"({man['mode']}, python {man['python']}, {man['platform']}) in {man['seconds']}s"]
    lines += [f"  profile: {man['picked']}"] if man.get("picked") else []
    lines += profiles.kept_lines(man.get("kept", []), "requirement", "on the host")
    lines += [f"  kept {o['kept']} although {o['package']} needs {o['needs']} (the profile's #@ keep)"
              for o in man.get("overrides", [])]
    lines += [f"  omitted {n}: {why}" for n, why in (man.get("omitted") or {}).items()]
    lines += [f"  dropped {d['requirement']}: {d['reason']}" for d in man.get("dropped", [])]
    lines.append(f"next: inv bootstrap --host HOST --wheelhouse {man['dest']}")
    return lines


class Wheelhouse(dict):
    """make(): build()'s manifest."""


def _wheelhouse_flags(profile: Optional[str] = None, have: Optional[str] = None, host: Optional[str] = None,
                      **_) -> None:
    if not profile:
        raise Refused("wheelhouse needs --profile (cuda or cpu)")
    if have and host:
        raise Refused("give --have FILE or --host H, not both")


@refusing(_wheelhouse_flags)
def make(t, profile: str, *, python: str = DEFAULT_PYTHON, platform: Optional[str] = None, dest: Optional[str] = None,
         have: Optional[str] = None, skip: str = "", laptop: bool = False, note=None) -> Wheelhouse:
    """`inv wheelhouse`: build() for the profile; what is there read from --have FILE, or from the
    host's venv when t is a connection (None: this laptop alone)."""
    have_map, source = (read_have(have), str(have)) if have else (None, "")
    if t is not None:
        got = host_environment(t, python, platform)
        have_map, source, platform = got["installed"], got["source"], platform or got["platform"]
    return Wheelhouse(build(profile, python=python, platform=platform, dest=dest, have=have_map, have_source=source,
                            skip=[x for x in skip.split(",") if x.strip()], laptop=laptop, note=note))
