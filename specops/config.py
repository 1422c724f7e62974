"""Training configs (configs/*.yaml): `train:` flags for `speculators train`, `profiles:` per-profile
overrides; and the specops revision recorded with every run."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

import yaml

from . import __version__, paths
from .errors import SpecopsError

#: flags specops sets itself (from the host, the data and the run id)
RESERVED = {"verifier-name-or-path", "data-path", "target-layer-ids", "save-path", "log-dir", "run-name"}


def load_config(path: Optional[str], profile: str, overrides: dict) -> dict:
    p = Path(path) if path else paths.CONFIGS_DIR / "eagle3.yaml"
    if not p.is_file():
        raise SpecopsError(f"training config {p} not found: pass --config configs/NAME.yaml")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecopsError(f"{p}: YAML error: {e}") from None
    if not isinstance(raw, dict):
        raise SpecopsError(f"{p}: top level must be a mapping holding 'train:' (flags) and 'profiles:'")
    extra = set(raw) - {"train", "profiles"}
    if extra or not isinstance(raw.get("train", {}), dict):
        raise SpecopsError(f"{p}: top level must hold 'train:' (flags) and 'profiles:' (per-profile overrides)")
    flags = dict(raw.get("train") or {})
    flags.update((raw.get("profiles") or {}).get(profile) or {})
    flags.update({k: v for k, v in overrides.items() if v is not None})
    bad = RESERVED & set(flags)
    if bad:
        raise SpecopsError(f"{p}: {sorted(bad)} are set by specops (from the host, the data and the run id)")
    return {"path": str(p), "flags": flags}


def revision() -> str:
    try:
        rev = subprocess.run(["git", "-C", str(paths.REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(paths.REPO), "status", "--porcelain"],
                               capture_output=True, text=True).stdout.strip()
        return f"{rev}{'-dirty' if dirty else ''}" if rev else __version__
    except OSError:
        return __version__
