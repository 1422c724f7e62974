"""pip's resolver for another interpreter and platform: what a profile needs on a host, from
package metadata alone (no wheel downloaded), never replacing what the host has.

Pip (`pip install --dry-run --report` / `pip download` through a shim that makes pip judge
markers and Requires-Python for the host), Graph (who needs whom in pip's reports),
resolve_top_up (an existing environment's top-up: kept, dropped with pip's reason, overrides
the profile declares). Used by specops.ops.wheelhouse.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Optional

from specops.errors import SpecopsError

try:  # pip always carries packaging; a laptop venv may not have it installed on its own
    from packaging.markers import Marker
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover
    try:
        # (the same library, vendored by pip: the type checker reads the one above)
        from pip._vendor.packaging.markers import Marker  # type: ignore[assignment]
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore[assignment]
        from pip._vendor.packaging.specifiers import SpecifierSet  # type: ignore[assignment]
        from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[assignment]
        from pip._vendor.packaging.version import InvalidVersion, Version  # type: ignore[assignment]
    except ImportError:  # no pip either: only load_manifest (bootstrap's check) works here
        Marker = Requirement = SpecifierSet = Version = None  # type: ignore[assignment,misc]
        InvalidRequirement = InvalidVersion = ValueError  # type: ignore[assignment,misc]

        def canonicalize_name(name: str) -> str:  # type: ignore[misc]
            return re.sub(r"[-_.]+", "-", name).lower()

def norm(name: str) -> str:
    return canonicalize_name(name)



def marker_env(python: str, platform_tags: list[str]) -> dict:
    tag = platform_tags[0]
    machine = next((a for a in ("x86_64", "aarch64", "i686", "ppc64le", "s390x", "arm64") if tag.endswith(a)), "")
    system = ("Linux" if "linux" in tag else "Darwin" if tag.startswith("macosx") else
              "Windows" if tag.startswith("win") else "")
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


# pip is run through this shim so that it judges the *host's* interpreter, not this one: pip
# evaluates environment markers (`; sys_platform == "linux"`, `; python_version < "3.13"`)
# against the running interpreter, and `pip install` checks Requires-Python against it too
# (only `pip download` passes --python-version on to its resolver). Both are pip internals: if
# a future pip lacks them the shim leaves pip as it is and says so in the log.
PIP_SHIM = r"""
import json, sys
env = json.loads(sys.argv[1])
try:
    from pip._vendor.packaging import markers
    markers.default_environment = lambda: dict(env)
except Exception as e:  # noqa: BLE001
    print("specops: cannot set pip's marker environment (%s): markers follow this interpreter" % e, file=sys.stderr)
try:
    from pip._internal.cli.req_command import RequirementCommand
    _make = RequirementCommand.make_resolver.__func__

    def make_resolver(cls, preparer, finder, options, *a, **kw):
        if kw.get("py_version_info") is None and getattr(options, "python_version", None):
            kw["py_version_info"] = options.python_version
        return _make(cls, preparer, finder, options, *a, **kw)

    RequirementCommand.make_resolver = classmethod(make_resolver)
except Exception as e:  # noqa: BLE001
    print("specops: cannot set pip's target Python (%s): Requires-Python follows this interpreter" % e, file=sys.stderr)
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


class Pip:
    """`pip download` / `pip install --dry-run --report` for the target interpreter and platform."""

    def __init__(self, python: str, platform_tags: list[str], indexes: Iterable[str] = (), log: Optional[Path] = None,
                 source: Iterable[str] = (), env: Optional[dict] = None):
        """source: pip options naming where wheels come from instead of the configured index
        (e.g. ["--no-index", "--find-links", DIR], a local mirror). env: the marker environment
        (default: marker_env for python and the first platform tag)."""
        self.python, self.tags, self.log = python, platform_tags, log
        self._lock = threading.Lock()
        self.env = env or marker_env(python, platform_tags)
        self.target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
        for t in platform_tags:
            self.target += ["--platform", t]
        self.index = list(source)
        for idx in sorted(set(i for i in indexes if i)):
            self.index += ["--extra-index-url", idx]

    def _run(self, args: list[str]) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-c", PIP_SHIM, json.dumps(self.env), *args, "--disable-pip-version-check"]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if self.log is not None:
            with self._lock, open(self.log, "a") as f:  # (pip runs in parallel for separate roots)
                f.write(f"\n$ pip {' '.join(args)}\n{p.stdout}{p.stderr}"
                        f"# pip exited {p.returncode} in {time.time() - t0:.1f}s\n")
        return p

    @staticmethod
    def error_line(p: subprocess.CompletedProcess) -> str:
        lines = [l.strip() for l in (p.stderr + p.stdout).splitlines() if l.strip()]
        errs = [l for l in lines if l.startswith("ERROR:") and "ResolutionImpossible" not in l]
        return (errs[-1] if errs else lines[-1] if lines else f"pip exited {p.returncode}")[:400]

    def report(self, reqs: list[str], *, constraints: Optional[str] = None,
               deps: bool = True) -> tuple[Optional[list[dict]], str, str]:
        """pip's resolution of reqs for the target (`pip install --dry-run --ignore-installed
        --report`: metadata only, no wheel downloaded) -> (the report's "install" items, "", "")
        or (None, pip's error line, pip's output)."""
        with tempfile.TemporaryDirectory() as d:
            rep = Path(d) / "report.json"
            p = self._run(["install", "--dry-run", "--ignore-installed", "--report", str(rep),
                           "--progress-bar", "off", "--target", str(Path(d) / "t"),
                           *([] if deps else ["--no-deps"]), *(["-c", constraints] if constraints else []),
                           *self.target, *self.index, *reqs])
            if p.returncode != 0 or not rep.is_file():
                return None, self.error_line(p), p.stdout + p.stderr
            return json.loads(rep.read_text()).get("install", []), "", ""

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


def pip_reason(error: str, output: str, have: dict[str, Optional[str]], most: int = 4) -> str:
    """pip's failure as one line: the causes of a dependency conflict (a constraint from the
    host's freeze read as "the host has NAME VERSION"), else pip's error line."""
    causes, inside = [], False
    for raw in output.splitlines():
        line = raw.strip()
        if line == "The conflict is caused by:":
            inside = True
            continue
        if inside:
            if not line or not raw.startswith(" "):
                inside = False
                continue
            m = re.match(r"^The user requested \(constraint\) ([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", line)
            if m and norm(m.group(1)) in have:
                line = f"the host has {m.group(1)} {m.group(2)}"
            elif line.startswith("The user requested "):
                line = "the profile asks for " + line[len("The user requested "):]
            if line not in causes:
                causes.append(line)
    if not causes:
        return re.sub(r"^ERROR:\s*", "", error)
    more = f" (+{len(causes) - most} more)" if len(causes) > most else ""
    return "; ".join(causes[:most]) + more


class Graph:
    """Dependencies among the packages of pip reports (each version's own metadata), read for
    the target's markers: who needs whom, with which extras."""

    def __init__(self, env: dict):
        self.env = env
        self.meta: dict[str, Any] = {}

    def add(self, items: Iterable[dict]) -> "Graph":
        for it in items:
            md = it["metadata"]
            self.meta[norm(md["name"])] = md
        return self

    def version(self, name: str) -> str:
        return self.meta[name]["version"]

    def deps(self, name: str, extras: Iterable[str] = ()) -> list[Requirement]:
        out = []
        for line in self.meta.get(name, {}).get("requires_dist") or []:
            try:
                d = Requirement(line)
            except InvalidRequirement:
                continue
            if wanted(d, self.env, extras):
                out.append(d)
        return out

    def closure(self, starts: Iterable[Requirement], stop: Iterable[str] = ()) -> set[str]:
        """Every package reached from starts through the reported metadata (not through stop)."""
        stop = set(stop)
        seen: dict[str, set] = {}
        todo = [(norm(r.name), set(r.extras)) for r in starts]
        while todo:
            name, ex = todo.pop()
            if name in stop or name not in self.meta:
                continue
            if name in seen and ex <= seen[name]:
                continue
            seen[name] = seen.get(name, set()) | ex
            todo += [(norm(d.name), set(d.extras)) for d in self.deps(name, seen[name])]
        return set(seen)


def constraints_text(have: dict[str, Optional[str]]) -> str:
    """The host's freeze as pip constraints: each present package at its version (a local
    version such as 2.11.0+cu130 as its public part, which the index has)."""
    out = []
    for name, v in sorted(have.items()):
        if v is None:
            continue
        try:
            pub = Version(v).public
        except InvalidVersion:
            continue
        out.append(f"{name}=={pub}")
    return "\n".join(out) + "\n"


def resolve_top_up(reqs: list[tuple[str, Optional[str]]], have: dict[str, Optional[str]], pip: Pip,
                   skip: Iterable[str] = (), *, exact: bool = False, keep: Iterable[str] = (), note=None) -> dict:
    """What an existing environment lacks for the profile, never replacing what it has.

    pip resolves (``pip install --dry-run --ignore-installed --report``, metadata only) the
    profile requirements that the host lacks, with every package the host has pinned to its
    version (``-c``): first all of them together; if that fails, each on its own, and a root
    that cannot resolve against the host's pins is dropped with pip's reason, the others are
    resolved together again (one that still clashes with those before it in the profile is
    dropped too). From pip's answer only the packages the host lacks are taken: nothing present
    is ever replaced. Profile pins that only a dropped pin needed (e.g. flashinfer-python,
    pinned for vllm) are dropped as well. ``exact`` (an exact profile: the whole environment):
    only the profile's own packages are brought (``--no-deps``); one whose dependencies clash
    with the host or with the profile's pins is dropped, unless the clash is with a package the
    profile keeps at the host's version (``keep``, its ``#@ keep:`` lines): that is an override.
    Returns {"install": {name: {name, version, for}}, "kept": [...], "dropped": [...],
    "requirements": [...], "overrides": [...]}.
    """
    note = note or (lambda _msg: None)
    skip = {norm(s) for s in skip}
    roots: dict[str, Requirement] = {}
    lines: dict[str, str] = {}
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
            roots[n], lines[n] = r, line
    graph = Graph(pip.env)
    why: dict[str, str] = {}      # dropped root -> reason
    raw: dict[str, str] = {}      # dropped root -> pip's own error line
    with tempfile.TemporaryDirectory() as d:
        cons = Path(d) / "host-constraints.txt"
        cons.write_text(constraints_text(have))
        c = str(cons)
        overrides: list[dict] = []
        if exact:
            _exact(roots, lines, have, pip, graph, why, raw, note, {norm(k) for k in keep}, overrides)
        elif roots:
            note(f"pip resolves {len(roots)} profile requirement(s) against the host's {len(have)} package(s) ...")
            items, err, out = pip.report([lines[n] for n in roots], constraints=c)
            if items is None and len(roots) > 1:
                ok = []
                note(f"not all together: each on its own ({', '.join(lines.values())}) ...")
                with ThreadPoolExecutor(max_workers=min(4, len(roots))) as ex:  # pip mostly waits on the index
                    alone = dict(zip(roots, ex.map(lambda n: pip.report([lines[n]], constraints=c), roots)))
                for n, (one, err1, out1) in alone.items():  # which root(s) cannot resolve against the host's pins
                    if one is None:
                        why[n], raw[n] = pip_reason(err1, out1, have), err1
                        note(f"  {lines[n]}: {why[n]}")
                    else:
                        ok.append((n, one))
                if len(ok) == 1:
                    items = ok[0][1]
                elif ok:
                    items, err, out = pip.report([lines[n] for n, _ in ok], constraints=c)
                    if items is None:  # each resolves alone, not all together: first come, first kept
                        together: list[str] = []
                        for n, _one in ok:
                            both, err2, out2 = pip.report([lines[m] for m in together] + [lines[n]], constraints=c)
                            if both is None:
                                why[n] = (f"cannot be installed together with {', '.join(together)}: "
                                          f"{pip_reason(err2, out2, have)}")
                                raw[n] = err2
                            else:
                                together.append(n)
                                items = both
                else:
                    items = []
            elif items is None:
                n = next(iter(roots))
                why[n], raw[n], items = pip_reason(err, out, have), err, []
            graph.add(items or [])
    live = [n for n in roots if n not in why]
    # Pins that only a dropped pin needed go too (e.g. flashinfer-python, pinned for vllm), and so on down.
    gone = [n for n in roots if n in why]
    while gone:
        n = gone.pop(0)
        g = graph
        if n not in graph.meta:  # the dropped pin's own requirements
            own, _, _ = pip.report([lines[n]], deps=False)
            g = Graph(pip.env).add(own or [])
        if n in g.meta:
            for dep in g.deps(n, roots[n].extras):
                m = norm(dep.name)
                if m in live and not any(m in graph.closure([roots[o]], skip) for o in live if o != m):
                    live.remove(m)
                    why[m] = f"only needed by {roots[n].name}, which is dropped"
                    gone.append(m)
    for n in roots:
        if n in why:
            dropped.append({"package": roots[n].name, "requirement": lines[n], "reason": why[n],
                            **({"pip": raw[n]} if raw.get(n) else {})})
    reach = {n: graph.closure([roots[n]], skip | set(why)) for n in live}
    install = {}
    for name in sorted(set().union(*reach.values()) if reach else ()):
        if name in have or name in skip:
            continue
        install[name] = {"name": graph.meta[name]["name"], "version": graph.version(name),
                         "for": sorted(roots[n].name for n in live if name in reach[n])}
    return {"install": install, "kept": kept, "dropped": dropped, "requirements": [lines[n] for n in live],
            "overrides": overrides}


def _exact(roots, lines, have, pip, graph, why, raw, note, keep=frozenset(), overrides=None) -> None:
    """An exact profile's top-up: each missing profile package's own wheel (no dependencies);
    one that needs another version of a present package, or of another profile pin, is dropped
    (a package in keep: the host's version stays, recorded in overrides)."""
    if not roots:
        return
    note(f"pip picks the wheels of {len(roots)} profile package(s) the host lacks ...")
    items, err, out = pip.report([lines[n] for n in roots], deps=False)
    if items is None:
        items = []
        for n in roots:
            one, err1, out1 = pip.report([lines[n]], deps=False)
            if one is None:
                why[n], raw[n] = pip_reason(err1, out1, have), err1
            else:
                items += one
    graph.add(items)
    for n, r in roots.items():
        if n in why or n not in graph.meta:
            continue
        md = graph.meta[n]
        for dep in graph.deps(n, r.extras):
            m = norm(dep.name)
            if m in have and not contains(dep.specifier, have[m]):
                if m in keep:
                    if overrides is not None:
                        overrides.append({"package": md["name"], "needs": f"{dep.name}{dep.specifier}",
                                          "kept": f"{dep.name}=={have[m]}"})
                    continue
                why.setdefault(n, f"{md['name']} {md['version']} needs {dep.name}{dep.specifier}, "
                                  f"the host has {have[m]}")
            elif m in roots and not contains(dep.specifier, str(roots[m].specifier).lstrip("=")):
                why.setdefault(n, f"{md['name']} {md['version']} needs {dep.name}{dep.specifier}, "
                                  f"the profile pins {roots[m]}")
    more = True
    while more:  # a profile package that needs a dropped one goes too (the profile is the whole environment)
        more = False
        for n, r in roots.items():
            if n in why or n not in graph.meta:
                continue
            gone = [roots[norm(d.name)].name for d in graph.deps(n, r.extras) if norm(d.name) in why]
            if gone:
                why[n], more = f"needs {gone[0]}, which is dropped", True
