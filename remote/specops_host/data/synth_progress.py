"""synthesize's files: the progress file a run appends each candidate judged to, read back to resume, and
the finished output (remote/specops_host/data/synthesize.py drives the run).

The progress file, beside the output (synthesized/.NAME.jsonl.partial), one JSON object a line:
    {"settings": {...}}                                    (the first line: what decides the rows)
    {"i": 17, "row": {"id": "synth-0-17", ...}}            (candidate 17 passed the filters)
    {"i": 18, "dropped": "looping"}                        (dropped: the question)
    {"i": 19, "dropped": "refusal", "q": "..."}            (dropped: the answer; its question still counts for dedup)
A duplicate is decided in candidate order when the run settles, so the drop counts come out as an uninterrupted
run's; a failed request ("error") is not written (it is asked again). Each line is flushed as it is written (a
killed process loses nothing written), fsync'd every few seconds (a dropped machine: those seconds at most); a
last line cut mid-write is ignored, and cut off before the file is appended to again."""

import hashlib
import json
import os
import time
from pathlib import Path

from specops_host.contract import Refused

DROPS = ("question_cut", "answer_cut", "empty", "looping", "refusal", "duplicate", "error")
#: what decides candidate i's rows: resuming with another value of any of them would mix two runs' rows
DECIDES = {"verifier": "--verifier", "seed": "--seed", "topics": "--topics", "seed_prompts": "--seed-prompts",
           "question_sampling": "--question-temperature", "answer_sampling": "--answer-temperature",
           "question_tokens": "--question-tokens", "max_tokens": "--max-tokens"}
LATER = "later"  # (a --topics / --seed-prompts file the laptop uploads after its plan: compared on the host)


def path_of(out):
    """synthesized/.NAME.jsonl.partial beside synthesized/NAME.jsonl."""
    out = Path(out)
    return out.with_name(f".{out.name}.partial")


def digest(path):
    """A file's identity for the header (its contents, not its name: an upload's host path may differ)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def settings(a, info):
    """The header's settings of a run (a synthesize argparse namespace and its plan's info)."""
    def file_id(path, later):
        return None if not path else LATER if later and not Path(path).exists() else digest(path)

    return {"verifier": info["verifier"], "seed": a.seed, "topics": file_id(a.topics, a.topics_later),
            "seed_prompts": file_id(a.seed_prompts, a.seed_prompts_later),
            "question_sampling": info["question_sampling"], "answer_sampling": info["answer_sampling"],
            "question_tokens": a.question_tokens, "max_tokens": a.max_tokens}


def differences(had, now):
    """The settings that differ, as '--flag A (now B)' (a file given later than its plan: not compared)."""
    out = []
    for key, flag in DECIDES.items():
        x, y = had.get(key), now.get(key)
        if x != y and LATER not in (x, y):
            what = "another file" if key in ("topics", "seed_prompts") and x and y else f"{shown(x)} (now {shown(y)})"
            out.append(f"{flag} {what}")
    return out


def resumable(a, info, seen=()):
    """What the progress file beside --out holds ({file, rows, judged}; None: none, or --overwrite starts over),
    refused where an earlier run wrote it with other settings (the rows would mix two runs'). seen: the seed
    prompts, normalized (a question copying one is a duplicate)."""
    p = path_of(info["out"])
    if a.overwrite or not p.exists():
        return None
    try:
        head, done, _ = read(p)
    except (OSError, ValueError) as e:
        raise Refused(f"cannot resume from {e}: --overwrite to start over") from None
    diff = differences(head, settings(a, info))
    if diff:
        raise Refused(f"{p} (an earlier run's progress on --out {Path(a.out).stem}) has other settings: "
                      f"{'; '.join(diff)}: give its settings to resume, or --overwrite to start over")
    kept, _ = settle(done, seen, a.rows)
    return {"file": p.name, "rows": len(kept), "judged": len(done)}


def shown(v):
    return "none" if v is None else v if isinstance(v, (str, int)) else json.dumps(v, separators=(",", ":"))


def parse(data):
    """(header settings, {i: (question, why the question was dropped, answer, why the answer was dropped)},
    the bytes that hold whole lines) of a progress file's bytes; a last line cut mid-write is left out.
    ValueError: no header, or a line other than the last that is not one of the file's objects."""
    lines, done, good, head = data.split(b"\n"), {}, 0, None
    for n, raw in enumerate(lines):
        last = n == len(lines) - 1  # (after the final newline: b"" or a line cut mid-write)
        try:
            x = json.loads(raw)
            if head is None:
                head = x["settings"]
                if not isinstance(head, dict):
                    raise ValueError("its settings are not an object")
            else:
                done[int(x["i"])] = entry(x)
        except (ValueError, KeyError, TypeError) as e:
            if last:
                break
            raise ValueError(f"line {n + 1}: {str(e)[:120] or type(e).__name__}") from None
        if last:  # (a whole object without its newline: cut before the newline; kept, the newline added on append)
            good += len(raw)
            break
        good += len(raw) + 1
    if head is None:
        raise ValueError("no settings line (the first)")
    return head, done, good


def entry(x):
    if "row" in x:
        (u, a), = [x["row"]["conversations"]]
        return u["content"], None, a["content"], None
    why = x["dropped"]
    if why not in DROPS:
        raise ValueError(f"dropped {why!r}: not one of {', '.join(DROPS)}")
    q = x.get("q")
    return (q, None, None, why) if q is not None else (None, why, None, None)


def read(path):
    """parse() of the progress file at path; ValueError names the file."""
    try:
        return parse(Path(path).read_bytes())
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def settle(done, seen=(), rows=None):
    """The candidates kept, in candidate order, and the drops of the candidates done ({i: (q, qwhy, ans, awhy)}):
    a question seen before (or in `seen`, normalized) is a duplicate; the first `rows` kept (all: None)."""
    seen, kept, drops = set(seen), [], dict.fromkeys(DROPS, 0)
    for i in sorted(done):
        q, qwhy, _, awhy = done[i]
        if qwhy is None and normal(q) in seen:
            qwhy = "duplicate"
        elif qwhy is None:
            seen.add(normal(q))
        why = qwhy or awhy
        if why:
            drops[why] += 1
        elif rows is None or len(kept) < rows:
            kept.append(i)
    return kept, drops


def normal(text):  # (a question as dedup compares it: case, spacing and end punctuation aside)
    return " ".join(text.lower().split()).strip(" .?!")


class Progress:
    """The progress file, appended to: open() writes the header when new, cuts a torn last line off."""

    def __init__(self, path, head, whole=None, sync_s=5.0):
        self.path, self.sync_s, self.synced = Path(path), sync_s, time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = whole is None
        self.f = open(self.path, "wb" if new else "r+b")
        if new:
            self.write({"settings": head})
        else:
            self.f.seek(whole)
            self.f.truncate()  # (a line cut mid-write: gone before the next is appended)
            if whole and not self.path.read_bytes()[:whole].endswith(b"\n"):
                self.f.write(b"\n")
        self.sync(force=True)

    def write(self, x):
        self.f.write(json.dumps(x, ensure_ascii=False).encode() + b"\n")
        self.f.flush()  # (a killed process: the OS has it)

    def add(self, i, q, qwhy, ans, awhy, row=None):
        why = qwhy or awhy
        if why == "error":
            return  # (a failed request: asked again on resuming)
        x = ({"i": i, "row": row} if not why else
             {"i": i, "dropped": why, **({"q": q} if qwhy is None else {})})
        self.write(x)
        self.sync()

    def sync(self, force=False):
        if force or time.time() - self.synced >= self.sync_s:
            self.f.flush()
            os.fsync(self.f.fileno())
            self.synced = time.time()

    def close(self):
        if not self.f.closed:
            self.sync(force=True)
            self.f.close()


def publish(rows, dst):
    """The rows into dst whole: a temp file beside it, then a rename; the progress file removed then."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, dst)
    path_of(dst).unlink(missing_ok=True)
