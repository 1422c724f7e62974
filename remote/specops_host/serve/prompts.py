"""evaluate's prompts: read (a --prompts file, or the run's held-out rows) and checked against what
the verifier's server takes, before any server starts (serve/evaluate.py --plan; the laptop's dry
run calls check() too, for a file still on the laptop, with the verifier's config.json read from
the host and no tokenizer).

check(): every token id in [0, vocab_size) of the verifier's config.json, and every prompt's length
plus the tokens the evaluation generates within the servers' --max-model-len (itself within the
verifier's max_position_embeddings); a text prompt is tokenised only where its bytes could pass that
length (a token is one byte or more). vLLM's own answer to either comes after the servers are
healthy, as an HTTP 400 naming neither the prompt nor why. stdlib only.
"""

import json

from specops_host.contract import Refused
from specops_host.serve import categories
from specops_host.datafmt import read_arrow_columns, utf8_lines, verifier_positions, verifier_vocab

#: the special tokens a tokenizer may add to a text (BOS, ...): a text of fewer bytes than the limit
#: less these is not tokenised
SPECIALS = 8


def file_rows(path):
    """[(line, {"prompt", "category"?})] of a --prompts file; Refused naming the file and line (an empty
    file: so said)."""
    out = []
    for n, line in utf8_lines(path, "--prompts"):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError as e:
                raise Refused(f"--prompts {path}: line {n} is not JSON ({e})") from None
            prompt = categories.prompt_of(row)
            if not prompt:
                raise Refused(f"--prompts {path}: line {n} holds no \"prompt\" (nor input_ids, text, turns): give one "
                              f"{{\"prompt\": ...}} per line")
            cat = categories.category_of(row, f"--prompts {path}: line {n}")
            out.append((n, {"prompt": prompt, **({"category": cat} if cat else {}),
                            **({"turn": True} if categories.is_turn(row) else {})}))
    if not out:
        raise Refused(f"--prompts {path}: the file is empty: give one {{\"prompt\": ...}} per line")
    return out


def file_prompts(path, limit):
    """The prompts of a --prompts file (file_rows), `limit` of them (categories.first)."""
    return categories.first([p for _, p in file_rows(path)], limit), {"source": str(path)}


def held_out_prompts(spec, limit):
    """The rows speculators validated on (the tail after train-data-ratio), cut before the
    first trained token: the prompt the verifier answered."""
    data = spec["data"]
    ratio = float(spec.get("flags", {}).get("train-data-ratio", 0.9))
    cols = read_arrow_columns(data, ["input_ids", "loss_mask"])
    n = cols["_num_rows"]
    start = int(n * ratio)
    out = []
    for i in range(start, n):
        ids, mask = cols["input_ids"][i], cols["loss_mask"][i]
        first = next((k for k, m in enumerate(mask) if m), len(ids))
        if first > 0:
            out.append({"row": i, "prompt": list(ids[:first])})
    return out[:limit], {"rows": [start, n], "source": f"validation split of {data} (train-data-ratio {ratio})"}


def check(items, *, vocab, vocab_where, max_model_len, length_why, out_tokens, out_why, tokenize=None):
    """Each (where, prompt) of items against the verifier: token ids in [0, vocab) (vocab_where: where
    vocab was read), its tokens + out_tokens (out_why: what asks for them) within max_model_len
    (length_why: what set it). tokenize(text) -> ids counts a text that could be too long (None: such
    a text is left to the host's check). Refused in one line naming where and why."""
    for where, prompt in items:
        n = None
        if isinstance(prompt, list):
            if not all(type(x) is int for x in prompt):
                raise Refused(f"{where}: the prompt is a list but not of token ids (integers): give text or token "
                              f"ids (nothing was started)")
            bad = next((j for j, x in enumerate(prompt) if x < 0 or (vocab and x >= vocab)), None)
            if bad is not None:
                rng = f"[0, {vocab}) ({vocab_where})" if vocab else "[0, ...): token ids are never negative"
                raise Refused(f"{where}: token id {prompt[bad]} at position {bad} is outside the verifier's "
                              f"vocabulary {rng}: were the prompts tokenised for another model? (nothing was started)")
            n = len(prompt)
        elif isinstance(prompt, str):
            if max_model_len and len(prompt.encode()) + SPECIALS + out_tokens > max_model_len and tokenize:
                n = len(tokenize(prompt))
        else:
            raise Refused(f"{where}: the prompt is a JSON {type(prompt).__name__}: give text or token ids "
                          f"(nothing was started)")
        if n is not None and max_model_len and n + out_tokens > max_model_len:
            raise Refused(f"{where}: the prompt's {n} tokens + {out_tokens} generated ({out_why}) make "
                          f"{n + out_tokens}, past the servers' --max-model-len {max_model_len} ({length_why}): "
                          f"shorten the prompt or generate fewer tokens (nothing was started)")


def verifier_limits(verifier):
    """(vocab_size, where, max_position_embeddings, where) of the verifier's config.json (None where
    it has none)."""
    return (*verifier_vocab(verifier), *verifier_positions(verifier))


def tokenizer_of(verifier, trust):
    """tokenize(text) -> ids with the verifier's tokenizer (as the server tokenizes a completion's
    text: its special tokens added), loaded on first use."""
    tok = []

    def tokenize(text):
        if not tok:
            from transformers import AutoTokenizer

            tok.append(AutoTokenizer.from_pretrained(verifier, trust_remote_code=trust))
        return tok[0](text)["input_ids"]
    return tokenize


def labelled(prompts, source, path=None):
    """(where, prompt) of each prompt: a file's line, or the held-out row of the run's dataset."""
    if path:
        line = {json.dumps(p["prompt"]): n for n, p in reversed(file_rows(path))}
        return [(f"--prompts {path}: line {line.get(json.dumps(p['prompt']), '?')}", p["prompt"]) for p in prompts]
    return [(f"the run's held-out prompts ({source.get('source')}): row {p.get('row')}", p["prompt"]) for p in prompts]
