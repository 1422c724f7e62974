"""`inv synthesize`'s filters (pure): a candidate's question and answer judged (cut at its cap, empty, looping, a
refusal), and candidate i's request seed."""

import hashlib
import re

REFUSAL = re.compile(r"^\W*(i'?m sorry|i am sorry|sorry,|i apologi[sz]e|i cannot|i can'?t|i can not|i won'?t|"
                     r"i am (?:not able|unable)|i'?m (?:not able|unable)|as an ai|as a language model)", re.I)


# -- the filters (pure) ------------------------------------------------------------------------

def looping(text, n=4, share=0.5, least=12):
    """Repeated n-grams: of a text's word n-grams (character 3n-grams where it has few spaces: a
    language written without them), under `share` distinct (a greedy loop repeats one phrase to the
    cap); a text with fewer than `least` n-grams never loops."""
    u = text.split()
    if len(u) * 12 < len(text):
        u, n = list("".join(u)), 3 * n
    grams = [tuple(u[i:i + n]) for i in range(len(u) - n + 1)]
    return len(grams) >= least and len(set(grams)) < share * len(grams)


def refusal(text):
    return bool(REFUSAL.match(text.strip()[:200]))


def seed_of(seed, i):  # (candidate i's request seed: a 31-bit hash of (seed, i))
    return int.from_bytes(hashlib.sha256(f"{seed}/{i}".encode()).digest()[:4], "big") >> 1


def judge_question(text, finish):
    return "empty" if not text.strip() else "looping" if looping(text) else ("question_cut" if finish == "length"
                                                                             else None)


def judge_answer(text, finish):
    why = judge_question(text, finish)
    return "answer_cut" if why == "question_cut" else why or ("refusal" if refusal(text) else None)
