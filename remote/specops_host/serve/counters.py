"""vLLM's spec-decode counters, read from a server's /metrics, and the acceptance they give: the prompts sent
(greedy), a category's together, the counters read between categories (serve/evaluate.py's acceptance pass; the
draft-serves preflight's too)."""

import json
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from specops_host import contract
from specops_host.serve import categories

METRIC = re.compile(r'^(vllm:spec_decode_[a-z_]+?)(?:_total)?(?:\{([^}]*)\})?\s+([-+\d.eE]+|NaN)$')


def parse_metrics(text: str) -> dict:
    """{"drafts", "draft_tokens", "accepted", "per_pos": {k: n}} summed over engines."""
    out: dict[str, Any] = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "per_pos": {}}
    for line in text.splitlines():
        if line.startswith("#") or "_created" in line:
            continue
        m = METRIC.match(line.strip())
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name == "vllm:spec_decode_num_drafts":
            out["drafts"] += value
        elif name == "vllm:spec_decode_num_draft_tokens":
            out["draft_tokens"] += value
        elif name == "vllm:spec_decode_num_accepted_tokens":
            out["accepted"] += value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                k = int(pos.group(1))
                out["per_pos"][k] = out["per_pos"].get(k, 0.0) + value
    return out


def acceptance(before: dict, after: dict) -> dict:
    d = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
    per_pos = {k: after["per_pos"].get(k, 0.0) - before["per_pos"].get(k, 0.0) for k in sorted(after["per_pos"])}
    drafts = d["drafts"]
    res: dict[str, Any] = {"counters": d, "per_position_accepted": per_pos}
    if drafts > 0:
        res["acceptance_by_position"] = [per_pos[k] / drafts for k in sorted(per_pos)]
        res["conditional_acceptance_by_position"] = [
            (per_pos[k] / per_pos[k - 1] if k and per_pos[k - 1] else (per_pos[k] / drafts if not k else 0.0))
            for k in sorted(per_pos)]
        res["mean_acceptance_length"] = 1 + d["accepted"] / drafts
        res["draft_acceptance_rate"] = d["accepted"] / d["draft_tokens"] if d["draft_tokens"] else None
    return res


def get(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def post(url: str, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def answer(base: str, prompts: list, a, before: dict) -> tuple[int, dict, dict]:
    """Send the prompts (greedy, --max-tokens each), a category's together (--concurrency in flight at most: a
    greedy prompt's drafts and acceptances do not depend on what runs beside it), the counters read between
    categories (by_category): (tokens generated, by_category, the counters after)."""
    groups = categories.grouped(prompts)
    gen_tokens, every, i, by_cat, mark, after = 0, contract.Every(), 0, {}, before, before

    def ask(j):
        return post(f"{base}/v1/completions", {"model": "verifier", "prompt": prompts[j]["prompt"],
                                               "max_tokens": a.max_tokens, "temperature": 0.0})

    with ThreadPoolExecutor(max_workers=a.concurrency) as pool:
        for cat, idx in groups or [(None, range(len(prompts)))]:
            cat_tokens = 0
            for r in pool.map(ask, idx):
                cat_tokens += r.get("usage", {}).get("completion_tokens", 0)
                i += 1
                if every.due() and i < len(prompts):
                    contract.progress(progress_line(i, len(prompts), gen_tokens + cat_tokens, every.elapsed,
                                                    acceptance(before, parse_metrics(get(f"{base}/metrics")))))
            gen_tokens += cat_tokens
            after = settled(base)
            if cat is not None:
                by_cat[cat] = categories.entry(acceptance(mark, after), len(idx), cat_tokens)
            mark = after
    return gen_tokens, by_cat, after


def settled(base: str, wait: float = 1.0) -> dict:
    """The server's counters once a category's last answers are counted: vLLM records a step's stats just after it
    hands back the step's outputs, so read 0.2 s after the last answer, then until two reads 0.1 s apart agree (at
    most `wait` s in all)."""
    time.sleep(0.2)
    now = parse_metrics(get(f"{base}/metrics"))
    for _ in range(int((wait - 0.2) / 0.1)):
        time.sleep(0.1)
        now, last = parse_metrics(get(f"{base}/metrics")), now
        if now == last:
            break
    return now


def progress_line(done: int, total: int, tokens: int, seconds: float, acc: dict) -> str:
    """evaluate's progress: prompts answered of all, tokens, the mean acceptance length so far."""
    mean = acc.get("mean_acceptance_length")
    return (f"evaluate: {done} of {total} prompts answered ({tokens} tokens, {seconds:.0f}s)"
            + (f"; mean acceptance length so far {mean:.2f}" if mean else ""))
