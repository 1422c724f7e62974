"""Where things live: in this repo (laptop side) and under a host's workdir."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REMOTE_DIR = REPO / "remote"
PROFILES_DIR = REPO / "bootstrap" / "profiles"
CONFIGS_DIR = REPO / "configs"

# Relative to the host workdir.
REMOTE = "remote"
PROFILES = "bootstrap/profiles"
STATE = ".specops"
MANIFEST = f"{STATE}/pushed.json"
LOGS = f"{STATE}/logs"


def remote_module(name: str):
    """remote/<name>.py loaded from this repo, once, as `specops_remote_<name>`: the laptop runs
    the same code the host does (the contract, the push manifest, the demo's language). Its own
    imports of other remote/ modules resolve while it loads."""
    key = f"specops_remote_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REMOTE_DIR / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod  # (enum pickling and dataclass lookups need it registered)
        sys.path.insert(0, str(REMOTE_DIR))
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(key, None)
            raise
        finally:
            sys.path.remove(str(REMOTE_DIR))
    return sys.modules[key]
