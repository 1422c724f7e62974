"""check: the preflight run by the host venv's interpreter (remote/specops_host/check/preflight.py), shown as a
table."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Optional

from specops import paths, vocab
from specops.config import load_config
from specops.errors import SpecopsError
from specops.payloads import Check, CheckRow, DeepCheck, ServeCheck
from specops.slurm import cluster, script
from specops.host.remote_exec import run_script
from specops.host.transport import Transport
from specops_host.check import serve as serve_check
from specops_host.serve import drafts


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
    if h.is_slurm:
        return slurm_check(t, args)
    res = run_script(t, "check.preflight", args, changes=False, model=Check)
    if absent and res.rows:
        soften(res, absent)
    return res


def slurm_check(t: Transport, args: list) -> Check:
    """A slurm host: the partition's state (sinfo), the preflight on a compute node (srun), and
    the proof that the compute nodes share the workdir (the verdict a submission needs)."""
    assert t.host.slurm is not None  # (a slurm host: inventory gives it its slurm: section)
    req = script.Request.of(t.host.slurm)
    try:
        part = cluster.judge_request(t, req, "check")
        row = CheckRow(name="slurm partition", value=part.describe(), ok=True)
    except SpecopsError as e:
        return Check(ok=False, rows=[CheckRow(name="slurm partition", value=str(e), ok=False,
                                              hint="fix slurm: in hosts.yaml")])
    shared = cluster.probe_shared(t, dataclasses.replace(req, time="5"))
    rows = [row, CheckRow(name="shared workdir", value=f"{shared['workdir']}: " + (
        f"seen by the {shared['nodes']} node(s) of an allocation" if shared["shared"] else shared["error"]),
        ok=bool(shared["shared"]), hint="put workdir and venv on the cluster's shared filesystem")]
    if not shared["shared"]:  # (the preflight's scripts are not there either)
        return Check(ok=False, rows=rows)
    res = run_script(t, "check.preflight", args, changes=False, model=Check, via=script.srun_prefix(dataclasses.replace(
        req, nodes=1, time="10")))
    res.rows[:0] = rows
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


# -- deep check: real training steps on a tiny fixture (remote/specops_host/check/deep.py) -----------------
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


def deep_check(t: Transport, *, config: Optional[str] = None, all_: bool = False, steps: int = 2,
               timeout: float = 300.0) -> DeepCheck:
    """Real training steps on a tiny fixture in the host venv: the config's settings, then fallbacks.
    The verdict stays on the host (<workdir>/.specops/deep-check.json) for `inv train`."""
    h = t.host
    if steps < 1 or timeout <= 0:
        raise SpecopsError("--deep needs steps >= 1 and a positive timeout")
    cfg = load_config(config, h.profile, {})
    cands = candidates(settings_of(cfg["flags"], h), h.profile)
    args = ["--kind", h.profile, "--settings", json.dumps(cands), "--steps", str(steps), "--timeout", str(timeout)]
    if all_:
        args.append("--all")
    res = run_script(t, "check.deep", args, model=DeepCheck, what="the deep check's verdict")
    if res.results is None:
        raise SpecopsError(f"deep check on {h.name} could not run: {res.error}", detail="\n".join(res.tail))
    res.config = cfg["path"]
    return res


def preflight(t: Transport, *, min_free_gb: float = 5.0, deep: bool = False, config: Optional[str] = None,
              all_: bool = False, steps: int = 2, timeout: float = 300.0, serve: bool = False,
              verifier: Optional[str] = None, layers: Optional[str] = None, dataset: Optional[str] = None,
              vllm_arg: Optional[list] = None) -> dict:
    """The check, with deep the deep check after it (deep_check()), with serve the draft-serves
    preflight (vLLM serves the verifier with an untrained draft of the config; cached on the host
    per verifier, draft config and vLLM version): {"check": Check, "deep": dict or None,
    "serve": dict or None}."""
    spec = serve_spec(t, config=config, verifier=verifier, layers=layers, dataset=dataset) if serve else None
    res = check(t, min_free_gb=min_free_gb)
    return Preflight({"check": res, "deep": deep_check(t, config=config, all_=all_, steps=steps, timeout=timeout)
            if deep else None, "serve": draft_serves(t, spec, vllm_arg=vllm_arg) if spec and res.ok else None})


class Preflight(dict):
    """preflight(): {"check": Check, "deep": DeepCheck or None, "serve": ServeCheck or None}."""


def judge(name: str, res: dict) -> None:
    """Raise (one line, the failing rows below) unless every hard check and the deep check pass."""
    verdict(name, res["check"])
    deep_verdict(name, res.get("deep"))
    serve_verdict(name, res.get("serve"))


def deep_verdict(name: str, res: Optional[dict]) -> None:
    if res is None or res.get("configured_ok"):
        return
    first = res["results"][0]
    if res.get("works"):
        w = res["works"]
        compile_off = "; compile off: `env: {TORCHDYNAMO_DISABLE: '1'}` for the host in hosts.yaml"
        how = "set them under `profiles:` for this host's profile in the config" + (
            compile_off if not w.get("compile") else "")
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


# -- the draft-serves preflight: vLLM serves the verifier with an untrained draft (check/serve.py) --
SERVE_SKIP = "--no-serve-check skips it"
#: the preflight's reply under --dry-run (said, not served: the gate lets the job's plan go on)
NOT_SERVED = ServeCheck(ok=True, skipped="a dry run serves nothing")


def serve_spec(t: Transport, *, config: Optional[str] = None, verifier: Optional[str] = None,
               layers: Optional[str] = None, dataset: Optional[str] = None) -> dict:
    """What `inv check --serve` checks: the config's flags for this host, the verifier (default the
    host's), the layer ids (--layers minus the last, as training takes them; default: the
    dataset's extraction record with --dataset, else speculators' default for the verifier)."""
    from specops.ops.data import data_dir

    h = t.host
    ver = verifier or h.verifier
    if not ver:
        raise SpecopsError(f"check --serve on {h.name}: no verifier: pass --verifier DIR (a model directory on the "
                           f"host) or set `verifier:` for the host in hosts.yaml")
    cfg = load_config(config, h.profile, {})
    ids = None
    if layers:
        try:
            ids = [int(x) for x in str(layers).split(",") if x.strip()]
        except ValueError:
            raise SpecopsError(f"--layers {layers!r}: comma-separated layer numbers, e.g. 2,30,58,61") from None
        if len(ids) < 2:
            raise SpecopsError(f"--layers {layers!r}: the aux layers and the last one, e.g. 2,30,58,61")
        ids = ids[:-1]
    spec = {"verifier": t.expand(ver), "kind": h.profile, "flags": cfg["flags"], "target_layer_ids": ids,
            "trust_remote_code": h.trust_flag, "config_file": cfg["path"]}
    if dataset:
        spec["data"] = data_dir(t, dataset)
        if ids is None:  # (the extraction's layer ids: the aux ones and the last)
            try:
                rec = json.loads(t.read_bytes(f"{spec['data']}/specops-data.json") or b"{}")
            except ValueError:
                rec = {}
            spec["target_layer_ids"] = (rec.get("layer_ids") or [])[:-1] or None
    if cfg["flags"].get("draft-vocab-size") == vocab.AUTO:  # (sized as `inv train` sizes it: the data's tokens)
        try:
            vc = json.loads(t.read_bytes(f"{spec['verifier']}/config.json") or b"{}")
        except ValueError:
            vc = {}
        size = (vc.get("text_config") or {}).get("vocab_size") or vc.get("vocab_size")
        raw = t.read_bytes(f"{spec['data']}/token_freq.pt", limit=64 << 20) if dataset else None
        cfg["flags"]["draft-vocab-size"], line = vocab.choose(vocab.AUTO, vocab.distinct_tokens(raw),
                                                               size if isinstance(size, int) else None, cfg["path"])
        t.note(line)
    return spec


def draft_serves(t: Transport, spec: dict, *, vllm_arg: Optional[list] = None, timeout: Optional[float] = None,
                 fresh: bool = False, said: Optional[str] = None, standin=None) -> ServeCheck:
    """Serve the verifier with an untrained draft of spec's configuration (remote/specops_host/check/serve.py):
    its payload ({ok, check_seconds, cached, drafts, ...} or {ok: false, error, root_cause, stage,
    log}; {ok, skipped} where it cannot run there). Under --dry-run: said (`said`), and `standin`
    is the reply (run_script's)."""
    keep = ("verifier", "kind", "flags", "target_layer_ids", "data", "trust_remote_code")
    args = ["--spec-json", json.dumps({k: spec[k] for k in keep if spec.get(k) is not None}),
            *t.host.vllm_flags(list(vllm_arg or []))]
    if fresh:
        args.append("--no-cache")
    return run_script(t, "check.serve", args, timeout=timeout or 2400, model=ServeCheck,
                      what="the draft-serves preflight's verdict", said=said, standin=standin)


def serve_line(res: ServeCheck) -> str:
    """The preflight's one line: its cost, or why it did not run."""
    res = ServeCheck.of(res)
    if res.skipped:
        return f"draft-serves preflight: skipped: {res.skipped}"
    s = res.check_seconds
    if res.cached:
        return (f"draft-serves preflight: passed before for this verifier, draft config and vLLM version "
                f"({res.cached_at}, {s:.0f} s then); {SERVE_SKIP}")
    kind = res.get("draft")
    name = f"{drafts.KINDS[kind]['name']} " if kind in drafts.KINDS and kind != "eagle3" else ""
    return f"draft-serves preflight: vLLM served the verifier with an untrained {name}draft in {s:.0f} s ({SERVE_SKIP})"


def serve_failure(res: ServeCheck) -> str:
    """What vLLM (or speculators) could not do, in one line: the root cause and where its log is."""
    return serve_check.failure_line(res)


def serve_gate(t: Transport, spec: dict, *, vllm_arg: Optional[list] = None, enabled: bool = True
               ) -> Optional[ServeCheck]:
    """The train gate: the preflight's payload (its one line is a note), or SpecopsError (one line:
    vLLM's root cause) when the draft does not serve; skipped with a note when turned off (None),
    and under --dry-run (said as a plan line: the job's plan goes on)."""
    h = t.host
    if not enabled:
        t.note("draft-serves preflight: skipped (--no-serve-check)")
        return None
    res = draft_serves(t, spec, vllm_arg=vllm_arg, standin=NOT_SERVED,
                said=f"draft-serves preflight: would serve {spec['verifier']} with an untrained draft of this config "
                     f"through vLLM (remote/specops_host/check/serve.py), before the job starts ({SERVE_SKIP})")
    if res is NOT_SERVED:
        return None
    if res.ok:
        t.note(serve_line(res))
        return res
    if res.refused or res.bug:
        raise SpecopsError(f"train on {h.name}: the draft-serves preflight could not run: {res.error} "
                           f"(nothing was started; {SERVE_SKIP})")
    raise SpecopsError(f"train refused on {h.name}: {serve_failure(res)}; the draft-serves preflight took "
                       f"{res.check_seconds or 0:.0f} s; nothing was started ({SERVE_SKIP})")


def serve_verdict(name: str, res: Optional[ServeCheck]) -> None:
    """`inv check --serve`: raise (one line) unless the draft served (or the check was skipped there)."""
    if res is None or res.ok:
        return
    if res.refused or res.bug:
        raise SpecopsError(f"check {name} --serve could not run: {res.error}")
    raise SpecopsError(f"check {name} --serve: {serve_failure(res)} (after {res.check_seconds or 0:.0f} s)")
