"""Where things live: in this repo (laptop side) and under a host's workdir."""

from __future__ import annotations

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
