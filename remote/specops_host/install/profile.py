"""Install a pinned profile into this venv (run by the venv's own interpreter).

Launch (what `inv bootstrap` sends, from the host workdir):
    <venv>/bin/python3 -m specops_host.install.profile --profile bootstrap/profiles/cpu.txt \
        --sha256 HASH --log .specops/logs/install-cpu.log [--wheelhouse DIR] [--force]

If the venv's stamp holds the same profile hash and every pin is installed, nothing is
installed ("unchanged"). Otherwise the installer runs (output to --log), pins are verified, and
the stamp <venv>/.specops-stamp.json is written. One payload on stdout. The installer: uv for an
exact profile without a wheelhouse (remote/specops_host/install/uv.py: pip's settings, pip's rule, several
times faster; pip takes over any group uv fails), pip otherwise and with --installer pip. While it
runs, a progress line every --progress-every seconds (remote/specops_host/install/pipprogress.py).

--existing (a host's preinstalled venv, `venv_existing: true`): top up only. Every package
already there is pinned to its installed version (a constraints file), so nothing present is
ever upgraded or downgraded; profile requirements that are present (any version) are kept,
those the wheelhouse manifest dropped are reported, the rest are installed with their missing
dependencies. Writes .specops/env-<profile>.txt (relative to the workdir): the environment
`inv check` verifies on such a host (present versions, and `#@ absent:` lines).
--list-installed: only print the installed distributions {name: version}, the Python version,
and the host's glibc version and machine (its wheel platform).
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from specops_host import contract
from specops_host.install import pins
from specops_host.install import pipprogress
from specops_host.install import uv as uvinstall
from specops_host.contract import emit

PIN = pins.PIN
pip = pipprogress.pip
STAMP = Path(sys.prefix) / ".specops-stamp.json"


def notes(text, key):
    """A profile's `#@ KEY: NAME -- why` lines -> {normalized NAME: why} (keep, omit)."""
    return {norm(m.group(1)): (m.group(2) or "").strip()
            for m in re.finditer(rf"^#@ {key}: (\S+)(?: -- (.*))?$", text, re.M)}


def parse(text):
    """-> (mode, [(requirement, index or None)])"""
    mode = "resolve"
    reqs = []
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^#@ mode: (\w+)", line)
        if m:
            mode = m.group(1)
        if not line or line.startswith("#"):
            continue
        req, _, comment = line.partition("#")
        idx = re.search(r"index:\s*(\S+)", comment)
        reqs.append((req.strip(), idx.group(1) if idx else None))
    return mode, reqs


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def mismatches(reqs):
    return pins.mismatches(req for req, _ in reqs)


def tail(log, n=25):
    try:
        return Path(log).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def installed():
    """{normalized name: version} of every distribution this interpreter sees."""
    out = {}
    for d in metadata.distributions():
        name = d.metadata["Name"]
        if name:
            out.setdefault(norm(name), d.version)
    return out


def wheelhouse_manifest(wheelhouse):
    """The wheelhouse's specops-wheelhouse.json ({} if none); refuses another Python's wheels."""
    p = Path(wheelhouse) / "specops-wheelhouse.json"
    if not Path(wheelhouse).is_dir():
        raise SystemExit(f"wheelhouse {wheelhouse} is not a folder on this host")
    man = json.loads(p.read_text()) if p.is_file() else {}
    want = man.get("python")
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if want and want != have:
        raise SystemExit(f"the wheelhouse holds wheels for Python {want} but {sys.executable} is Python {have}: "
                         f"rebuild it with `inv wheelhouse --python {have}`")
    return man


HAS_REQ = re.compile(r"^(\S+) \S+ has requirement ([A-Za-z0-9_.\-]+)")
REQUIRES = re.compile(r"^(\S+) \S+ requires ([A-Za-z0-9_.\-]+), which is not installed")


def accepted(line, keep, omit):
    """Is this `pip check` line one the profile declares (a kept package's other version, an
    omitted package missing)? -> the reason, or None."""
    m = HAS_REQ.match(line)
    if m and norm(m.group(2)) in keep:
        return f"kept: {keep[norm(m.group(2))]}" if keep[norm(m.group(2))] else "kept at the venv's version"
    m = REQUIRES.match(line)
    if m and norm(m.group(2)) in omit:
        return f"omitted: {omit[norm(m.group(2))]}" if omit[norm(m.group(2))] else "omitted by the profile"
    return None


def top_up(a, mode, reqs, log, keep=None, omit=None):
    """--existing: install what is missing, never touching what is there. keep/omit: the
    profile's `#@ keep:` / `#@ omit:` lines ({name: why}): the pip check lines they explain are
    accepted and reported as overrides, no other."""
    keep, omit = keep or {}, omit or {}
    man = wheelhouse_manifest(a.wheelhouse) if a.wheelhouse else {}
    before = installed()
    dropped = {norm(PIN.match(d["requirement"]).group(1) if PIN.match(d["requirement"]) else d["package"]): d
               for d in man.get("dropped", [])}
    kept, absent, todo = [], [], []
    for req, _ in reqs:
        m = re.match(r"^([A-Za-z0-9_.\-]+)", req)
        name = norm(m.group(1))
        if name in before:
            kept.append({"package": m.group(1), "want": req, "have": before[name]})
        elif name in dropped:
            absent.append({"package": m.group(1), "reason": dropped[name]["reason"]})
        else:
            todo.append(req)
    rc = 0
    if todo and man.get("mode") == "top-up":
        # `inv wheelhouse --have/--host` resolved exactly what is missing: install those wheels,
        # no dependencies (pip would otherwise re-judge what is present, inconsistencies included)
        files = [str(Path(a.wheelhouse) / w) for w in sorted(man.get("wheels", {}))
                 if norm(w.split("-")[0]) not in before]
        rc = pip(["--no-index", "--no-deps", *files], log, pipprogress.Progress(len(files))) if files else 0
    elif todo:  # let pip resolve, every present package pinned to its version
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("".join(f"{n}=={v}\n" for n, v in sorted(before.items())))
        args = ["--no-index", "--find-links", a.wheelhouse] if a.wheelhouse else []
        if mode == "exact":  # the profile is the whole set: nothing resolved on the host
            args.append("--no-deps")
        try:
            rc = pip(args + ["-c", f.name, *todo], log, pipprogress.Progress(len(todo) if mode == "exact" else None))
        finally:
            os.unlink(f.name)
    after = installed()
    added = {n: v for n, v in after.items() if n not in before}
    changed = {n: [before[n], after.get(n)] for n in before if after.get(n) != before[n]}
    missing = [r for r in todo if norm(re.match(r"^([A-Za-z0-9_.\-]+)", r).group(1)) not in after]
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    problems = [l for l in check.stdout.splitlines() if l.strip()] if check.returncode else []
    overrides = [{"line": l, "why": accepted(l, keep, omit)} for l in problems if accepted(l, keep, omit)]
    problems = [l for l in problems if not accepted(l, keep, omit)]
    broken = [l for l in problems if norm(l.split()[0]) in added]  # what the top-up brought must be whole
    if mode == "exact":  # an exact profile is the whole environment: what it leaves out stays out
        names = {norm(re.match(r"^([A-Za-z0-9_.\-]+)", r).group(1)) for r, _ in reqs}
        broken = [l for l in broken if not (re.search(r" requires (\S+), which is not installed", l)
                                            and norm(re.search(r" requires (\S+),", l).group(1)) not in names)]
    ok = rc == 0 and not changed and not missing and not broken
    if ok:
        env = Path(a.env_file or Path(".specops") / f"env-{Path(a.profile).stem}.txt")
        env.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"# specops: the environment of {sys.prefix} for profile {Path(a.profile).stem} "
                 f"(an existing venv, topped up {time.strftime('%Y-%m-%d %H:%M:%S')})", "#@ mode: existing"]
        for req, _ in reqs:
            n = norm(re.match(r"^([A-Za-z0-9_.\-]+)", req).group(1))
            if n in after:
                lines.append(f"{n}=={after[n]}")
        lines += [f"#@ absent: {d['package']} -- {d['reason']}" for d in absent]
        env.write_text("\n".join(lines) + "\n")
        STAMP.write_text(json.dumps({"profile": a.profile, "sha256": a.sha256, "mode": "existing",
                                     "installed": time.time(), "added": added}))
        if added:  # versions changed under a previous deep check's verdict
            Path(".specops/deep-check.json").unlink(missing_ok=True)
    return {"ok": ok, "action": ("installed" if added else "unchanged") if ok else "failed", "mode": "existing",
            "pip_exit": rc, "added": added, "kept": kept, "absent": absent, "changed": changed,
            "missing": missing, "broken": broken, "pip_check": [l for l in problems if l not in broken][:20],
            "overrides": overrides,
            "mismatches": [], "log": log, "tail": tail(log)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile")
    ap.add_argument("--sha256")
    ap.add_argument("--log")
    ap.add_argument("--wheelhouse", default=None)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--existing", action="store_true", help="top up an existing venv; never change what is there")
    ap.add_argument("--list-installed", action="store_true")
    ap.add_argument("--env-file", default=None,
                    help="--existing: where the environment inv check verifies goes "
                         "(default .specops/env-<profile>.txt)")
    ap.add_argument("--installer", choices=["auto", "uv", "pip"], default="auto",
                    help="auto (default): uv where it fits (an exact profile, no wheelhouse), else pip")
    contract.progress_option(ap)
    a = ap.parse_args()
    contract.use_progress_every(a.progress_every)
    if a.list_installed:
        # glibc and machine: the host's wheel platform (`inv wheelhouse --host`: manylinux_2_<minor>_<machine>)
        emit({"ok": True, "python": f"{sys.version_info[0]}.{sys.version_info[1]}", "installed": installed(),
              "glibc": platform.libc_ver()[1], "machine": platform.machine()})
        return 0
    if not (a.profile and a.sha256 and a.log):
        ap.error("--profile, --sha256 and --log are required")

    mode, reqs = parse(Path(a.profile).read_text())
    if a.existing:
        t0 = time.time()
        log = os.path.abspath(a.log)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        Path(log).write_text(f"# specops top-up of {a.profile} ({a.sha256}) into the existing {sys.prefix}\n")
        try:
            text = Path(a.profile).read_text()
            res = top_up(a, mode, reqs, log, keep=notes(text, "keep"), omit=notes(text, "omit"))
        except SystemExit as e:
            emit({"ok": False, "action": "failed", "error": str(e), "mismatches": [], "tail": []})
            return 1
        res["seconds"] = round(time.time() - t0, 1)
        emit(res)
        return 0 if res["ok"] else 1
    stamp = {}
    if STAMP.is_file():
        try:
            stamp = json.loads(STAMP.read_text())
        except ValueError:
            stamp = {}
    if not a.force and stamp.get("sha256") == a.sha256:
        bad = mismatches(reqs)
        if not bad:
            emit({"ok": True, "action": "unchanged", "stamp": str(STAMP)})
            return 0

    t0 = time.time()
    log = os.path.abspath(a.log)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    Path(log).write_text(f"# specops install of {a.profile} ({a.sha256}) into {sys.prefix}\n")
    common = ["--no-deps"] if mode == "exact" else []
    if a.wheelhouse:
        try:
            wheelhouse_manifest(a.wheelhouse)
        except SystemExit as e:
            emit({"ok": False, "action": "failed", "error": str(e), "mismatches": [], "tail": []})
            return 1
        common += ["--no-index", "--find-links", a.wheelhouse]
    rc, by_uv = 0, False
    progress = pipprogress.Progress(len(reqs) if mode == "exact" else None)
    contract.progress(f"install: profile {Path(a.profile).stem} ({len(reqs)} requirement(s)"
                      f"{', no dependencies' if mode == 'exact' else ''}); its log: {log}")
    # uv where it fits: an exact profile (no resolution: the same wheels as pip), no wheelhouse
    uv = (uvinstall.ensure(os.getcwd(), log) if a.installer != "pip" and mode == "exact" and not a.wheelhouse
          else None)
    contract.progress(f"install: {f'uv {uvinstall.UV_VERSION}' if uv else 'pip'} installs it" + (
        " (uv does not fit here: a wheelhouse, a profile pip resolves, or no uv to be had, see the log)"
        if a.installer == "uv" and uv is None else ""))
    # Requirements whose wheels come from another index go first, each group with its index.
    groups = {}
    for req, idx in reqs:
        groups.setdefault(None if a.wheelhouse else idx, []).append(req)
    for idx, group in sorted(groups.items(), key=lambda kv: kv[0] is None):
        if rc:
            break
        extra = ["--extra-index-url", idx, "--retries", "1", "--timeout", "20"] if idx else []
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("\n".join(group) + "\n")
        try:
            rc = None
            # uv: a group's own index last (unlike pip, uv gives up on an index it cannot reach: the
            # exact pins from pip's own sources first, e.g. its find-links), then pip as ever
            for with_index in ([False, True] if idx else [None]) if uv and all(PIN.match(r) for r in group) else []:
                progress.expect(PIN.match(r).groups() for r in group)
                rc = uvinstall.install(uv, f.name, log, no_deps=True, extra_index=idx if with_index else None,
                                       progress=progress)
                if not rc:
                    by_uv = True
                    break
            if rc:  # (an index uv cannot reach, ...: pip installs this group as ever)
                contract.progress(f"install: uv exited {rc} (its output is in the log): pip installs "
                                  f"these {len(group)} package(s)")
            if rc is None or rc:
                rc = pip(common + extra + ["-r", f.name], log, progress)
        finally:
            os.unlink(f.name)
    if rc == 0 and by_uv:  # (pip byte-compiles what it installs; uv leaves it to every later import)
        contract.progress("install: byte-compiling the installed packages (as pip does; uv does not)")
        contract.progress(f"install: byte-compiled in {uvinstall.compile_bytecode(log)} s")
    bad = mismatches(reqs) if rc == 0 else []
    ok = rc == 0 and not bad
    if ok:
        STAMP.write_text(json.dumps({"profile": a.profile, "sha256": a.sha256, "installed": time.time()}))
        Path(".specops/deep-check.json").unlink(missing_ok=True)  # its verdict was for other versions
    emit({
        "ok": ok, "action": "installed" if ok else "failed", "pip_exit": rc, "mismatches": bad,
        "log": log, "tail": tail(log), "seconds": round(time.time() - t0, 1),
    })
    return 0 if ok else 1


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
