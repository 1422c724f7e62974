"""check: the preflight run by the host venv's interpreter (remote/check.py), shown as a table."""

from __future__ import annotations

import json
import re
from typing import Optional

from . import paths
from .config import load_config
from .errors import SpecopsError
from .payloads import Check
from .remote_exec import run_script
from .transport import Transport


def check(t: Transport, *, min_free_gb: float = 5.0) -> Check:
    h = t.host
    profile, absent = f"{paths.PROFILES}/{h.profile}.txt", {}
    if h.venv_existing:  # verify what bootstrap's top-up established, not the profile's pins
        env = f"{paths.STATE}/env-{h.profile}.txt"
        raw = t.read_bytes(f"{t.expand(h.workdir_path)}/{env}")
        if raw is not None:
            profile = env
            absent = dict(re.findall(r"^#@ absent: (\S+) -- (.*)$", raw.decode(errors="replace"), re.M))
    args = ["--venv", t.expand(h.venv_path), "--profile", profile,
            "--kind", h.profile, "--min-free-gb", str(min_free_gb)]
    if h.gpus is not None:
        args += ["--gpus", str(h.gpus)]
    res = run_script(t, "check", args, changes=False, model=Check)
    if absent and res.rows:
        soften(res, absent)
    return res


def soften(res: Check, absent: dict) -> None:
    """Rows about packages the top-up could not bring (e.g. vllm next to a preinstalled torch) are
    information, not failures: the reason is shown instead."""
    for pkg, why in absent.items():
        mod = pkg.replace("-", "_").lower()
        for r in res.rows:
            name = r.name.lower()
            if name.startswith((f"{mod} importable", f"import {mod}.", f"import {mod} ")) or name == f"import {mod}":
                r.hard = False
                if r.ok is False:
                    r.hint = f"{pkg} is not installed in this existing venv ({why})"
    res.ok = all(r.ok is not False for r in res.rows if r.hard)


def failing(res: Check) -> list:
    return [r for r in res.rows if r.hard and r.ok is False]


def verdict(name: str, res: Check) -> None:
    bad = failing(res)
    if bad:
        lines = "\n".join(f"  ✗ {r.name}: {r.value} -> {r.hint}" for r in bad)
        raise SpecopsError(f"check {name}: {len(bad)} hard check(s) failed", detail=lines)


# -- deep check: real training steps on a tiny fixture (remote/deep_check.py) -----------------
#: speculators 0.9.0's defaults for the settings the deep check varies.
DEFAULTS = {"draft-attn-impl": "simple_flex_attention", "loss-implementation": "fused"}
VERDICT = f"{paths.STATE}/deep-check.json"


def settings_of(flags: dict, host) -> dict:
    """The settings a training config runs with on a host: attention, loss, torch.compile
    (speculators compiles its draft whenever CUDA is there, unless TORCHDYNAMO_DISABLE=1)."""
    env = getattr(host, "env", None) or {}
    return {"draft-attn-impl": str(flags.get("draft-attn-impl") or DEFAULTS["draft-attn-impl"]),
            "loss-implementation": str(flags.get("loss-implementation") or DEFAULTS["loss-implementation"]),
            "compile": host.profile == "cuda" and str(env.get("TORCHDYNAMO_DISABLE", "0")) in ("", "0")}


def candidates(configured: dict, profile: str) -> list[dict]:
    """The configured settings first, then fallbacks, cheapest change first."""
    c = configured
    if profile == "cuda":
        more = [{**c, "loss-implementation": "eager"}, {**c, "compile": False},
                {"draft-attn-impl": "sdpa", "loss-implementation": "eager", "compile": True},
                {"draft-attn-impl": "sdpa", "loss-implementation": "eager", "compile": False}]
    else:
        more = [{"draft-attn-impl": "sdpa", "loss-implementation": "eager", "compile": False}]
    out = []
    for x in [c] + more:
        if x not in out:
            out.append(x)
    return out


def describe(s: Optional[dict]) -> str:
    if not s:
        return "none"
    return (f"--draft-attn-impl {s['draft-attn-impl']} --loss-implementation {s['loss-implementation']}, "
            f"compile {'on' if s.get('compile') else 'off'}")


def deep(t: Transport, *, config: Optional[str] = None, try_all: bool = False, steps: int = 2,
         timeout: float = 300.0) -> dict:
    """Real training steps on a tiny fixture in the host venv: the config's settings, then fallbacks.
    The verdict stays on the host (<workdir>/.specops/deep-check.json) for `inv train`."""
    h = t.host
    if steps < 1 or timeout <= 0:
        raise SpecopsError("--deep needs steps >= 1 and a positive timeout")
    cfg = load_config(config, h.profile, {})
    cands = candidates(settings_of(cfg["flags"], h), h.profile)
    args = ["--kind", h.profile, "--settings", json.dumps(cands), "--steps", str(steps), "--timeout", str(timeout)]
    if try_all:
        args.append("--all")
    res = run_script(t, "deep_check", args)
    if res is None:  # --dry-run
        return None
    if "results" not in res:
        raise SpecopsError(f"deep check on {h.name} could not run: {res.get('error')}",
                           detail="\n".join(res.get("tail", [])))
    res["config"] = cfg["path"]
    return res


def preflight(t: Transport, *, min_free_gb: float = 5.0, deep_steps: bool = False, config: Optional[str] = None,
              try_all: bool = False, steps: int = 2, timeout: float = 300.0) -> dict:
    """The check, and with deep_steps the deep check after it: {"check": Check, "deep": dict or None}."""
    res = check(t, min_free_gb=min_free_gb)
    return {"check": res, "deep": deep(t, config=config, try_all=try_all, steps=steps, timeout=timeout)
            if deep_steps else None}


def judge(name: str, res: dict) -> None:
    """Raise (one line, the failing rows below) unless every hard check and the deep check pass."""
    verdict(name, res["check"])
    deep_verdict(name, res.get("deep"))


def deep_verdict(name: str, res: dict) -> None:
    if res is None or res.get("configured_ok"):
        return
    first = res["results"][0]
    if res.get("works"):
        w = res["works"]
        how = "set them under `profiles:` for this host's profile in the config" + (
            "; compile off: `env: {TORCHDYNAMO_DISABLE: '1'}` for the host in hosts.yaml" if not w.get("compile") else "")
        raise SpecopsError(f"check {name} --deep: the configured settings ({describe(first['settings'])}) fail a "
                           f"training step: {first['error']}; these work: {describe(w)}: {how} "
                           f"(`inv train` refuses the failing ones on {name})",
                           detail="\n".join(first.get("tail", [])[-8:]))
    raise SpecopsError(f"check {name} --deep: no setting trained ({len(res['results'])} tried); first error: "
                       f"{first['error']}", detail="\n".join(first.get("tail", [])[-12:]))


def refuse_failed_settings(t: Transport, flags: dict) -> None:
    """The train gate: raise if the settings these training flags run with failed `inv check --deep`
    on this host (its verdict, <workdir>/.specops/deep-check.json; bootstrap removes it when
    packages change). No verdict: nothing to refuse."""
    raw = t.read_bytes(f"{t.expand(t.host.workdir_path)}/{VERDICT}")
    if not raw:
        return
    try:
        v = json.loads(raw)
    except ValueError:
        return
    mine = settings_of(flags, t.host)
    for r in v.get("results", []):
        if r.get("settings") == mine and not r.get("ok"):
            works = v.get("works")
            raise SpecopsError(
                f"train refused on {t.host.name}: its settings ({describe(mine)}) failed `inv check --deep` there "
                f"({v.get('when')}: {r.get('error')}); "
                + (f"these work: {describe(works)}" if works else "no setting worked there")
                + "; nothing was started (re-run `inv check --deep` after changing versions)")
