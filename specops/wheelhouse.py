"""wheelhouse: a profile's wheels in one folder, for hosts that cannot reach a package index.

    inv wheelhouse --profile cuda [--python 3.12] [--platform manylinux_2_28_x86_64] [--dest DIR]
                   [--have FREEZE.txt | --host H] [--skip NAME,...] [--laptop]

Runs `pip download --only-binary=:all:` on this machine for the host's interpreter and platform
(``--platform manylinux_2_N_ARCH`` is expanded to every manylinux tag such a host accepts, as
pip does for its own interpreter). Two modes:

- **full** (a fresh venv): the whole profile. An exact profile (``#@ mode: exact``) is fetched
  ``--no-deps``; a resolve profile with its dependencies, resolved by pip.
- **top-up** (``--have`` / ``--host``: an existing environment, e.g. a preinstalled torch venv):
  only what is missing there. Packages already present are never replaced: a profile pin whose
  closure needs another version of something present is *dropped* (and, with it, the pins that
  only it needed), with the reason. Metadata comes from the index (``pip install --dry-run
  --report``, no wheel downloaded); then only the chosen wheels are downloaded, ``--no-deps``.

The folder gets ``specops-wheelhouse.json``: profile and its hash, python, platforms, mode, the
wheels with sha256, what was kept and dropped and why. `inv bootstrap --wheelhouse DIR` pushes
the folder and installs from it with ``--no-index --find-links``. ``--laptop`` adds specops' own
laptop-side dependencies (pyproject) under ``DIR/laptop/`` (full resolution), to run specops
itself on a machine with no index.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Iterable, Optional

from . import paths, profiles
from .errors import SpecopsError

try:  # pip always carries packaging; a laptop venv may not have it installed on its own
    from packaging.markers import Marker
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover
    try:
        from pip._vendor.packaging.markers import Marker
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
        from pip._vendor.packaging.specifiers import SpecifierSet
        from pip._vendor.packaging.utils import canonicalize_name
        from pip._vendor.packaging.version import InvalidVersion, Version
    except ImportError:  # no pip either: only load_manifest (bootstrap's check) works here
        Marker = Requirement = SpecifierSet = Version = None
        InvalidRequirement = InvalidVersion = ValueError

        def canonicalize_name(name: str) -> str:
            return re.sub(r"[-_.]+", "-", name).lower()

MANIFEST = "specops-wheelhouse.json"
DEFAULT_PYTHON = "3.12"
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"
PY_RE = re.compile(r"^3\.(\d{1,2})$")
PLAT_RE = re.compile(r"^[a-z0-9_]+$")
MANYLINUX = re.compile(r"^manylinux_2_(\d+)_(x86_64|aarch64|i686|ppc64le|s390x)$")


def norm(name: str) -> str:
    return canonicalize_name(name)


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


def check_python(python: str) -> str:
    if not PY_RE.match(str(python or "")):
        raise SpecopsError(f"--python {python!r}: give the host interpreter's version as 3.N, e.g. {DEFAULT_PYTHON}")
    return str(python)


def parse_profile(text: str) -> list[tuple[str, Optional[str]]]:
    """-> [(requirement, index URL or None)] (the same reading as remote/install_profile.py)."""
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


def marker_env(python: str, platform_tags: list[str]) -> dict:
    tag = platform_tags[0]
    machine = next((a for a in ("x86_64", "aarch64", "i686", "ppc64le", "s390x", "arm64") if tag.endswith(a)), "")
    system = "Linux" if "linux" in tag else "Darwin" if tag.startswith("macosx") else "Windows" if tag.startswith("win") else ""
    sys_platform = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}.get(system, "")
    return {"python_version": python, "python_full_version": f"{python}.0", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "implementation_version": f"{python}.0",
            "os_name": "nt" if system == "Windows" else "posix", "sys_platform": sys_platform,
            "platform_system": system, "platform_machine": machine, "platform_release": "", "platform_version": ""}


def wanted(req: Requirement, env: dict, extras: Iterable[str] = ()) -> bool:
    if req.marker is None:
        return True
    for extra in [""] + sorted(extras):
        try:
            if req.marker.evaluate({**env, "extra": extra}):
                return True
        except Exception:  # noqa: BLE001 -- an unknown marker variable: keep the requirement
            return True
    return False


def contains(spec: SpecifierSet, version: Optional[str]) -> bool:
    if version is None:  # present, version unknown: trust the host
        return True
    try:
        v = Version(version)
    except InvalidVersion:
        return True
    return spec.contains(Version(v.public), prereleases=True) or spec.contains(v, prereleases=True)


class Pip:
    """`pip download` / `pip install --dry-run --report` for the target interpreter and platform."""

    def __init__(self, python: str, platform_tags: list[str], indexes: Iterable[str] = (), log: Optional[Path] = None,
                 source: Iterable[str] = ()):
        """source: pip options naming where wheels come from instead of the configured index
        (e.g. ["--no-index", "--find-links", DIR], a local mirror)."""
        self.python, self.tags, self.log = python, platform_tags, log
        self.target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
        for t in platform_tags:
            self.target += ["--platform", t]
        self.index = list(source)
        for idx in sorted(set(i for i in indexes if i)):
            self.index += ["--extra-index-url", idx]

    def _run(self, args: list[str]) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"]
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"\n$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
        return p

    @staticmethod
    def error_line(p: subprocess.CompletedProcess) -> str:
        lines = [l.strip() for l in (p.stderr + p.stdout).splitlines() if l.strip()]
        errs = [l for l in lines if l.startswith("ERROR:")]
        return (errs[-1] if errs else lines[-1] if lines else f"pip exited {p.returncode}")[:400]

    def report(self, reqs: list[str]) -> tuple[Optional[list[dict]], str]:
        """Metadata of the best wheel for each requirement (no dependencies, no wheel download)."""
        with tempfile.TemporaryDirectory() as d:
            rep = Path(d) / "report.json"
            p = self._run(["install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet", "--report", str(rep),
                           "--target", str(Path(d) / "t"), *self.target, *self.index, *reqs])
            if p.returncode != 0 or not rep.is_file():
                return None, self.error_line(p)
            return json.loads(rep.read_text()).get("install", []), ""

    def download(self, reqs: list[str], dest: Path, *, deps: bool) -> None:
        if not reqs:
            return
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(reqs) + "\n")
        try:
            p = self._run(["download", "--quiet", "--progress-bar", "off", *([] if deps else ["--no-deps"]),
                           *self.target, *self.index, "-d", str(dest), "-r", f.name])
        finally:
            os.unlink(f.name)
        if p.returncode != 0:
            raise SpecopsError(f"pip download for python {self.python} ({self.tags[0]}) failed: {self.error_line(p)}",
                               detail=(p.stderr or p.stdout)[-2000:])


def resolve_top_up(reqs: list[tuple[str, Optional[str]]], have: dict[str, Optional[str]], pip: Pip,
                   env: dict, skip: Iterable[str] = (), max_backtrack: int = 12, exact: bool = False) -> dict:
    """What an existing environment lacks for the profile, never replacing what it has.

    A small resolver over wheel metadata: a missing package whose newest version needs another
    version of something present is stepped back (``!=`` that version, up to max_backtrack
    times); a profile pin that still clashes is dropped with the reason, and so are the pins
    that only a dropped pin needed. ``exact`` (an exact profile: the whole environment): only the
    profile's own packages are brought; a dependency outside it is not (the profile left it out on
    purpose, e.g. torchvision on cpu hosts), one inside it must match the pin. Returns
    {"install": {name: {name, version, for}},
    "kept": [...], "dropped": [...], "requirements": [...]}.
    """
    skip = {norm(s) for s in skip}
    roots: dict[str, Requirement] = {}
    kept, dropped = [], []
    for line, _ in reqs:
        try:
            r = Requirement(line)
        except InvalidRequirement as e:
            raise SpecopsError(f"profile requirement {line!r} is not valid: {e}") from None
        n = norm(r.name)
        if n in skip:
            dropped.append({"package": r.name, "requirement": line, "reason": "skipped (--skip)"})
        elif n in have:
            kept.append({"package": r.name, "requirement": line, "have": have[n],
                         "satisfies": contains(r.specifier, have[n])})
        else:
            roots[n] = r
    pinned = {norm(k["package"]) for k in kept}
    chosen: dict[str, dict] = {}       # name -> {name, version, requires: [Requirement]}
    specs: dict[str, SpecifierSet] = {}
    extras: dict[str, set] = {}
    reach: dict[str, set] = {}         # name -> roots whose closure holds it
    conflicts: dict[str, list] = {}    # root -> reasons
    backtracks: dict[str, int] = {}
    first_clash: dict[tuple, str] = {}
    seen: set = set()
    # (name, requirement, root, parent name or None, parent version, depth)
    pending = deque((n, r, n, None, None, 0) for n, r in roots.items())

    def label(parent, pver):
        return f"{chosen[parent]['name']} {pver}" if parent in chosen else "the profile"

    def fetch_spec(name):
        ex = f"[{','.join(sorted(extras[name]))}]" if extras.get(name) else ""
        return f"{name}{ex}{specs[name]}"

    while pending:
        batch: dict[str, str] = {}
        while pending:
            name, req, root, parent, pver, depth = pending.popleft()
            if parent is not None and (parent not in chosen or chosen[parent]["version"] != pver):
                continue  # from a version of `parent` that was stepped back
            if name in have:
                if contains(req.specifier, have[name]):
                    continue
                exact = parent in roots and any(sp.operator in ("==", "===") for sp in roots[parent].specifier)
                clash = f"{label(parent, pver)} needs {req.name}{req.specifier}, the host has {have[name]}"
                if parent is not None:
                    clash = first_clash.setdefault((parent, name), clash)  # (the newest version's clash tells most)
                if parent is not None and not exact and backtracks.get(parent, 0) < max_backtrack:
                    backtracks[parent] = backtracks.get(parent, 0) + 1
                    specs[parent] = specs[parent] & SpecifierSet(f"!={pver}")
                    batch[parent] = fetch_spec(parent)
                    continue
                if root not in conflicts or depth <= 1:  # (a dropped root's own clashes are all reported)
                    # a clash with a package the profile pins itself is the telling one: first
                    conflicts.setdefault(root, []).insert(0 if name in pinned else len(conflicts.get(root, [])), clash)
                continue
            if root in conflicts or name in skip:
                continue
            if exact and depth > 0:
                if name in roots and not contains(req.specifier, str(roots[name].specifier).lstrip("=")):
                    conflicts.setdefault(root, []).append(
                        f"{label(parent, pver)} needs {req.name}{req.specifier}, the profile pins {roots[name]}")
                continue
            first = (name, root) not in seen
            seen.add((name, root))
            reach.setdefault(name, set()).add(root)
            specs[name] = specs.get(name, SpecifierSet()) & req.specifier
            new_extras = set(req.extras) - extras.get(name, set())
            extras.setdefault(name, set()).update(req.extras)
            cur = chosen.get(name)
            if name in batch or cur is None or new_extras or not contains(specs[name], cur["version"]):
                batch[name] = fetch_spec(name)
            elif first:  # already chosen: its dependencies reach this root too
                for d in cur["requires"]:
                    pending.append((norm(d.name), d, root, name, cur["version"], depth + 1))
        if not batch:
            break
        items, _ = pip.report(list(batch.values()))
        if items is None:  # find out which one(s): one at a time
            items = []
            for name, spec in batch.items():
                one, err1 = pip.report([spec])
                if one is None:
                    chosen.pop(name, None)
                    for r in reach.get(name, ()):
                        conflicts.setdefault(r, []).append(
                            f"no wheel for {spec} (python {pip.python}, {pip.tags[0]}): {err1}")
                else:
                    items += one
        for it in items:
            md = it["metadata"]
            name = norm(md["name"])
            deps = []
            for line in md.get("requires_dist") or []:
                try:
                    d = Requirement(line)
                except InvalidRequirement:
                    continue
                if wanted(d, env, extras.get(name, ())):
                    deps.append(d)
            chosen[name] = {"name": md["name"], "version": md["version"], "requires": deps}
            for root in list(reach.get(name, ())):
                for d in deps:
                    pending.append((norm(d.name), d, root, name, md["version"], 1 if name == root else 2))

    # Pins that only a dropped pin needed go too (e.g. flashinfer-python, pinned for vllm).
    def closure(starts):
        out, todo = set(), list(starts)
        while todo:
            n = todo.pop()
            if n in out or n in have or n not in chosen:
                continue
            out.add(n)
            todo += [norm(d.name) for d in chosen[n]["requires"]]
        return out

    for root in list(roots):
        needed_by = [d for d in conflicts if d != root and d in chosen
                     and any(norm(x.name) == root for x in chosen[d]["requires"])]
        others = [r for r in roots if r != root and r not in conflicts and root in closure([r])]
        if needed_by and not others:
            own = conflicts.get(root)
            conflicts[root] = [f"only needed by {', '.join(roots[d].name for d in needed_by)}, which is dropped"
                               + (f" (besides, {own[0]})" if own else "")]
    for root, why in conflicts.items():
        dropped.append({"package": roots[root].name, "requirement": str(roots[root]), "reason": "; ".join(why[:3])})
    live = [r for r in roots if r not in conflicts]
    install = {}
    for name in sorted(closure(live)):
        c = chosen[name]
        install[name] = {"name": c["name"], "version": c["version"],
                         "for": sorted(roots[r].name for r in live if name in closure([r]))}
    return {"install": install, "kept": kept, "dropped": dropped, "requirements": [str(roots[r]) for r in live]}


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
        block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
        return re.findall(r'"([^"]+)"', block)


def build(profile: str, *, python: str = DEFAULT_PYTHON, platform: str = DEFAULT_PLATFORM,
          dest: Optional[str] = None, have: Optional[dict] = None, have_source: str = "",
          skip: Iterable[str] = (), laptop: bool = False, say=print) -> dict:
    if Requirement is None:
        raise SpecopsError(f"`inv wheelhouse` runs pip download: {sys.executable} has no pip (python -m ensurepip)")
    prof = profiles.load(profile)
    python = check_python(python)
    tags = expand_platform(platform)
    out = Path(dest or f"wheelhouse/{prof.name}-py{python}-{platform}").expanduser()
    if out.exists() and not out.is_dir():
        raise SpecopsError(f"--dest {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "pip-download.log"
    log.write_text(f"# specops wheelhouse {prof.name} python {python} {platform} {time.ctime()}\n")
    reqs = parse_profile(prof.text)
    pip = Pip(python, tags, [i for _, i in reqs], log=log)
    t0 = time.time()
    man = {"profile": prof.name, "profile_sha256": prof.sha256, "python": python, "platform": platform,
           "platforms": tags, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "mode": "full",
           "requirements": [r for r, _ in reqs], "kept": [], "dropped": []}
    skip = [s.strip() for s in skip if s.strip()]
    if have is not None:
        man["mode"], man["have"] = "top-up", have_source
        say(f"resolving what {have_source or 'the host'} lacks for profile {prof.name} (metadata only) ...")
        res = resolve_top_up(reqs, have, pip, marker_env(python, tags), skip, exact=prof.mode == "exact")
        man.update(kept=res["kept"], dropped=res["dropped"], requirements=res["requirements"])
        pins = [f"{v['name']}=={v['version']}" for v in res["install"].values()]
        say(f"downloading {len(pins)} wheel(s) ...")
        pip.download(pins, out, deps=False)
    else:
        keep = [(r, i) for r, i in reqs if norm(Requirement(r).name) not in {norm(s) for s in skip}]
        man["dropped"] = [{"package": Requirement(r).name, "requirement": r, "reason": "skipped (--skip)"}
                          for r, _ in reqs if (r, _) not in keep]
        man["requirements"] = [r for r, _ in keep]
        say(f"downloading profile {prof.name} ({prof.mode}: {'no deps' if prof.mode == 'exact' else 'resolved by pip'}) ...")
        pip.download([r for r, _ in keep], out, deps=prof.mode != "exact")
    if laptop:
        lap = out / "laptop"
        lap.mkdir(exist_ok=True)
        say("downloading specops' laptop-side dependencies (pyproject) into laptop/ ...")
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


def report(man: dict) -> None:
    """What `inv wheelhouse` built: wheels, what the host keeps, what was dropped and why."""
    from rich.markup import escape

    from .ui import console, report_kept

    console.print(f"wheelhouse {man['dest']}: {len(man['wheels'])} wheel(s), {man['bytes'] / 2**20:.1f} MiB "
                  f"({man['mode']}, python {man['python']}, {man['platform']}) in {man['seconds']}s")
    report_kept(man.get("kept", []), "requirement", "on the host")
    for d in man.get("dropped", []):
        console.print("  [yellow]dropped[/] " + escape(f"{d['requirement']}: {d['reason']}"))
    console.print(f"next: inv bootstrap --host HOST --wheelhouse {man['dest']}")
