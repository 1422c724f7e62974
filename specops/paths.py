"""Where things live: in this repo (laptop side) and under a host's workdir.

The host side is the package specops_host/ (pushed into the workdir, and installed beside specops
on the laptop, which imports its stdlib-only modules: the contract, the push manifest, the demo's
language). A host script is named by its module under the package, e.g. "check.preflight", and
runs there as `<venv>/bin/python3 -m specops_host.check.preflight ARGS` from the workdir."""

from __future__ import annotations

from pathlib import Path

import specops_host

REPO = Path(__file__).resolve().parent.parent
HOST_PKG_DIR = Path(specops_host.__file__).resolve().parent
PROFILES_DIR = REPO / "bootstrap" / "profiles"
CONFIGS_DIR = REPO / "configs"

# Relative to the host workdir.
HOST_PKG = "specops_host"
LEGACY = "remote"  # (the flat folder of host scripts older specops pushed: push deletes what it put there)
PROFILES = "bootstrap/profiles"
STATE = ".specops"
MANIFEST = f"{STATE}/pushed.json"
LOGS = f"{STATE}/logs"


def host_module(name: str) -> str:
    """"check.preflight" -> "specops_host.check.preflight" (what `python -m` runs)."""
    return f"{HOST_PKG}.{name}"


def host_file(name: str) -> str:
    """"check.preflight" -> "specops_host/check/preflight.py" (relative to the workdir)."""
    return f"{HOST_PKG}/{name.replace('.', '/')}.py"


def host_argv(python: str, name: str) -> list[str]:
    """The argv that runs host script `name` with the venv's interpreter `python`, from the workdir."""
    return [python, "-m", host_module(name)]
