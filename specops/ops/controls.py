"""controls: what the demo's figure is measured against. The trained draft served with its
verifier (acceptance, speedup) beside two controls served the same way: the untrained draft
(speculators' own initialisation) and the trained draft fed other layers' hidden states; and what
they say about the trained draft's figure."""

from __future__ import annotations

import json
import math
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from specops.args import USAGE, Refused, refusing
from specops.errors import SpecopsError
from specops.host.transport import Transport
from specops.ops import jobs, train
from specops.ops.evaluate import Evaluation, Pending, _evaluate_flags, _spec, evaluate, evaluate_run as _evaluate_run
from specops.ops.evaluate import DEFAULT_BASELINES, concurrency_levels, finish
from specops_host.serve import drafts

DEMO_CONFIG = "configs/demo.yaml"
#: acceptance figures kept from an evaluation, per draft, in demo()'s result["acceptance"]
ACCEPTANCE_KEYS = ("mean_acceptance_length", "acceptance_by_position", "conditional_acceptance_by_position",
                   "draft_acceptance_rate", "counters", "prompts", "generated_tokens", "speedup", "speedup_at_1",
                   "seconds", "by_category")


#: `--controls` names -> acceptance()'s keys
CONTROLS = {"untrained": "untrained", "wrong-layers": "wrong_layers"}


def parse_controls(spec: Optional[str]) -> tuple:
    """`--controls untrained,wrong-layers` (either or both) as acceptance()'s keys; an unknown name:
    one line (USAGE), before anything connects."""
    names = [x.strip() for x in (spec or "").split(",") if x.strip()]
    bad = [x for x in names if x not in CONTROLS]
    if bad or not names:
        raise Refused(f"--controls {spec!r}: " + (f"{', '.join(bad)} is not a control" if bad else "no control named")
                      + f"; give {','.join(CONTROLS)} (either or both)", code=USAGE)
    return tuple(dict.fromkeys(CONTROLS[x] for x in names))


def verifier_layers(t: Transport, verifier: str) -> Optional[int]:
    """num_hidden_layers of the verifier's config.json (or its text_config); None if unreadable."""
    try:
        cfg = json.loads(t.read_bytes(f"{verifier}/config.json") or b"{}")
    except ValueError:
        return None
    return (cfg.get("text_config") or {}).get("num_hidden_layers") or cfg.get("num_hidden_layers")


def wrong_layers_draft(t: Transport, run_id: str, *, layer_ids: Optional[list] = None) -> str:
    """A control run `<run_id>.wrong-layers` on the host: the run's trained draft (the checkpoint
    `evaluate` takes as best) whose config declares other aux layer ids than the hidden states it
    was trained on, so vLLM feeds it the residual stream of other layers. Default: moved_layers()
    (each id a quarter of the verifier's depth away: one on a shallow verifier, an off-by-one between
    the extraction's layer numbering and vLLM's). Same train spec: same verifier, same held-out
    prompts. (The order of the ids does not matter: vLLM collects them in layer order.) Returns the
    control's run id."""
    src, cid = jobs.run_path(t, run_id), f"{run_id}.wrong-layers"
    dst = jobs.run_path(t, cid)
    q = shlex.quote
    t.check(f"rm -rf {q(dst)} && mkdir -p {q(dst)}/checkpoints {q(dst)}/logs && cd {q(src)}/checkpoints && "
            f"c=$(if [ -e checkpoint_best ]; then echo checkpoint_best; else ls | grep -E '^[0-9]+$' | sort -n | "
            f"tail -1; fi) && test -n \"$c\" && cp -rL \"$c\" {q(dst)}/checkpoints/0 && "
            f"cp {q(src)}/train-spec.json {q(dst)}/train-spec.json",
            f"copy {run_id}'s draft for the wrong-layers control")
    cfg_path = f"{dst}/checkpoints/0/config.json"
    cfg = json.loads(t.read_bytes(cfg_path) or b"{}")
    key = "aux_hidden_state_layer_ids" if cfg.get("speculators_model_type") == "dflash" else \
        "eagle_aux_hidden_state_layer_ids"  # (DFlash's name for them: vLLM reads either kind's)
    trained = cfg.get(key)
    if not trained:
        raise SpecopsError(f"{run_id}'s draft config has no {key}: not a draft specops serves")
    if layer_ids is None:
        spec = json.loads(t.read_bytes(f"{dst}/train-spec.json") or b"{}")
        depth = verifier_layers(t, spec.get("verifier", "")) or max(trained)
        layer_ids = moved_layers(trained, depth)
    cfg[key] = list(layer_ids)
    cfg["specops_control"] = {"kind": "wrong-layers", "trained_layer_ids": trained, "served_layer_ids": list(layer_ids),
                              "source_run": run_id}
    t.put_text(json.dumps(cfg, indent=1), cfg_path, label="(draft config)")
    return cid


def moved_layers(trained: list, depth: int) -> list:
    """The wrong-layers control's ids: each trained id moved by a quarter of the verifier's depth (at least 1), up
    where that stays inside it, else down. Neighbouring layers of a deep verifier carry nearly the same features: an
    off-by-one served as well as the right ids (SmolLM2, 30 layers: 1.225 vs 1.219; the 16-layer verifier on the
    H200: 3.84 vs 3.85), a control that says nothing. Where the moves collide, each id one up (one down at the top)."""
    step = max(1, depth // 4)
    moved = [i + step if i + step < depth else i - step for i in trained]
    if len(set(moved)) == len(moved) and min(moved) >= 0 and set(moved) != set(trained):
        return moved
    return [i + 1 for i in trained] if max(trained) < depth else [i - 1 for i in trained]


def untrained_draft(t: Transport, run_id: str, *, dataset: Optional[str], verifier: Optional[str],
                    config: Optional[str] = DEMO_CONFIG,
                    hidden_states: str = "auto", layers: Optional[str] = None) -> str:
    """A control run `<run_id>.untrained`: `speculators train --dry-run` on the same data, verifier
    and config (speculators 0.9.0's own "build the speculator, initialise its weights, save the
    checkpoint, exit before training", as the draft-serves preflight builds its draft): the draft
    training starts from (speculators' own initialisation, the verifier's embeddings and lm_head),
    with no data loaded and no step taken. Its checkpoint is moved to checkpoints/0, where a
    training's first one would be. hidden_states, layers: the trained run's (an online run's data has no hidden
    states on disk: its control is built online too, on the same layers). Returns the control's run id."""
    cid = f"{run_id}.untrained"
    ck = jobs.run_path(t, cid, "checkpoints")
    t.check(f"rm -rf {shlex.quote(jobs.run_path(t, cid))}", f"clear an earlier {cid}")  # (a re-run would resume it)
    train.train(t, config=config, run_id=cid, dataset=dataset, verifier=verifier, follow=True, layers=layers,
                hidden_states=hidden_states, overrides={"dry-run": True}, serve_check=False,
                own=True)  # (evaluate serves it next)
    q = shlex.quote(ck)
    t.check(f"cd {q} && test -f config.json && mkdir 0 && find . -mindepth 1 -maxdepth 1 ! -name 0 "
            f"-exec mv -t 0 {{}} +", f"{cid}: the dry run's checkpoint as checkpoints/0")
    return cid


def untrained_first(t: Transport, run_id: str, *, kind: str, dataset: Optional[str], verifier: Optional[str],
                    config: Optional[str], hidden_states: str = "auto", dest: str = "runs", num_spec_tokens: int = 3,
                    max_prompts: int = 32, max_tokens: int = 64, vllm_arg: Optional[list] = None,
                    control_prompts: int = 16) -> dict:
    """The untrained control of a run that has not trained yet (`inv bakeoff --controls untrained`): untrained_draft()
    of the config the run will train with (the training's step 0), served by evaluate() on the first control_prompts
    of the held-out prompts the run's evaluation takes, as the draft-serves preflight serves one (eager on a cpu host;
    on a GPU as the trained draft will be, CUDA graphs and all). That one server is both the run's preflight (vLLM
    served an untrained draft of its config; the training then skips its own) and its control: the same untrained
    draft is not built and served twice, once before the training and once after it (a server start and a draft build
    a kind; on a GPU minutes each). Returns acceptance_summary() (kind untrained, `how`); a draft vLLM cannot serve:
    SpecopsError, before anything trains."""
    name = drafts.KINDS[kind]["name"]
    t0 = time.time()
    try:
        cid = untrained_draft(t, run_id, dataset=dataset, verifier=verifier, config=config,
                              hidden_states=hidden_states)
        more = ["--enforce-eager"] if t.host.profile == "cpu" and "--enforce-eager" not in (vllm_arg or []) else []
        ev = evaluate(t, cid, checkpoint="0", dest=str(Path(dest) / run_id / "controls"), speedup="none",
                      num_spec_tokens=num_spec_tokens, max_prompts=min(max_prompts, control_prompts),
                      max_tokens=max_tokens, vllm_arg=[*(vllm_arg or []), *more])
    except SpecopsError as e:
        raise SpecopsError(f"the draft-serves preflight (its untrained {name} control, served before the training): "
                           f"{e}; nothing was trained", detail=e.detail) from None
    t.note(f"draft-serves preflight: vLLM served the verifier with an untrained {name} draft in "
           f"{time.time() - t0:.0f} s: its untrained control, served before its training (mean acceptance length "
           f"{ev['mean_acceptance_length']:.2f}), so its training runs no preflight of its own")
    return acceptance_summary(ev, cid, kind="untrained", how="speculators train --dry-run: its initialised draft, "
                                                              "served before the training (its preflight)")


def acceptance_summary(ev: dict, run_id: str, **extra) -> dict:
    return {"run_id": run_id, **{k: ev.get(k) for k in ACCEPTANCE_KEYS}, **extra}


def acceptance(t: Transport, run_id: str, *, dataset: str, verifier: str, dest: str = "runs",
               controls: tuple = ("untrained", "wrong_layers"), num_spec_tokens: int = 3, max_prompts: int = 32,
               max_tokens: int = 64, config: str = DEMO_CONFIG, vllm_arg: Optional[list] = None,
               speedup: str = "1,16", control_prompts: int = 16, repeats: int = 3,
               control_args: Optional[list] = None, prompts: Optional[str] = None, full: bool = False,
               hidden_states: str = "auto", layers: Optional[str] = None, **timing) -> dict:
    """Serve the run's trained draft with the verifier through vLLM (`evaluate`; its speedup over
    the verifier alone timed at the `speedup` concurrency levels: the controls' is not) and, on the
    first `control_prompts` of the same held-out prompts (a control's level, near 1 or between,
    shows on fewer), the controls: {"trained": {...}, "untrained": {...}, "wrong_layers": {...}},
    each with ACCEPTANCE_KEYS, its run id and kind (wrong_layers: trained_layer_ids and
    served_layer_ids too). control_args: the controls' vLLM arguments beside vllm_arg (--enforce-eager on a
    GPU: they measure acceptance, and start faster without CUDA graphs). The trained draft's evaluation.json is
    dest/<run_id>/evaluation.json; the controls' are under dest/<run_id>/controls/<control run id>/.
    prompts: all three's (default: the run's held-out prompts); timing: the trained draft's evaluate()
    timing settings (baselines, tune, ...); full: out["evaluation"] is the trained draft's whole evaluation
    (`inv evaluate --controls` shows it)."""
    kw: dict[str, Any] = dict(num_spec_tokens=num_spec_tokens, max_prompts=max_prompts, max_tokens=max_tokens,
                              vllm_arg=vllm_arg, **({"prompts": prompts} if prompts else {}))
    out: dict[str, Any] = {}
    with t.step(f"serve {run_id}'s draft with the verifier (vLLM, {num_spec_tokens} draft tokens)"):
        ev = evaluate(t, run_id, dest=dest, speedup=speedup, repeats=repeats, **kw, **timing)
        out["trained"] = acceptance_summary(ev, run_id, kind="trained")
        if full:
            out["evaluation"] = ev
    t.note(f"trained draft: mean acceptance length {out['trained']['mean_acceptance_length']:.2f}"
           + (f", speedup at 1 concurrent request {out['trained']['speedup_at_1']:.2f}x"
              if out["trained"].get("speedup_at_1") is not None else ""), "done")
    more = [a for a in (control_args or []) if a not in (vllm_arg or [])]
    kw.update(speedup="none", max_prompts=min(max_prompts, control_prompts), vllm_arg=[*(vllm_arg or []), *more])
    ctl_dest = str(Path(dest) / run_id / "controls")

    def wrong_layers(beside):  # (its run id, what was changed, its evaluation or a Pending one)
        cid = wrong_layers_draft(t, run_id)
        cfg = json.loads(t.read_bytes(jobs.run_path(t, cid, "checkpoints", "0", "config.json")) or b"{}")
        return cid, cfg.get("specops_control", {}), evaluate(t, cid, checkpoint="0", dest=ctl_dest, beside=beside, **kw)

    # a cpu host: the wrong-layers control is served beside the untrained one (the controls measure
    # acceptance, not speed; a server's start is one busy interpreter at a time, so two share the
    # cores); a GPU's two servers would share its memory: one after the other there
    wrong = None
    if "untrained" in controls:
        with t.step("control: the untrained draft (speculators' step 0), served the same way"):
            if "wrong_layers" in controls and t.host.profile == "cpu":
                wrong = wrong_layers(beside=True)
                if isinstance(wrong[2], Pending):
                    t.note(f"the wrong-layers control is served beside it: run {wrong[2].eid} "
                           f"(`{t.hint(f'logs -f --run-id {wrong[2].eid}')}` shows its log)")
            try:
                cid = untrained_draft(t, run_id, dataset=dataset, verifier=verifier, config=config,
                                      hidden_states=hidden_states, layers=layers)
                how = "speculators train --dry-run: its initialised draft"
                out["untrained"] = acceptance_summary(evaluate(t, cid, checkpoint="0", dest=ctl_dest, **kw), cid,
                                                      kind="untrained", how=how)
            except BaseException:
                if wrong and isinstance(wrong[2], Pending):
                    jobs.stop(t, wrong[2].eid, grace=30)
                raise
        t.note(f"untrained draft: mean acceptance length {out['untrained']['mean_acceptance_length']:.2f}", "done")
    if "wrong_layers" in controls:
        with t.step("control: the trained draft fed other layers' hidden states, served the same way"):
            cid, what, ev = wrong or wrong_layers(beside=False)
            try:
                ev = finish(t, ev) if isinstance(ev, Pending) else ev
            except BaseException:  # (Ctrl-C while waiting for it: it does not go on alone)
                jobs.stop(t, ev.eid, grace=30)
                raise
            out["wrong_layers"] = acceptance_summary(ev, cid, **what)
        t.note(f"wrong-layers draft: mean acceptance length {out['wrong_layers']['mean_acceptance_length']:.2f}",
               "done")
    return out


def standard_errors(a: dict, b: dict) -> Optional[float]:
    """How far draft a's share of its draft tokens accepted stands over draft b's, in pooled standard errors (their
    spec-decode counters); None without both's counters."""
    ca, cb = a.get("counters") or {}, b.get("counters") or {}
    na, nb = ca.get("draft_tokens") or 0, cb.get("draft_tokens") or 0
    if not (na > 0 and nb > 0):
        return None
    aa, ab = ca.get("accepted") or 0, cb.get("accepted") or 0
    p = (aa + ab) / (na + nb)
    se = math.sqrt(p * (1 - p) * (1 / na + 1 / nb))
    return (aa / na - ab / nb) / se if se > 0 else 0.0


def below(a: dict, b: dict, margin: float) -> bool:
    """Whether draft b's acceptance is clearly under draft a's: with both's spec-decode counters, b's share of its
    draft tokens accepted lower by more than 3 standard errors (pooled: standard_errors); without them, b's mean
    acceptance length `margin` or more under a's."""
    z = standard_errors(a, b)
    if z is not None:
        return z > 3
    return b["mean_acceptance_length"] <= a["mean_acceptance_length"] - margin


def controls_verdict(acc: dict, margin: float = 0.5) -> list[str]:
    """What the controls say about the trained draft's figure, a line each: a control not clearly under the trained
    draft (below(): by its accepted tokens' share, or by `margin` of mean acceptance length) does not separate them
    (said so, never claimed as proof)."""
    t = acc.get("trained") or {}
    m = t.get("mean_acceptance_length")
    if m is None:
        return []
    out = []
    u = acc.get("untrained") or {}
    if u.get("mean_acceptance_length") is not None:
        out.append(f"untrained draft {u['mean_acceptance_length']:.2f} vs trained {m:.2f}: " + (
            "the figure comes from training" if below(t, u, margin) else
            "as high as the trained draft: this figure does not show what training did"))
    w = acc.get("wrong_layers") or {}
    if w.get("mean_acceptance_length") is not None:
        x = w["mean_acceptance_length"]
        ids = (f" (layers {w.get('served_layer_ids')} for {w.get('trained_layer_ids')})"
               if w.get("served_layer_ids") else "")
        out.append(f"fed other layers{ids} {x:.2f} vs {m:.2f}: " + (
            "the draft depends on the hidden states of the layers it learnt from" if below(t, w, margin) else
            "as high as with the right layers: this verifier's neighbouring layers carry nearly the same "
            "features, so this control does not separate them here"))
    return out


def _flags(controls: Optional[str] = None, checkpoint: str = "best", checkpoints: Optional[str] = None, **kw) -> None:
    _evaluate_flags(checkpoint=checkpoint, checkpoints=checkpoints, **kw)
    if controls is not None:
        parse_controls(controls)
        if checkpoints is not None or checkpoint != "best":
            raise Refused(f"--controls are built from the run's best checkpoint (as the demo's): drop "
                          f"{'--checkpoints' if checkpoints is not None else '--checkpoint ' + checkpoint}")


@refusing(_flags)
def evaluate_run(t: Transport, run_id: str, *, controls: Optional[str] = None, speedup: Optional[str] = None,
                 measured: Optional[dict] = None, **kw) -> Evaluation:
    """`inv evaluate`: ops/evaluate.py evaluate_run(); with controls (untrained,wrong-layers: either or both),
    acceptance() (the demo's code) on the same prompts, the controls built from the run's own data, verifier
    (train-spec.json) and training flags (the untrained draft is that training's step 0). measured: controls served
    already ({"untrained": untrained_first()'s}: the bake-off's), kept, not served again."""
    if controls is None:
        return _evaluate_run(t, run_id, speedup=speedup, **kw)
    which = tuple(c for c in parse_controls(controls) if c not in (measured or {}))
    kw = {k: v for k, v in kw.items() if v is not None and k not in ("checkpoint", "checkpoints", "pick")}
    speedup = speedup or "1,16"
    if kw.get("baselines") is None:  # (as evaluate_run: beside the trained draft's timing)
        kw["baselines"] = DEFAULT_BASELINES if concurrency_levels(speedup) else "none"
    spec = _spec(t, run_id)
    if not spec.get("data") or not spec.get("verifier"):
        raise SpecopsError(f"--controls: {run_id}'s train-spec.json names no data or verifier to build them from")
    with tempfile.TemporaryDirectory() as tmp:  # (the run's resolved flags: the untrained draft is its step 0)
        cfg = Path(tmp) / "run-config.yaml"
        cfg.write_text(yaml.safe_dump({"train": spec.get("flags") or {}}))
        ids = ((spec.get("record") or {}).get("data_summary") or {}).get("record", {}).get("layer_ids")
        acc = acceptance(t, run_id, dataset=spec["data"], verifier=spec["verifier"], controls=which, config=str(cfg),
                         full=True, control_args=["--enforce-eager"], speedup=speedup,
                         hidden_states=spec.get("hidden_states") or "auto",
                         layers=",".join(map(str, ids)) if spec.get("hidden_states") == "online" and ids else None,
                         **kw)
    ev = acc.pop("evaluation")
    acc.update(measured or {})
    ev["controls"] = {"acceptance": acc, "num_spec_tokens": kw.get("num_spec_tokens", 3),
                      "controls_verdict": controls_verdict(acc)}
    return Evaluation(run_id, kw.get("dest", "runs"), ev)
