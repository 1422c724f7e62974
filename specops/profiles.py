"""Pinned venv profiles (bootstrap/profiles/<name>.txt).

A profile is a pip requirements file with two kinds of specops annotations:
``#@ mode: exact`` (the file is the whole environment, installed with ``--no-deps``) or
``#@ mode: resolve`` (top-level pins, pip resolves the rest); and a trailing
``# index: URL`` on a requirement whose wheel comes from a package index other than PyPI.

A profile for an existing venv (a preinstalled torch) also says ``#@ family: NAME`` (the host
profile it stands in for), ``#@ torch: 2.11`` (the torch series it is built on), ``#@ keep: PKG --
why`` (a package the venv keeps at its own version against what the profile's packages pin) and
``#@ omit: PKG -- what that disables`` (a declared dependency left out). for_existing() picks,
for a host profile and the torch a venv already has, the profile of that family built on it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from specops.errors import SpecopsError
from specops.paths import PROFILES_DIR

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


    def _notes(self, key: str) -> dict[str, str]:
        return {m.group(1): (m.group(2) or "").strip()
                for m in re.finditer(rf"^#@ {key}: (\S+)(?: -- (.*))?$", self.text, re.M)}

    @property
    def keep(self) -> dict[str, str]:
        """Packages an existing venv keeps at its own version against the profile's pins: why."""
        return {k: v or "" for k, v in self._notes("keep").items()}

    @property
    def omit(self) -> dict[str, str]:
        """Declared dependencies the profile leaves out: what each disables."""
        return {k: v or "" for k, v in self._notes("omit").items()}

    @property
    def family(self) -> str:
        return next(iter(self._notes("family")), self.name)

    @property
    def torch(self) -> str:
        """The torch series (major.minor) the profile is built on: `#@ torch:` or its torch pin."""
        m = re.search(r"^#@ torch: (\S+)", self.text, re.M)
        return m.group(1) if m else series(self.pins.get("torch", ""))

    @property
    def vllm(self) -> str:
        return self.pins.get("vllm", "")


def series(version: str) -> str:
    """'2.11.0+cu130' -> '2.11' (empty for none)."""
    return ".".join(version.split("+")[0].split(".")[:2]) if version else ""


def for_existing(name: str, torch: str) -> tuple[Profile, str]:
    """The profile to install into an existing venv that has torch `torch` (a version, or ''),
    for the host profile `name`: `name` itself when its torch fits (or no torch is there),
    else the profile of family `name` built on that torch series. Returns (profile, one line
    saying which and why, or '' when it is `name` itself)."""
    base = load(name)
    have = series(torch)
    if not have or not base.torch or base.torch == have:
        return base, ""
    for other in available():
        p = load(other)
        if p.name != name and p.family == name and p.torch == have:
            return p, (f"the venv has torch {torch}: profile {p.name} (vLLM {p.vllm or 'none'}, built for torch "
                       f"{have}) instead of {name} (vLLM {base.vllm}, torch {base.torch})")
    return base, (f"the venv has torch {torch}, profile {name} is built on torch {base.torch} and no profile of "
                  f"family {name} is built on {have}: what cannot fit that torch is reported, not installed")


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
