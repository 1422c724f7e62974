"""evaluate's prompts by category: one row of a --prompts file read (its prompt and category), and
acceptance counted per category (docs/evaluation.md).

A row is {"prompt": text or token ids} (also "input_ids", "text"), or MT-Bench's and SPEED-Bench's
question row {"question_id", "category", "turns": [user turn, ...]} (its first turn, as a user's
message through the verifier's chat template: chat()); any row may carry "category". The prompts of
each category are sent together, one after another as before, and vLLM's spec-decode counters are
read between categories: a category's acceptance is the counters' change over its prompts, and the
categories' counters add up to the whole evaluation's. stdlib only, but chat() is given the verifier's
tokenizer (the laptop's check reads rows the same way).
"""

from specops_host.contract import Refused

#: the category of a prompt without one, where others have one
NONE = "(none)"


def prompt_of(row):
    """The prompt of one parsed row: "prompt", "input_ids" or "text", else the first of "turns" (MT-Bench,
    SPEED-Bench); None where it has none."""
    if not isinstance(row, dict):
        return None
    prompt = row.get("prompt") or row.get("input_ids") or row.get("text")
    turns = row.get("turns")
    if not prompt and isinstance(turns, list) and turns:
        prompt = turns[0]
    return prompt


def is_turn(row):
    """Whether the row's prompt is a user's turn (MT-Bench's, SPEED-Bench's "turns"): the chat template's."""
    return isinstance(row, dict) and not (row.get("prompt") or row.get("input_ids") or row.get("text"))


def chat(prompts, tokenizer):
    """Each user turn (a prompt marked "turn") as the token ids of the verifier's chat template with the
    assistant's turn opened (transformers' apply_chat_template), as the model is asked in a chat; unchanged
    text where the tokenizer has no chat template. Returns how many were templated."""
    turns = [p for p in prompts if p.pop("turn", False)]
    if not turns or not getattr(tokenizer, "chat_template", None):
        return 0
    for p in turns:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        p["prompt"] = [int(x) for x in (ids["input_ids"] if hasattr(ids, "keys") else ids)]
    return len(turns)


def category_of(row, where):
    """The row's "category" (None where it has none); Refused (where: the file and line) when it is not text."""
    cat = row.get("category") if isinstance(row, dict) else None
    if cat is None or cat == "":
        return None
    if not isinstance(cat, str):
        raise Refused(f"{where}: \"category\" is a JSON {type(cat).__name__}: give it as text (such as "
                      f"\"coding\") or leave it out")
    return cat.strip() or None


def grouped(prompts: list) -> list:
    """[(category, [index of each of its prompts])], categories in the order first seen; [] where no
    prompt has a category (the prompts are then sent as they come)."""
    if not any(p.get("category") for p in prompts):
        return []
    out: dict = {}
    for i, p in enumerate(prompts):
        out.setdefault(p.get("category") or NONE, []).append(i)
    return list(out.items())


def first(prompts: list, limit: int) -> list:
    """The first `limit` prompts; where they carry categories, taken from each category in turn (the
    first of each, then the second, ...: MT-Bench's file holds its categories one after another, and
    every category is then measured), kept in the file's order."""
    groups = grouped(prompts)
    if not groups or limit >= len(prompts):
        return prompts[:limit]
    picked: list = []
    for k in range(max(len(idx) for _, idx in groups)):
        picked += [idx[k] for _, idx in groups if k < len(idx)]
    return [prompts[i] for i in sorted(picked[:limit])]


SUMMARY = ("counters", "acceptance_by_position", "conditional_acceptance_by_position", "mean_acceptance_length",
           "draft_acceptance_rate")


def entry(acc, prompts, tokens):
    """One category's figures: its acceptance (counters.acceptance() of the counters before and after its
    prompts), how many prompts and generated tokens."""
    return {"prompts": prompts, "generated_tokens": tokens, **{k: acc[k] for k in SUMMARY if k in acc}}
