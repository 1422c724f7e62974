"""The draft kinds specops trains, preflights, serves and times: speculators' `--speculator-type`
and the vLLM speculative config each is served with (stdlib only; the laptop imports it too).

- eagle3: `{"method": "eagle3"}` (one draft token per forward, k forwards a step).
- peagle: P-EAGLE, an EAGLE-3 draft trained to draft k tokens in one forward (mask tokens for the
  later positions): vLLM serves it as eagle3 with `parallel_drafting` (vLLM's speculators config
  reader maps `speculators_model_type: peagle` to the same: transformers_utils/configs/speculators/
  base.py; its architecture PeagleLlamaForCausalLM, its `pard_token` the checkpoint's mask_token_id).
- dflash: a block-diffusion draft (speculators' DFlashDraftModel, qwen3 layers over the verifier's
  aux hidden states): `{"method": "dflash"}`, at most block_size - 1 draft tokens (its
  speculative_tokens); vLLM turns parallel drafting on itself.

speculators 0.9.0 trains more (dflash2, dspark, mtp, xpress): not specops' kinds (REFUSED says why),
so `inv train --draft` refuses them in one line.
"""

import json
from pathlib import Path

#: speculators' type -> what specops knows of it: its name, its training config, the k `--tune` sweeps
KINDS = {
    "eagle3": {"name": "EAGLE-3", "config": "configs/eagle3.yaml", "tune_k": (1, 2, 3, 4, 5)},
    "peagle": {"name": "P-EAGLE", "config": "configs/peagle.yaml", "tune_k": (1, 2, 3, 4, 5, 6, 7, 8)},
    "dflash": {"name": "DFlash", "config": "configs/dflash.yaml", "tune_k": (1, 2, 3, 4, 5, 6, 7, 8)},
}
#: speculators 0.9.0's other types, and why specops does not train them as a kind of its own
REFUSED = {
    "dflash2": "vLLM reads it, but specops has no config, preflight or test of it yet",
    "dspark": "vLLM reads it, but specops has no config, preflight or test of it yet",
    "mtp": "vLLM reads no speculators mtp checkpoint (its speculators reader registers eagle3, peagle, dflash, "
           "dflash2, dspark); it serves a verifier's own MTP head",
    "xpress": "vLLM has no xpress method and reads no speculators xpress checkpoint",
}


def kind_problem(kind):
    """None for a kind specops runs; else one line saying why not and what to give."""
    if kind in KINDS:
        return None
    why = f" ({REFUSED[kind]})" if kind in REFUSED else ""
    return f"--draft {kind}: not a draft kind specops trains, serves and times{why}: choose {', '.join(KINDS)}"


def checkpoint_kind(ckpt):
    """The kind of a saved draft: its config.json's speculators_model_type (eagle3 when unsaid)."""
    try:
        cfg = json.loads((Path(ckpt) / "config.json").read_text())
    except (OSError, ValueError):
        return "eagle3"
    return str(cfg.get("speculators_model_type") or "eagle3")


def trained_tokens(ckpt):
    """The draft tokens the checkpoint was trained to propose (its speculators_config's first proposal
    method's speculative_tokens: peagle's num-depths, dflash's block size less one), or None."""
    try:
        cfg = json.loads((Path(ckpt) / "config.json").read_text())
        return int(cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def speculative_config(kind, model, k):
    """vLLM's --speculative-config for a draft of this kind at k draft tokens."""
    if kind == "peagle":
        return {"method": "eagle3", "model": str(model), "num_speculative_tokens": k, "parallel_drafting": True}
    if kind == "dflash":
        return {"method": "dflash", "model": str(model), "num_speculative_tokens": k}
    return {"method": "eagle3", "model": str(model), "num_speculative_tokens": k}


def k_problem(kind, ckpt, k):
    """None when vLLM can serve this draft at k tokens; else one line. A DFlash draft proposes at most
    what it was trained for (its block less one); the others any k (accuracy past their depth drops)."""
    most = trained_tokens(ckpt)
    if kind == "dflash" and most is not None and k > most:
        return (f"{k} draft tokens: this DFlash draft proposes at most {most} (its block size less one): give "
                f"--num-spec-tokens/--tune-k {most} or less")
    return None


def tune_ks(kind, ckpt):
    """The k `--tune` sweeps for this kind (DFlash's up to what the checkpoint proposes)."""
    ks = KINDS.get(kind, KINDS["eagle3"])["tune_k"]
    most = trained_tokens(ckpt) if kind == "dflash" else None
    return [k for k in ks if most is None or k <= most]


def label(kind, k):
    """A side's name in the timing table: `eagle3 k=3`, `peagle k=7`."""
    return f"{kind} k={k}"
