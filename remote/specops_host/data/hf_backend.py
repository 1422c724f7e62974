"""The transformers backend of the data stage (`inv extract --backend hf`): the verifier loaded with
transformers on one GPU, or spread with device_map=auto over --tensor-parallel GPUs when its weights
do not fit one (cpu hosts: the CPU), one forward per row with hooks on the decoder layers, files
identical to what vLLM's hidden-states connector writes (hidden_states/hs_{i}.safetensors).

Not a launch script: remote/specops_host/data/datagen.py calls `hf_extract`; remote/specops_host/check/deep.py too.
"""

import os
import time
from pathlib import Path

from specops_host.contract import Refused, human_bytes
from specops_host.datafmt import hs_files, read_arrow_columns
from specops_host.data.hsfile import readable

NORMS = ("norm", "final_layernorm", "final_norm", "norm_f", "ln_f")
DECODER_ATTRS = ("language_model", "model", "text_model", "decoder", "transformer")


def weights_bytes(path):
    return sum(p.stat().st_size for p in Path(path).glob("*.safetensors")) or \
        sum(p.stat().st_size for p in Path(path).glob("*.bin"))


def hf_placement(verifier, kind, tensor_parallel):
    """Where the hf backend puts the model: CPU on cpu hosts; one GPU when the weights fit GPU 0,
    else device_map=auto over the first --tensor-parallel GPUs (needs `accelerate`).

    SPECOPS_GPU_MEMORY_CAP_GIB=N in the environment caps what each GPU may hold at N GiB: every
    GPU's free memory counts as min(free, N GiB), so weights that would fit one GPU are spread over
    --tensor-parallel GPUs (the several-GPU path tried on a small model, or room kept on each GPU).
    The result records the decision: `device` ("cuda:0", or "cuda:0..k" with the per-GPU budget),
    `max_memory` (bytes per GPU, when split), `free_gib` (per GPU, after the cap), `cap_gib` (when set)."""
    import torch

    if kind != "cuda" or not torch.cuda.is_available():
        return {"device": "cpu"}
    raw = os.environ.get("SPECOPS_GPU_MEMORY_CAP_GIB", "").strip()
    cap = None
    if raw:
        try:
            cap = float(raw)
        except ValueError:
            cap = float("nan")
        if not cap > 0:
            raise Refused(f"SPECOPS_GPU_MEMORY_CAP_GIB={raw!r}: give a positive number of GiB (what each GPU "
                          f"may hold), or unset it")
    capped = "" if cap is None else f", capped at {cap:g} GiB a GPU by SPECOPS_GPU_MEMORY_CAP_GIB"
    rec = {} if cap is None else {"cap_gib": cap}

    def free(i):
        f = torch.cuda.mem_get_info(i)[0]
        return f if cap is None else min(f, int(cap * 2**30))

    size = weights_bytes(verifier)
    free0 = free(0)
    if size * 1.15 <= free0:
        return {"device": "cuda:0", "device_map": {"": 0}, "free_gib": [round(free0 / 2**30, 2)], **rec}
    use = min(tensor_parallel, torch.cuda.device_count())
    if use <= 1:
        if tensor_parallel > 1:
            raise Refused(f"the verifier's weights ({human_bytes(size)}) do not fit GPU 0 ({human_bytes(free0)} "
                          f"free{capped}) and "
                          f"--tensor-parallel {tensor_parallel} has only {torch.cuda.device_count()} GPU(s) to "
                          f"spread it over (CUDA_VISIBLE_DEVICES, or this host's GPUs)")
        raise Refused(f"the verifier's weights ({human_bytes(size)}) do not fit GPU 0 ({human_bytes(free0)} "
                      f"free{capped}): set "
                      f"tensor_parallel in hosts.yaml (or --tensor-parallel) to spread it over several GPUs")
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise Refused(f"the verifier's weights ({human_bytes(size)}) need {use} GPUs and device_map=auto needs "
                      f"`accelerate`, which this venv lacks: pip install accelerate (or use --backend vllm)")
    frees = [free(i) for i in range(use)]
    max_memory = {i: int(f * 0.9) for i, f in enumerate(frees)}
    if size * 1.05 > sum(max_memory.values()):
        raise Refused(f"the verifier's weights ({human_bytes(size)}) do not fit {use} GPU(s) "
                      f"({human_bytes(sum(max_memory.values()))} usable{capped}): use --backend vllm")
    each = "/".join(f"{m / 2**30:.1f}" for m in max_memory.values())
    return {"device": f"cuda:0..{use - 1} (device_map=auto, at most {each} GiB each{capped})",
            "device_map": "auto", "max_memory": max_memory, "free_gib": [round(f / 2**30, 2) for f in frees], **rec}


def decoder_stack(model, n):
    """(stack, layers, final norm) of the language model inside `model`: the module holding
    `layers` (n of them) and the final norm, found through get_decoder() and the usual wrapper
    attributes (language_model, model, ...). Refused when there is none."""
    from torch import nn

    queue, seen, tried = [model], set(), []
    while queue:
        m = queue.pop(0)
        if id(m) in seen:
            continue
        seen.add(id(m))
        tried.append(type(m).__name__)
        layers = getattr(m, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) == n:
            norm = next((getattr(m, k) for k in NORMS if isinstance(getattr(m, k, None), nn.Module)), None)
            if norm is None:
                raise Refused(f"the verifier's decoder stack {type(m).__name__} has no final norm (looked for "
                              f"{', '.join(NORMS)}): the hf backend cannot take the pre-norm residual; use "
                              f"--backend vllm")
            return m, layers, norm
        subs = []
        get_decoder = getattr(m, "get_decoder", None)
        if callable(get_decoder):
            try:
                subs.append(get_decoder())
            except Exception:  # noqa: BLE001 - a bespoke model may refuse; the attributes remain
                pass
        subs += [getattr(m, k, None) for k in DECODER_ATTRS]
        queue += [x for x in subs if isinstance(x, nn.Module) and x is not m]
    raise Refused(f"no decoder stack in the verifier ({type(model).__name__}): no module with `layers` "
                  f"({n} of them, as text_config.num_hidden_layers says) under get_decoder()/"
                  f"{'/'.join(DECODER_ATTRS)} (looked in {', '.join(dict.fromkeys(tried))}); use --backend vllm")


def load_verifier(verifier, trust, placement):
    """(model, text config) through transformers, with trust_remote_code as decided."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    def untrusted(what):
        return Refused(f"verifier {verifier}: its {what} needs the model's own code (auto_map) and "
                       f"trust_remote_code is off: set trust_remote_code (hosts.yaml) or --trust-remote-code "
                       f"to true (or auto)")

    try:
        config = AutoConfig.from_pretrained(verifier, trust_remote_code=trust)
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise untrusted("config") from None
        raise
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("num_hidden_layers", "hidden_size"):
        if not isinstance(getattr(text, key, None), int):
            raise Refused(f"verifier {verifier}: its text config ({type(text).__name__}) has no {key}")
    kw = {"config": config, "dtype": torch.bfloat16, "trust_remote_code": trust}
    if placement.get("device_map") is not None:
        kw["device_map"] = placement["device_map"]
    if placement.get("max_memory"):
        kw["max_memory"] = placement["max_memory"]
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(verifier, **kw)
        except ValueError as e:
            if "Unrecognized configuration class" not in str(e):
                raise
            model = AutoModel.from_pretrained(verifier, **kw)  # (a wrapper registered only as AutoModel)
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise untrusted("model class") from None
        raise
    if placement.get("device_map") is None:
        model = model.to(placement["device"])
    return model.eval(), text


def hf_extract(data, verifier, layer_ids, start, end, kind, *, trust=False, tensor_parallel=1):
    """Transformers forward of the language model alone; slot k < n = the input of decoder layer
    k (k = 0: the embeddings), slot n = the residual before the final norm (a pre-hook on it:
    HF's hidden_states[-1] already has the norm applied). Wrapped (multimodal), MoE and
    several-GPU verifiers alike."""
    import torch
    from safetensors.torch import save_file

    placement = hf_placement(verifier, kind, tensor_parallel)
    model, text = load_verifier(verifier, trust, placement)
    n = text.num_hidden_layers
    stack, layers, norm = decoder_stack(model, n)
    on = [str(next(m.parameters()).device) for m in layers]
    layers_per_device = {d: on.count(d) for d in dict.fromkeys(on)}
    captured = {}

    def first(args, kwargs):
        return args[0] if args else kwargs["hidden_states"]

    def keep(k):
        return lambda _m, args, kwargs: captured.__setitem__(k, first(args, kwargs))

    def keep_out(k):
        return lambda _m, _args, out: captured.__setitem__(k, out[0] if isinstance(out, (tuple, list)) else out)

    for k in layer_ids:
        if k == 0:
            layers[0].register_forward_pre_hook(keep(0), with_kwargs=True)
        elif k < n:
            layers[k - 1].register_forward_hook(keep_out(k))
    norm.register_forward_pre_hook(keep(n), with_kwargs=True)
    embed = model.get_input_embeddings()
    device = embed.weight.device if embed is not None else torch.device(placement["device"])
    ids_col = read_arrow_columns(data, ["input_ids"])["input_ids"]
    out = Path(data) / "hidden_states"
    out.mkdir(parents=True, exist_ok=True)
    have = hs_files(data)
    print(f"[specops] hf extract: {type(model).__name__} (decoder {type(stack).__name__}, {n} layers, final norm "
          f"{type(norm).__name__}) on {placement['device']}, trust_remote_code={trust}, layers per device "
          f"{layers_per_device}", flush=True)
    t0, tokens, done = time.time(), 0, 0
    with torch.inference_mode():
        for i in range(start, end):
            if i in have and readable(have[i]):
                continue
            ids = torch.tensor(ids_col[i], dtype=torch.long, device=device)
            captured.clear()
            try:
                stack(input_ids=ids[None], use_cache=False)
            except TypeError:
                stack(input_ids=ids[None])
            missing = [k for k in layer_ids if k not in captured]
            if missing:
                raise Refused(f"the forward of {type(stack).__name__} did not pass layer(s) {missing}: "
                              f"the hf backend cannot handle this verifier; use --backend vllm")
            slots = [captured[k][0].to("cpu", torch.bfloat16) for k in layer_ids]
            hidden = torch.stack(slots, dim=1).contiguous()
            tmp = out / f".hs_{i}.safetensors.tmp"
            save_file({"hidden_states": hidden, "token_ids": ids.cpu().contiguous()}, str(tmp))
            os.replace(tmp, out / f"hs_{i}.safetensors")  # never a truncated file under the real name
            tokens += ids.numel()
            done += 1
            if done % 50 == 0 or i == end - 1:
                dt = time.time() - t0
                print(f"[specops] hf extract: {done} files, {tokens} tokens, {tokens / max(dt, 1e-9):.0f} tokens/s",
                      flush=True)
    dt = time.time() - t0
    return {"files": done, "tokens": tokens, "seconds": round(dt, 2),
            "tokens_per_s": round(tokens / dt, 1) if dt > 0 else None, "device": placement["device"],
            "model_class": type(model).__name__, "decoder_class": type(stack).__name__,
            "layers_per_device": layers_per_device,
            "placement": {k: v for k, v in placement.items() if k != "device_map"}}
