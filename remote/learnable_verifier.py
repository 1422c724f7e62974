"""Build a tiny Llama verifier that has *learnt* something: trained on the host's CPU, within a
time budget, on the synthetic low-entropy language of remote/synthlang.py, with a local BPE
tokenizer (every word of the language one token) and the Llama-3 style chat template of
remote/tiny_verifier.py. Its greedy answers follow the language's rule, so an EAGLE-3 draft
trained on its hidden states can predict them (a random verifier's draft accepts nothing, which
is also what a broken pipeline shows).

Launch (what `inv make-verifier --learnable` / `inv demo` send, from the host workdir):
    <venv>/bin/python3 remote/learnable_verifier.py models/learnable-llama [--seconds 90] [--overwrite]
        [--steps 260] [--layers 4] [--frozen-layers 2] [--hidden 128] [--heads 2] [--seed 0] [--threads N]
        [--size tiny|1b|3b] [--device auto|cpu|cuda]

--size 1b (a GPU host): about a billion parameters (16 layers, hidden 2048, 16 heads, 8 KV heads,
intermediate 8192; lr 3e-4, batches of 32, 300 steps), trained on the GPU in bf16 autocast, so that
a vLLM server's decoding is bound by memory as a real verifier's is and a draft's speedup shows.
--size 3b: about 2.8 billion (28 layers, hidden 3072, 24 heads, 8 KV heads, intermediate 8192; lr
2e-4, 300 steps): on an H200 the 1B's decoding is still bound by per-step overhead, this one less.
Explicit flags override the preset's values.

Training runs --steps steps (260: 30-40 s on one core; its greedy agreement is as high at 260 as at
400, 0.94 on 16 held-out answers; batches of 8 conversations, AdamW, cosine
schedule) or stops at --seconds (of this process's CPU time on a CPU, so that a machine others load
slows it without cutting its training short; wall time on a GPU), whichever comes first; one
torch thread (--threads 1): with two,
one busy core (a vLLM server's worker is pinned to one) slows every step tenfold. The first --frozen-layers
decoder layers keep their random initialisation: they pass the tokens on nearly unchanged (the
low-level layers), and the layers above learn the language (the high-level ones), so the
hidden states of low and high layers differ as a real model's do. Trained through all four
layers, the first one does all the work and layers 1-3 hold nearly the same features (cosine
0.92-0.97): a draft then works about as well fed the wrong layers as the right ones, and a
wiring control could not tell them apart.

Writes OUTDIR/{config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json, chat_template.jinja, specops-verifier.json}; specops-verifier.json (and
the payload) record the language (synthlang.describe(), with its fingerprint), weights_sha256,
steps, stopped_by, train_seconds, loss and greedy_agreement, measured before publishing: the
share of the words it answers greedily, on 16 held-out conversations, that follow the
language's rule (`synthlang.rule_agreement`). A model below --min-agreement (0.8) is not
published: the run fails saying so (give it more --seconds).

An existing model at OUTDIR is never replaced without --overwrite; the model is built in a
temporary directory beside OUTDIR and renamed into place when complete.
"""

import argparse
import hashlib
import json
import math
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import contract
import synthlang
from contract import Refused, emit
from tiny_verifier import CHAT_TEMPLATE, SPECIALS, publishing, refuse_existing

KIND = "learnable"


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the language (every word of it one token), the tiny verifier's specials
    and chat template."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(synthlang.tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|pad|>",
        mask_token="<|MASK|>", additional_special_tokens=["<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"],
        model_max_length=2048, padding_side="right")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def single_tokens(tok) -> list:
    """The words the tokenizer does not encode as one token (with and without a leading space)."""
    return [w for w in synthlang.WORDS
            if len(tok.encode(" " + w, add_special_tokens=False)) != 1 or len(tok.encode(w, add_special_tokens=False)) != 1]


def encode(tok, messages) -> list:
    return tok.apply_chat_template(messages, tokenize=True, return_dict=False)


def batches(tok, rng, batch_size):
    """Endless batches of rendered conversations, right-padded: (input_ids, labels, attention_mask)."""
    pad = tok.pad_token_id
    while True:
        seqs = [encode(tok, synthlang.conversation(rng, system=rng.random() < 0.25, turns=1 + (rng.random() < 0.3)))
                for _ in range(batch_size)]
        n = max(map(len, seqs))
        ids = torch.full((batch_size, n), pad, dtype=torch.long)
        labels = torch.full((batch_size, n), -100, dtype=torch.long)
        att = torch.zeros((batch_size, n), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
            labels[i, :len(s)] = ids[i, :len(s)]
            att[i, :len(s)] = 1
        yield ids, labels, att


@torch.no_grad()
def greedy_agreement(model, tok, convs, n_tokens=24) -> float:
    """Share of greedily generated words that follow the language's rule from the two words
    before them (the prompt's last two, then its own), over held-out conversations' first
    answers (prompt: up to the assistant header)."""
    model.eval()
    ok = total = 0
    for msgs in convs:
        first = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        prompt = tok.apply_chat_template(msgs[:first + 1], tokenize=True, add_generation_prompt=True,
                                         return_dict=False)
        dev = next(model.parameters()).device
        out = model.generate(torch.tensor([prompt], device=dev), max_new_tokens=n_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
        a, n = synthlang.rule_agreement(msgs[first]["content"].split()[-2:] + tok.decode(out).split())
        ok, total = ok + a, total + n
    model.train()
    return ok / max(total, 1)


TINY = {"layers": 4, "hidden": 128, "heads": 2, "kv_heads": 1, "intermediate": 384, "lr": 5e-3, "batch": 8,
        "steps": 260, "warmup": 20, "frozen_layers": 2, "seconds": 90.0}
SIZES = {  # --size presets; an explicit flag wins over its preset value
    "tiny": TINY,
    "1b": {**TINY, "layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 8, "intermediate": 8192, "lr": 3e-4,
           "batch": 32, "steps": 300, "warmup": 30, "seconds": 300.0},
    "3b": {**TINY, "layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "intermediate": 8192, "lr": 2e-4,
           "batch": 32, "steps": 300, "warmup": 30, "seconds": 600.0},
}


PROGRESS_ANSWERS = 4  # held-out answers a progress line's agreement is measured on
MEASURE_SHARE = 0.1  # at most this share of the training time goes to the progress lines' agreement


def train(model, tok, args, log):
    dev = next(model.parameters()).device
    rng = random.Random(args.seed)
    held_out = synthlang.conversations(16, seed=10_000 + args.seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    # the budget: this process's CPU seconds on a CPU (a machine others load stretches the wall
    # time, not the training it gets), wall seconds on a GPU; the progress lines' agreement is
    # measured outside it
    clock = time.process_time if dev.type == "cpu" else time.time
    t0, c0, every, measuring = time.time(), clock(), contract.Every(), 0.0

    def took():
        return clock() - c0 - measuring

    step, losses, stopped, last = 0, [], "steps", (0, 0.0)
    for ids, labels, att in batches(tok, rng, args.batch):
        frac = max(step / args.steps, took() / args.seconds)  # (the schedule ends with either)
        if frac >= 1.0:
            stopped = "steps" if step >= args.steps else "seconds"
            break
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = model(input_ids=ids.to(dev), attention_mask=att.to(dev), labels=labels.to(dev)).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
        if every.due():  # (the agreement so far, on a few held-out answers: not counted as training time,
            # and measured only while that costs at most a tenth of the training's: else the last one)
            if measuring <= MEASURE_SHARE * took():
                m0 = clock()
                last = step, greedy_agreement(model, tok, held_out[:PROGRESS_ANSWERS])
                measuring += clock() - m0
            log(f"step {step}/{args.steps} ({took():.0f} s): loss {sum(losses[-20:]) / len(losses[-20:]):.3f}, "
                f"greedy agreement {last[1]:.2f} ({PROGRESS_ANSWERS} held-out answers"
                + (f", at step {last[0]})" if last[0] != step else ")"))
            every.restart()
        elif args.log_every and step % args.log_every == 0:
            log(f"step {step}/{args.steps} ({took():.0f} s): loss {sum(losses[-20:]) / len(losses[-20:]):.3f}")
    return {"steps": step, "stopped_by": stopped, "train_seconds": round(time.time() - t0, 1),
            "budget_seconds": round(took(), 1), "budget_clock": "cpu" if dev.type == "cpu" else "wall",
            "loss": round(sum(losses[-20:]) / max(len(losses[-20:]), 1), 4), "held_out": held_out}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--seconds", type=float, default=None,
                    help="training time budget (CPU seconds of this process on a CPU, wall seconds on a GPU)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (fewer if --seconds runs out first)")
    ap.add_argument("--min-agreement", type=float, default=0.8,
                    help="refuse to publish a model whose greedy agreement is lower")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--intermediate", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--log-every", type=int, default=0,
                    help="a loss line every N steps too (default: only the progress lines, with the agreement)")
    contract.progress_option(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frozen-layers", type=int, default=None,
                    help="first decoder layers kept at their random initialisation (not trained)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: a model this small gains little from more, and with a busy core "
                         "(a vLLM server's worker) two threads wait on each other: 10x slower; 0: torch's default)")
    ap.add_argument("--overwrite", action="store_true", help="replace a model already at OUTDIR")
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny",
                    help="preset dimensions (1b: about a billion parameters, for a GPU host)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where it trains (auto: the GPU when there is one)")
    args = ap.parse_args()
    contract.use_progress_every(args.progress_every)
    for k, v in SIZES[args.size].items():  # (flags left out take the preset's value)
        if getattr(args, k) is None:
            setattr(args, k, v)
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise Refused("--device cuda: torch sees no GPU on this host (torch.cuda.is_available() is False)")
    if not 5 <= args.seconds <= 3600:
        raise Refused(f"--seconds {args.seconds:g}: give 5 to 3600 (the training budget on this host's CPU)")
    if args.steps < 1:
        raise Refused(f"--steps {args.steps}: give 1 or more (260 learn the language)")
    if not 0 <= args.frozen_layers < args.layers:
        raise Refused(f"--frozen-layers {args.frozen_layers}: give 0 to {args.layers - 1} (some layer must learn)")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise Refused(f"--hidden {args.hidden} / --heads {args.heads} / --kv-heads {args.kv_heads}: "
                      f"hidden must divide by heads, heads by kv-heads")

    refuse_existing(args.outdir, args.overwrite)  # (before the time is spent)
    if args.threads and device == "cpu":
        torch.set_num_threads(args.threads)

    def log(text):
        print(f"[specops] learnable verifier: {text}", flush=True)

    with publishing(args.outdir, args.overwrite) as (out, tmp):
        random.seed(args.seed)
        torch.manual_seed(args.seed)
        tok = build_tokenizer(args.vocab)
        split = single_tokens(tok)
        if split:
            raise RuntimeError(f"the tokenizer splits words of the language: {split[:5]} (raise --vocab)")
        cfg = LlamaConfig(
            vocab_size=len(tok), hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
            head_dim=args.hidden // args.heads, max_position_embeddings=2048, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
            initializer_range=0.02)
        model = LlamaForCausalLM(cfg).to(device)
        model.config._attn_implementation = "sdpa"
        for layer in model.model.layers[:args.frozen_layers]:  # (see the module docstring)
            layer.requires_grad_(False)
        log(f"{sum(p.numel() for p in model.parameters())} parameters, vocab {len(tok)}, "
            f"training up to {args.seconds:g} s on " + (torch.cuda.get_device_name(0) if device == "cuda"
                                                          else f"{torch.get_num_threads()} thread(s)"))
        res = train(model, tok, args, log)
        agreement = greedy_agreement(model, tok, res.pop("held_out"))
        log(f"{res['steps']} steps in {res['train_seconds']} s, loss {res['loss']}, greedy agreement "
            f"{agreement:.3f} (16 held-out answers)")
        if agreement < args.min_agreement:
            raise RuntimeError(f"the verifier did not learn the language in {res['train_seconds']} s "
                               f"({res['steps']} steps, stopped by --{res['stopped_by']}): greedy agreement "
                               f"{agreement:.2f} < {args.min_agreement}; give it more --seconds")
        model = model.to(torch.bfloat16)
        model.generation_config.do_sample = False
        model.save_pretrained(str(tmp), max_shard_size="1000GB")  # (one file: weights_sha256 reads it)
        tok.save_pretrained(str(tmp))
        weights = hashlib.sha256((tmp / "model.safetensors").read_bytes()).hexdigest()[:16]
        record = {"kind": KIND, "language": synthlang.describe(), "greedy_agreement": round(agreement, 4),
                  "weights_sha256": weights, "frozen_layers": args.frozen_layers,
                  "layers": args.layers, "hidden": args.hidden, "vocab": len(tok), "dtype": "bfloat16",
                  "size": args.size, "device": device,
                  "params": sum(p.numel() for p in model.parameters()), "seed": args.seed, **res}
        (tmp / "specops-verifier.json").write_text(json.dumps(record, indent=1) + "\n")
    emit({"ok": True, "path": str(out), "shape": "llama", **record})
    return 0


if __name__ == "__main__":
    import contract

    contract.main(main)
