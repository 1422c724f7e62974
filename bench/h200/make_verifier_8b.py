"""A random-initialised verifier the size of Llama-3.1-8B, built on the GPU (no download).

    /opt/torch/.venv/bin/python3 bench/h200/make_verifier_8b.py OUTDIR [--layers 32]

hidden 4096, 32 layers, 32 heads / 8 KV heads, intermediate 14336, vocab 128256, bf16, weights
drawn on the GPU (N(0, 0.02)), saved with save_pretrained; plus a word-level tokenizer over the
same 128256 ids ("t<id>", Llama-3 special tokens at their ids) so that `speculators
prepare-data` can load and decode pre-tokenised rows. Bench tooling, run by hand: not a
specops remote script.
"""

import argparse
import json
import os
import sys
import time

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 128256
SPECIAL = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128004: "<|finetune_right_pad_id|>",
           128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128009: "<|eot_id|>"}


def tokenizer(outdir):
    vocab = {f"t{i}": i for i in range(128000)}
    for i in range(128000, VOCAB):
        vocab[SPECIAL.get(i, f"<|reserved_special_token_{i - 128000}|>")] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|reserved_special_token_250|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<|finetune_right_pad_id|>", unk_token="<|reserved_special_token_250|>",
                                   model_max_length=131072)
    fast.save_pretrained(outdir)
    return len(fast)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--layers", type=int, default=32)
    a = ap.parse_args()
    t0 = time.time()
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=4096, intermediate_size=14336, num_hidden_layers=a.layers,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                      tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128009, pad_token_id=128004,
                      initializer_range=0.02, torch_dtype="bfloat16")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.cuda.synchronize()
    t_init = time.time() - t0
    os.makedirs(a.outdir, exist_ok=True)
    model.save_pretrained(a.outdir, max_shard_size="5GB")
    n_tok = tokenizer(a.outdir)
    params = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(a.outdir, f)) for f in os.listdir(a.outdir))
    print(json.dumps({"path": os.path.abspath(a.outdir), "params": params, "layers": a.layers, "hidden": 4096,
                      "vocab": VOCAB, "tokenizer": n_tok, "bytes": size, "init_s": round(t_init, 1),
                      "total_s": round(time.time() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
