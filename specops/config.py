"""Training configs (configs/*.yaml): `train:` flags for `speculators train`, `profiles:` per-profile
overrides; and the specops revision recorded with every run."""

from __future__ import annotations

import difflib
import re
import subprocess
from pathlib import Path
from typing import Any, Optional

import yaml

from specops import __version__, paths
from specops.args import BadNumber, Number
from specops.errors import SpecopsError
from specops.specflags import SPECULATORS, TRAIN_FLAGS

#: flags specops sets itself (from the host, the data and the run id)
RESERVED = {"verifier-name-or-path", "data-path", "target-layer-ids", "save-path", "log-dir", "run-name"}

#: the numeric `speculators train` flags of configs/*.yaml (and those specops reads): checked when
#: the config is loaded (the plan, a dry run), not when the trainer starts on the host
NUMBERS = {
    "epochs": Number(int, "how many epochs to train", 3, ge=1),
    "max-steps": Number(int, "how many steps to train at most", 100, ge=1),
    "total-seq-len": Number(int, "the tokens per packed sequence", 8192, ge=1),
    "draft-vocab-size": Number(int, "the draft's vocabulary size", 32000, ge=1),
    "num-layers": Number(int, "the draft's decoder layers", 1, ge=1),
    "num-workers": Number(int, "data loader workers", 4, ge=0),
    "log-freq": Number(int, "steps between log lines", 10, ge=1),
    "max-retries": Number(int, "retries per hidden-state request", 2, ge=0),
    "warmup-steps": Number(int, "warm-up steps", 100, ge=0),
    "seed": Number(int, "a random seed", 0, ge=0),
    "request-timeout": Number(float, "seconds per hidden-state request", 120, gt=0),
    "lr": Number(float, "a learning rate", 1.0e-3, ge=0),
    "weight-decay": Number(float, "a weight decay", 0.01, ge=0),
}
#: a flag's name as speculators' argparse spells it (the config key is --KEY without the dashes)
FLAG_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def check_flags(where: str, flags: Any) -> dict:
    """One `train:` / `profiles.P:` mapping: names shaped as speculators' flags, values a scalar or a
    list of scalars, the numeric ones of NUMBERS in range. Returns it; SpecopsError names the key."""
    if not isinstance(flags, dict):
        raise SpecopsError(f"{where}: must be a mapping of speculators train flags (got {flags!r})")
    for k, v in flags.items():
        if not isinstance(k, str) or not FLAG_NAME.fullmatch(k):
            fix = str(k).lstrip("-").replace("_", "-").lower()
            raise SpecopsError(f"{where}: key {k!r} is not a speculators train flag name: write it as "
                               f"{fix!r} (speculators' --{fix}: keys are its flag names without the leading dashes)")
        scalar = (str, int, float, bool, type(None))
        if not (isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar[:-1]) for x in v))):
            raise SpecopsError(f"{where}: {k}: {v!r}: give a value (a string, a number, true/false) or a list of "
                               f"them")
        if k not in TRAIN_FLAGS:
            near = difflib.get_close_matches(k, TRAIN_FLAGS, n=1)
            hint = f": did you mean {near[0]!r}?" if near else ": `speculators train --help` lists them"
            raise SpecopsError(f"{where}: {k!r} is not a flag of speculators {SPECULATORS}'s train{hint}")
        if k == "draft-vocab-size" and v == "auto":  # (sized to the dataset's distinct tokens: specops/vocab.py)
            continue
        if k in NUMBERS and v is not None:
            try:
                NUMBERS[k].parse(v)
            except BadNumber as e:
                raise SpecopsError(f"{where}: {k}: {v!r}: {e}") from None
    return flags


class UniqueKeys(yaml.SafeLoader):
    """yaml's safe loader, refusing a key given twice in one mapping (safe_load keeps the last,
    silently: a training's `lr` twice, one of them never used)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for k, _ in node.value:
            key = self.construct_object(k, deep=True)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first on line {seen[key]}): keep one", k.start_mark)
                seen[key] = k.start_mark.line + 1
            except TypeError:  # (an unhashable key: the constructor says so)
                pass
        return super().construct_mapping(node, deep=deep)


def load_config(path: Optional[str], profile: str, overrides: dict) -> dict:
    p = Path(path) if path else paths.CONFIGS_DIR / "eagle3.yaml"
    if not p.is_file():
        raise SpecopsError(f"training config {p} not found: pass --config configs/NAME.yaml")
    try:
        text = p.read_bytes().decode()
    except OSError as e:
        raise SpecopsError(f"training config {p}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = p.read_bytes()[:e.start].count(b"\n") + 1
        raise SpecopsError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} on line {line}): save it as UTF-8") \
            from None
    try:
        raw = yaml.load(text, Loader=UniqueKeys) or {}
    except yaml.YAMLError as e:  # (one line: where, and what)
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        kind = "YAML error" if isinstance(e, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise SpecopsError(f"{p}: {kind}{where}: {what}: fix the file") from None
    if not isinstance(raw, dict):
        raise SpecopsError(f"{p}: top level must be a mapping holding 'train:' (flags) and 'profiles:'")
    extra = set(raw) - {"train", "profiles"}
    if extra or not isinstance(raw.get("train", {}), dict):
        raise SpecopsError(f"{p}: top level must hold 'train:' (flags) and 'profiles:' (per-profile overrides)")
    flags = dict(check_flags(f"{p}: train", raw.get("train") or {}))
    profiles = raw.get("profiles") or {}
    if not isinstance(profiles, dict):
        raise SpecopsError(f"{p}: profiles: must be a mapping of profile name -> flags (e.g. cpu: {{...}})")
    for name, over in profiles.items():
        check_flags(f"{p}: profiles.{name}", over or {})
    flags.update(profiles.get(profile) or {})
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "draft-vocab-size" in overrides and overrides["draft-vocab-size"] != "auto":
        try:
            overrides["draft-vocab-size"] = NUMBERS["draft-vocab-size"].parse(overrides["draft-vocab-size"])
        except BadNumber as e:
            raise SpecopsError(f"--draft-vocab-size {overrides['draft-vocab-size']!r}: {e}, or auto (the dataset's "
                               f"distinct tokens)") from None
    flags.update(overrides)
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
