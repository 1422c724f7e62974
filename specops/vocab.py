"""The draft's vocabulary sized to the data (`draft-vocab-size: auto`), and the line that says it.

speculators builds the draft vocabulary from the dataset's token_freq.pt (prepare-data's count of
the answer tokens, loss_mask 1): the N most frequent. A draft vocabulary far above the tokens the
data holds only slows training: on SmolLM2 answers holding 4,262 distinct tokens a 4,096-token
draft vocabulary trained 4-12x faster than 32,000 on a CPU. auto: the distinct tokens rounded up to
a multiple of ROUND, at most CAP and the verifier's vocabulary; a number (the config's, or
--draft-vocab-size) is taken as given."""

from __future__ import annotations

import io
import pickle
import zipfile
from typing import Optional

AUTO = "auto"
CAP = 32000
ROUND = 64


class _Plain(pickle.Unpickler):
    """token_freq.pt is torch.save of a dict of ints: plain pickle opcodes; anything else is refused."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name}: not a plain dict of token counts")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("a tensor: not a plain dict of token counts")


def distinct_tokens(raw: Optional[bytes]) -> Optional[int]:
    """How many distinct tokens a token_freq.pt counts (None: no file, or not a dict of counts)."""
    if not raw:
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            name = next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            freq = _Plain(io.BytesIO(z.read(name))).load()
    except (zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError, KeyError):
        return None
    if not isinstance(freq, dict):
        return None
    return sum(1 for v in freq.values() if isinstance(v, int) and v > 0)


def choose(setting, distinct: Optional[int], verifier_vocab: Optional[int], where: str) -> tuple[Optional[int], str]:
    """(the draft vocabulary size, the one line that says it). setting: the config's draft-vocab-size
    (a number, AUTO, or None: speculators' own, the verifier's whole vocabulary); where: who set it."""
    held = f"the data holds {distinct:,} distinct answer tokens" if distinct else "the data's distinct tokens unknown"
    if setting is None:
        return None, (f"draft vocabulary: the verifier's whole vocabulary ({where} sets no draft-vocab-size; "
                      f"{held}; `draft-vocab-size: auto` sizes it to them)")
    if setting != AUTO:
        n = int(setting)
        more = (f"; {held}: `--draft-vocab-size auto` sizes it to them (a smaller draft vocabulary trains faster)"
                if distinct and n > 2 * distinct else "")
        return n, f"draft vocabulary: {n:,} tokens ({where}){more}"
    if not distinct:
        n = min(CAP, verifier_vocab or CAP)
        return n, (f"draft vocabulary: {n:,} tokens (auto: no token counts in the dataset (token_freq.pt), so the cap "
                   f"{CAP:,}; {where})")
    n = min(-(-distinct // ROUND) * ROUND, CAP, verifier_vocab or CAP)
    return n, (f"draft vocabulary: {n:,} tokens (auto: {held}, rounded up to {ROUND}, at most {CAP:,}; {where}; "
               f"a number there or --draft-vocab-size N sets it)")
