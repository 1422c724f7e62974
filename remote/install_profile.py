"""Install a pinned profile into this venv (run by the venv's own interpreter).

Launch (what `inv bootstrap` sends, from the host workdir):
    <venv>/bin/python3 remote/install_profile.py --profile bootstrap/profiles/cpu.txt \
        --sha256 HASH --log .specops/logs/install-cpu.log [--wheelhouse DIR] [--force]

If the venv's stamp holds the same profile hash and every pin is installed, nothing is
installed ("unchanged"). Otherwise pip runs (output to --log), pins are verified, and the
stamp <venv>/.specops-stamp.json is written. One payload on stdout.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from _payload import emit

PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s#;]+)")
STAMP = Path(sys.prefix) / ".specops-stamp.json"


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
    out = []
    for req, _ in reqs:
        m = PIN.match(req)
        if not m:
            continue
        name, want = m.groups()
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != want:
            out.append({"package": name, "want": want, "have": have})
    return out


def pip(args, log):
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode


def tail(log, n=25):
    try:
        return Path(log).read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", required=True)
    ap.add_argument("--sha256", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--wheelhouse", default=None)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()

    mode, reqs = parse(Path(a.profile).read_text())
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
        common += ["--no-index", "--find-links", a.wheelhouse]
    rc = 0
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
            rc = pip(common + extra + ["-r", f.name], log)
        finally:
            os.unlink(f.name)
    bad = mismatches(reqs) if rc == 0 else []
    ok = rc == 0 and not bad
    if ok:
        STAMP.write_text(json.dumps({"profile": a.profile, "sha256": a.sha256, "installed": time.time()}))
    emit({
        "ok": ok, "action": "installed" if ok else "failed", "pip_exit": rc, "mismatches": bad,
        "log": log, "tail": tail(log), "seconds": round(time.time() - t0, 1),
    })
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
