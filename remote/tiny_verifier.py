"""Build a tiny random Llama verifier + a local BPE tokenizer (no model hub needed).

Launch (what `inv demo` / `inv make-verifier` send, from the host workdir):
    <venv>/bin/python3 remote/tiny_verifier.py models/tiny-llama [--layers 6]
        [--hidden 256] [--heads 4] [--kv-heads 2] [--vocab 1024] [--dtype bfloat16]

Writes OUTDIR/{config.json, model.safetensors, generation_config.json,
tokenizer.json, tokenizer_config.json, chat_template.jinja, ...}.
"""

import argparse
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from contract import emit

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    tok = build_tokenizer(args.vocab)
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
    # Random RMSNorm weights (instead of all-ones) so that "with vs without the
    # final norm" is numerically distinguishable in the HF-vs-vLLM comparison.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    model = model.to(getattr(torch, args.dtype))
    model.generation_config.do_sample = False
    os.makedirs(args.outdir, exist_ok=True)
    model.save_pretrained(args.outdir)
    tok.save_pretrained(args.outdir)
    emit({"ok": True, "path": os.path.abspath(args.outdir), "layers": args.layers, "hidden": args.hidden,
          "vocab": vocab, "dtype": args.dtype, "params": sum(p.numel() for p in model.parameters())})
    return 0


if __name__ == "__main__":
    import contract

    contract.main(main)
