"""Build a tiny random verifier + a local BPE tokenizer (no model hub needed).

Launch (what `inv demo` / `inv make-verifier` send, from the host workdir):
    <venv>/bin/python3 remote/tiny_verifier.py models/tiny-llama [--layers 6]
        [--hidden 256] [--heads 4] [--kv-heads 2] [--vocab 1024] [--dtype bfloat16] [--overwrite]
    <venv>/bin/python3 remote/tiny_verifier.py models/tiny-kimi --shape kimi --code DIR \
        [--layers 8] [--hidden 256] [--experts 8] [--overwrite]

--shape llama (default): a LlamaForCausalLM. Writes OUTDIR/{config.json, model.safetensors,
generation_config.json, tokenizer.json, tokenizer_config.json, chat_template.jinja, ...}.

--shape kimi: Kimi-K2.5's config *shape*: a `KimiK25ForConditionalGeneration` wrapper whose
config.json has `auto_map` pointing at custom code copied from DIR (the repo's
tests/fixtures/kimi/: configuration_kimi_k25.py, modeling_kimi_k25.py) and no
hidden_size / num_hidden_layers at the top level; `text_config` is a DeepSeek-V3 MoE
(`topk_method: noaux_tc`, MLA with kv_lora_rank 512 + qk_rope_head_dim 64, dense first layer,
routed + shared experts) whose weights sit under `language_model.` as in Kimi's checkpoint.
The fixture is loaded back with trust_remote_code before it is published, and must
reproduce the plain DeepSeek-V3 model's logits.

An existing model at OUTDIR is never replaced without --overwrite; the model is written to a
temporary directory beside OUTDIR and renamed into place when complete.
"""

import argparse
import contextlib
import json
import os
import random
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from contract import Refused, emit

KIMI_CODE = ("configuration_kimi_k25.py", "modeling_kimi_k25.py")
KIMI_MEDIA = {"in_patch_limit": 4096, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
              "merge_kernel_size": 2, "fixed_output_tokens": None, "patch_limit_on_one_side": 512,
              "in_patch_limit_each_frame": 4096, "in_patch_limit_video": None, "sample_fps": 2.0,
              "max_num_frames_each_video": None, "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff"}
KIMI_AUTO_MAP = {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                 "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
                 "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration"}

SPECIALS = [
    "<|pad|>",
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|MASK|>",
]

# Llama-3 style template: prefix-stable across turns, so prepare-data's
# render-boundary loss mask works (conv[:j] + generation prompt is a prefix of
# conv[:j+1]).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

WORDS = (
    "the a an of to and in is it you that he was for on are with as I his they be "
    "at one have this from or had by hot word but what some we can out other were "
    "all there when up use your how said each she which do their time if will way "
    "about many then them write would like so these her long make thing see him two "
    "has look more day could go come did number sound no most people my over know "
    "water than call first who may down side been now find any new work part take "
    "get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help "
    "low line differ turn cause much mean before move right boy old too same tell does "
    "set three want air well also play small end put home read hand port large spell "
    "add even land here must big high such follow act why ask men change went light "
    "kind off need house picture try us again animal point mother world near build self "
    "earth father head stand own page should country found answer school grow study "
    "still learn plant cover food sun four between state keep eye never last let "
    "thought city tree cross farm hard start might story saw far sea draw left late run "
    "python code function return value list dictionary loop error model token draft "
    "speculative decoding verifier hidden state layer training data batch step"
).split()


def gen_corpus(n_lines: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        k = rng.randint(5, 25)
        s = " ".join(rng.choice(WORDS) for _ in range(k))
        s = s[0].upper() + s[1:] + rng.choice([".", "?", "!", ":", ","])
        if rng.random() < 0.2:
            s += f" {rng.randint(0, 9999)}"
        lines.append(s)
    return lines


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = gen_corpus(20000) + ["user", "assistant", "system", "\n\n"] * 100
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|pad|>",
        mask_token="<|MASK|>",
        additional_special_tokens=["<|start_header_id|>", "<|end_header_id|>",
                                   "<|end_of_text|>"],
        model_max_length=2048,
        padding_side="right",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def randomize_norms(model):
    # Random RMSNorm weights (instead of all-ones) so that "with vs without the
    # final norm" is numerically distinguishable in the HF-vs-vLLM comparison.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)


def build_llama(args, tok, outdir):
    vocab = len(tok)  # actual size (<= args.vocab)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=args.max_pos,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.02,
    )
    model = LlamaForCausalLM(cfg)
    randomize_norms(model)
    model = model.to(getattr(torch, args.dtype))
    model.generation_config.do_sample = False
    model.save_pretrained(outdir)
    tok.save_pretrained(outdir)
    return {"shape": "llama", "layers": args.layers, "hidden": args.hidden, "vocab": vocab, "dtype": args.dtype,
            "params": sum(p.numel() for p in model.parameters())}


def build_kimi(args, tok, outdir):
    """The Kimi-K2.5 wrapper around a tiny DeepSeek-V3 MoE (see the module docstring)."""
    from safetensors.torch import load_file, save_file
    from transformers import (
        AutoModelForCausalLM,
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
    )

    code = Path(args.code) if args.code else None
    if code is None or not all((code / f).is_file() for f in KIMI_CODE):
        raise Refused(f"--shape kimi needs --code DIR holding {' and '.join(KIMI_CODE)} (the repo's "
                      f"tests/fixtures/kimi/, copied to this host){'' if code is None else f'; {code} lacks them'}")
    vocab = len(tok)
    heads = args.heads
    text = DeepseekV3Config(
        vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        moe_intermediate_size=args.moe_intermediate, num_hidden_layers=args.layers,
        num_attention_heads=heads, num_key_value_heads=heads,
        n_shared_experts=1, n_routed_experts=args.experts, num_experts_per_tok=args.experts_per_token,
        routed_scaling_factor=2.827, topk_method="noaux_tc", scoring_func="sigmoid",
        n_group=1, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True,
        kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=args.qk_nope_head_dim,
        v_head_dim=args.v_head_dim,
        max_position_embeddings=args.max_pos, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
        num_nextn_predict_layers=0, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        initializer_range=0.02,
    )
    lm = DeepseekV3ForCausalLM(text)
    randomize_norms(lm)
    with torch.no_grad():  # (a bias the router learnt: noaux_tc's correction term is not all zeros)
        for n, b in lm.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.uniform_(-0.05, 0.05)
    lm = lm.to(getattr(torch, args.dtype))
    inner = Path(outdir) / ".text-model"
    lm.save_pretrained(inner)  # (per-expert checkpoint names, as DeepSeek-V3 / Kimi ship them)
    weights = load_file(str(inner / "model.safetensors"))
    save_file({f"language_model.{k}": v for k, v in weights.items()}, str(Path(outdir) / "model.safetensors"),
              metadata={"format": "pt"})
    text_dict = json.loads((inner / "config.json").read_text())
    for k in ("dtype", "torch_dtype", "transformers_version"):
        text_dict.pop(k, None)
    text_dict.update(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"])  # (what Kimi ships)
    media = tok.convert_tokens_to_ids("<|MASK|>")
    cfg = {"architectures": ["KimiK25ForConditionalGeneration"], "auto_map": KIMI_AUTO_MAP,
           "model_type": "kimi_k25", "dtype": args.dtype, "media_placeholder_token_id": media,
           "image_token_id": media, "ignore_index": -100, "bos_token_id": tok.bos_token_id,
           "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id, "tie_word_embeddings": False,
           "text_config": text_dict,
           "vision_config": {"patch_size": 14, "pos_emb_height": 8, "pos_emb_width": 8, "pos_emb_time": 4,
                             "num_attention_heads": 2, "num_hidden_layers": 1, "hidden_size": 64,
                             "intermediate_size": 128, "merge_kernel_size": [2, 2]}}
    # Kimi's media processor settings (vLLM's Kimi-K2.5 support reads them even for text alone)
    (Path(outdir) / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": KIMI_MEDIA}, indent=2))
    (Path(outdir) / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (Path(outdir) / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "do_sample": False}, indent=2) + "\n")
    for f in KIMI_CODE:
        shutil.copyfile(code / f, Path(outdir) / f)
    tok.save_pretrained(outdir)
    # Loaded back as every loader will (custom code, trust_remote_code): all weights found, and the
    # wrapper computes exactly what the plain DeepSeek-V3 model does.
    back, info = AutoModelForCausalLM.from_pretrained(outdir, trust_remote_code=True, dtype=lm.dtype,
                                                      output_loading_info=True)
    missing = sorted(info.get("missing_keys") or [])
    if missing or info.get("unexpected_keys"):
        raise RuntimeError(f"the fixture does not load back: missing {missing[:3]}, "
                           f"unexpected {sorted(info.get('unexpected_keys') or [])[:3]}")
    ref = DeepseekV3ForCausalLM.from_pretrained(str(inner), dtype=lm.dtype)
    shutil.rmtree(inner)
    ids = torch.arange(3, min(vocab, 67))[None]
    with torch.no_grad():
        diff = (back(input_ids=ids).logits.float() - ref(input_ids=ids).logits.float()).abs().max().item()
    if diff != 0.0:
        raise RuntimeError(f"the fixture's wrapper disagrees with its DeepSeek-V3 text model (max |diff| {diff})")
    return {"shape": "kimi", "layers": args.layers, "hidden": args.hidden, "vocab": vocab, "dtype": args.dtype,
            "experts": args.experts, "params": sum(p.numel() for p in lm.parameters()),
            "model_class": type(back).__name__}



def refuse_existing(outdir, overwrite):
    """OUTDIR as an absolute Path, refused if it holds files and overwrite is off."""
    out = Path(outdir).expanduser().absolute()
    if (out.is_file() or (out.is_dir() and any(out.iterdir()))) and not overwrite:
        raise Refused(f"{out} already holds {'a model' if (out / 'config.json').is_file() else 'files'}: "
                      f"pass --overwrite to replace it, or choose another path")
    return out


@contextlib.contextmanager
def publishing(outdir, overwrite):
    """Yields (out, tmp): build the model in tmp (beside OUTDIR); when the block ends without an
    error tmp replaces OUTDIR whole, else it is removed and OUTDIR is untouched. An OUTDIR that
    holds files is refused unless overwrite."""
    out = refuse_existing(outdir, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield out, tmp
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--shape", choices=["llama", "kimi"], default="llama")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (llama 6, kimi 8)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--code", default=None, help="kimi: the folder holding the fixture's custom code")
    ap.add_argument("--experts", type=int, default=8, help="kimi: routed experts")
    ap.add_argument("--experts-per-token", type=int, default=2, help="kimi: experts per token")
    ap.add_argument("--moe-intermediate", type=int, default=128, help="kimi: expert width")
    ap.add_argument("--qk-nope-head-dim", type=int, default=64,
                    help="kimi: MLA's non-rotary query/key head width (Kimi-K2.5: 128; vLLM's FlashAttention MLA "
                         "prefill on Hopper refuses 64)")
    ap.add_argument("--v-head-dim", type=int, default=64, help="kimi: MLA's value head width (Kimi-K2.5: 128)")
    ap.add_argument("--overwrite", action="store_true", help="replace a model already at OUTDIR")
    args = ap.parse_args()
    if args.layers is None:
        args.layers = 8 if args.shape == "kimi" else 6

    with publishing(args.outdir, args.overwrite) as (out, tmp):
        torch.manual_seed(args.seed)
        tok = build_tokenizer(args.vocab)
        res = (build_kimi if args.shape == "kimi" else build_llama)(args, tok, str(tmp))
    emit({"ok": True, "path": str(out), **res})
    return 0


if __name__ == "__main__":
    import contract

    contract.main(main)
