"""The verifier's answers as `inv regenerate` asks for them and reads them back: the sampling it
chooses (never vLLM's implicit temperature 1.0), the answers' cap, the answers cut at it or
looping, and the progress line of a run (stdlib only: the plan runs it too).

- sampling: --sampling-params when given; else the verifier's generation_config.json's sampling
  keys (temperature, top_p, top_k, min_p, repetition_penalty), unless it says do_sample false;
  else greedy (temperature 0). Every request carries the chosen keys, so vLLM's own defaults
  (temperature 1.0 for a model without a generation config) never apply.
- cap: --max-tokens when given; else the dataset's --seq-length (prepare-data cuts a row there, so
  a longer answer is never trained on), halved until it fits the server's model length.
- an answer loops when its last half repeats one span of at most LOOP_PERIOD tokens at least
  three times (greedy decoding locks into such a cycle; speculators records no such thing).
"""

import json
import time
from pathlib import Path

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
GREEDY = {"temperature": 0.0}
LOOP_PERIOD = 64
LOOP_MIN = 32  # (an answer shorter than this is never called a loop)


def choose_sampling(verifier, given=None):
    """(the sampling keys every request carries, where they come from: one phrase)."""
    if given:
        return json.loads(given), "--sampling-params"
    path = Path(verifier) / "generation_config.json"
    try:
        gc = json.loads(path.read_text())
    except (OSError, ValueError):
        gc = None
    if not isinstance(gc, dict):
        return dict(GREEDY), "greedy: the verifier has no generation_config.json"
    keys = {k: gc[k] for k in SAMPLING_KEYS if isinstance(gc.get(k), (int, float)) and not isinstance(gc[k], bool)}
    if gc.get("do_sample") is False:
        return dict(GREEDY), "greedy: the verifier's generation_config.json says do_sample false"
    if not keys:
        return dict(GREEDY), "greedy: the verifier's generation_config.json sets no sampling"
    return keys, "the verifier's generation_config.json"


def sampling_line(params, source):
    """One line: what sampling the run uses and why."""
    shown = "greedy (temperature 0)" if params == GREEDY else ", ".join(f"{k} {v}" for k, v in params.items())
    how = "" if source == "--sampling-params" else "; --sampling-params sets another"
    return f"sampling: {shown} ({source}{how})"


def choose_cap(max_tokens, seq_length, model_len):
    """(answer token cap, where it comes from). model_len: the server's (--max-model-len, else the
    verifier's positions), None when unknown."""
    if max_tokens:
        return max_tokens, "--max-tokens"
    cap, why = seq_length, f"--seq-length {seq_length}"
    while model_len and cap >= model_len and cap > 1:
        cap, why = cap // 2, f"--seq-length {seq_length}, halved to fit the model length {model_len}"
    return cap, why


def looping(tokens, period=LOOP_PERIOD, least=LOOP_MIN):
    """Whether an answer's last half is one span of at most `period` tokens repeated 3 times or more."""
    n = len(tokens)
    if n < least:
        return False
    half = n // 2
    for p in range(1, min(period, half // 3) + 1):
        if all(tokens[i] == tokens[i - p] for i in range(n - half + p, n)):
            return True
    return False


class Answers:
    """An output file read as it grows: conversations answered, answers cut at the cap, looping."""

    def __init__(self, path, errors_path):
        self.path, self.errors_path = Path(path), Path(errors_path)
        self.offset, self.rest = 0, b""
        self.conversations, self.rows, self.cut, self.looping = set(), 0, 0, 0
        self.examples = []  # (a looping answer's text tail, for the line that says so)

    def read(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return self
        self.offset += len(chunk)
        *whole, self.rest = (self.rest + chunk).split(b"\n")
        for line in whole:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            self.add(row)
        return self

    def add(self, row):
        self.rows += 1
        self.conversations.add(str(row.get("primary_id") or row.get("id")))
        if (row.get("metadata") or {}).get("finish_reason") == "length":
            self.cut += 1
        ids, mask = row.get("input_ids") or [], row.get("loss_mask") or []
        answer = [t for t, m in zip(ids, mask) if m]
        if looping(answer):
            self.looping += 1

    def errors(self):
        try:
            with open(self.errors_path, "rb") as f:
                return sum(1 for line in f if line.strip())
        except OSError:
            return 0

    def done(self):
        return len(self.conversations) + self.errors()


def progress_line(done, total, seconds):
    """`regenerate: 120 of 305 prompts answered, 2.1/s, ETA 1m 28s` (total None: no ETA)."""
    rate = done / seconds if seconds > 0 else 0.0
    of = f" of {total}" if total else ""
    eta = ""
    if total and rate > 0 and done < total:
        eta = f", ETA {clock((total - done) / rate)}"
    elif total and done >= total:
        eta = f", done in {clock(seconds)}"
    return f"regenerate: {done}{of} prompts answered, {rate:.2f}/s{eta}"


def clock(seconds):
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s}s"


def quality_line(ans, cap):
    """One line of the answers cut at the cap or looping, with what helps; None when none were."""
    if not ans.cut and not ans.looping:
        return None
    return (f"{ans.cut} of {ans.rows} answers cut at the cap ({cap} tokens), {ans.looping} looping (a repeating "
            f"tail): a draft trained on them learns the loop; raise --max-tokens or --seq-length for long answers, "
            f"or give --sampling-params with a repetition_penalty")


def ticker(ans, total, started, every, say, stop):
    """Say the progress line every `every` seconds until stop() (a thread's loop)."""
    last = time.time()
    while not stop():
        time.sleep(0.5)
        if time.time() - last >= every:
            last = time.time()
            say(progress_line(ans.read().done(), total, time.time() - started))
