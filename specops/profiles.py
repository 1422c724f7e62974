"""Pinned venv profiles (bootstrap/profiles/<name>.txt).

A profile is a pip requirements file with two kinds of specops annotations:
``#@ mode: exact`` (the file is the whole environment, installed with ``--no-deps``) or
``#@ mode: resolve`` (top-level pins, pip resolves the rest); and a trailing
``# index: URL`` on a requirement whose wheel comes from a package index other than PyPI.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import SpecopsError
from .paths import PROFILES_DIR

PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s#;]+)")


@dataclass
class Profile:
    name: str
    path: Path
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def pins(self) -> dict[str, str]:
        out = {}
        for line in self.text.splitlines():
            m = PIN.match(line.strip())
            if m:
                out[m.group(1)] = m.group(2)
        return out

    @property
    def mode(self) -> str:
        m = re.search(r"^#@ mode: (\w+)", self.text, re.M)
        return m.group(1) if m else "resolve"


def available() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.txt"))


def load(name: str) -> Profile:
    path = PROFILES_DIR / f"{name}.txt"
    if not path.is_file():
        raise SpecopsError(f"no profile {name!r} in {PROFILES_DIR}; available: {', '.join(available())}")
    return Profile(name, path, path.read_text())


def kept_lines(kept: list[dict], want_key: str, where: str) -> list[str]:
    """Profile packages an existing venv keeps at its own version (never upgraded), as lines
    (bootstrap's top-up report and the wheelhouse summary)."""
    same = [k for k in kept if k[want_key].endswith(f"=={k['have']}")]
    out = [f"  {len(same)} profile package(s) already {where} at the pinned version"] if same else []
    return out + [f"  kept {k['package']} {k['have']} (profile: {k[want_key]}"
                  + ("" if k.get("satisfies", False) else "; never upgraded") + ")" for k in kept if k not in same]
