"""A seeded, low-entropy synthetic language: what the learnable verifier is trained on and what
the demo's conversations are written in (stdlib only: the host's learnable_verifier.py imports
it, and the laptop loads the same file from the repo, so both sides speak one language).

Not run by itself (no launch command): `import synthlang` (host, from remote/), or
`specops.pipeline.synthlang()` (laptop).

The language: WORDS (32 plain words) and a seeded cyclic "text" LOOP of LOOP_LEN words in which
no two consecutive words come twice. The word after `a b` is `next_word(a, b)` with probability
P_NEXT, otherwise any word (uniformly): where `a b` occurs in LOOP, the word after it there;
elsewhere, the word after one of b's places in LOOP (chosen by a). A second-order Markov source:
every word appears about ten times in LOOP, with as many different followers, so the current
word alone does not tell the next one, the word before it does. A conversation: the user gives a
few words of a chain, the assistant goes on with it (RESPONSE_WORDS words) and ends its turn.
So:

- a model that learnt the language answers greedily along LOOP (`rule_agreement` measures that
  on any text): its greedy continuation is predictable, never a short cycle, and an EAGLE-3
  draft can learn to predict it;
- the draft's first guess needs the word before the current one, which it reads from the
  verifier's hidden states (fed zeros or other positions' states, its accuracy falls from 0.9
  to 0.16).
"""

import hashlib
import json
import random

SEED = 15
P_NEXT = 0.9
LOOP_LEN = 320
PROMPT_WORDS = (4, 10)
RESPONSE_WORDS = (40, 80)
SYSTEM = "You go on with the chain."

WORDS = (
    "stone moss cloud rain wind leaf root seed bird fish sand salt fire ash smoke glass "
    "iron gold bell drum song road gate wall tower bridge boat sail star moon sun snow"
).split()


def _build():
    rng = random.Random(SEED)
    while True:  # a cyclic sequence whose consecutive pairs are all distinct (and no "w w")
        loop, used = [rng.choice(WORDS)], set()
        while len(loop) < LOOP_LEN:
            options = [w for w in WORDS if w != loop[-1] and (loop[-1], w) not in used]
            if not options:
                break
            w = rng.choice(options)
            used.add((loop[-1], w))
            loop.append(w)
        if len(loop) == LOOP_LEN and loop[-1] != loop[0] and (loop[-1], loop[0]) not in used \
                and set(loop) == set(WORDS):
            break
    follow = {(loop[i], loop[(i + 1) % LOOP_LEN]): loop[(i + 2) % LOOP_LEN] for i in range(LOOP_LEN)}
    places = {w: [loop[(i + 1) % LOOP_LEN] for i in range(LOOP_LEN) if loop[i] == w] for w in WORDS}
    return loop, follow, places


LOOP, FOLLOW, PLACES = _build()
_INDEX = {w: i for i, w in enumerate(WORDS)}


def describe() -> dict:
    """The language's parameters and a fingerprint of its tables (a model records it: a model
    built from another synthlang.py shows another fingerprint)."""
    spec = {"seed": SEED, "p_next": P_NEXT, "loop": LOOP_LEN, "words": len(WORDS),
            "prompt_words": list(PROMPT_WORDS), "response_words": list(RESPONSE_WORDS)}
    blob = json.dumps({"spec": spec, "loop": LOOP, "words": WORDS, "system": SYSTEM}).encode()
    return {**spec, "fingerprint": hashlib.sha256(blob).hexdigest()[:16]}


def next_word(a: str, b: str) -> str:
    """The rule: the most likely word after `a b`."""
    got = FOLLOW.get((a, b))
    if got is None:
        options = PLACES[b]
        got = options[(7 * _INDEX[a] + _INDEX[b]) % len(options)]
    return got


def chain(rng: random.Random, a: str, b: str, n: int) -> list:
    """n words after `a b`, sampled (P_NEXT the rule's word, else uniform)."""
    out = []
    for _ in range(n):
        a, b = b, (next_word(a, b) if rng.random() < P_NEXT else rng.choice(WORDS))
        out.append(b)
    return out


def oracle_continuation(a: str, b: str, n: int) -> list:
    """What a model that learnt the language says greedily after `a b`."""
    out = []
    for _ in range(n):
        a, b = b, next_word(a, b)
        out.append(b)
    return out


def rule_agreement(words: list) -> tuple:
    """(words that follow the rule from the two before them, words judged) in a word list."""
    words = [w for w in words if w in _INDEX]
    ok = sum(next_word(a, b) == c for a, b, c in zip(words, words[1:], words[2:]))
    return ok, max(len(words) - 2, 0)


def conversation(rng: random.Random, *, system: bool = False, turns: int = 1) -> list:
    """[{"role", "content"}, ...]: the user starts a chain, the assistant goes on with it."""
    msgs = [{"role": "system", "content": SYSTEM}] if system else []
    i = rng.randrange(LOOP_LEN)
    a, b = LOOP[i], LOOP[(i + 1) % LOOP_LEN]
    for _ in range(turns):
        words = [a, b] + chain(rng, a, b, rng.randint(*PROMPT_WORDS) - 2)
        msgs.append({"role": "user", "content": " ".join(words)})
        answer = chain(rng, words[-2], words[-1], rng.randint(*RESPONSE_WORDS))
        msgs.append({"role": "assistant", "content": " ".join(answer)})
        a, b = answer[-2], answer[-1]
    return msgs


def conversations(n: int, seed: int) -> list:
    """n conversations (a quarter with a system turn, a third with two turns), seeded."""
    rng = random.Random(seed)
    return [conversation(rng, system=i % 4 == 0, turns=2 if i % 3 == 0 else 1) for i in range(n)]


def tokenizer_corpus(n: int = 2000, seed: int = 1) -> list:
    """Text the BPE tokenizer is trained on: the language's turns and the roles. (No "\n\n"
    line: without that merge, the template's "\n\n" before an answer is the same two tokens
    whether the answer follows or not, so a prompt cut there matches the rendered conversation.)"""
    lines = [m["content"] for c in conversations(n, seed) for m in c]
    return lines + ["user", "assistant", "system"] * 50
