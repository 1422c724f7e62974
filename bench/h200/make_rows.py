"""Pre-tokenised rows (input_ids + loss_mask; `inv prepare-data` needs no vLLM render server for
them): N rows of L random token ids in the Llama-3 text range, the first quarter masked out.

    python3 bench/h200/make_rows.py OUT.jsonl [--rows 256] [--tokens 1024]
"""

import argparse
import json
import random

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--rows", type=int, default=256)
ap.add_argument("--tokens", type=int, default=1024)
ap.add_argument("--vocab", type=int, default=128000, help="ids drawn from [0, vocab)")
a = ap.parse_args()
rng = random.Random(0)
with open(a.out, "w") as f:
    for _ in range(a.rows):
        ids = [min(128000, a.vocab - 1)] + [rng.randrange(0, a.vocab) for _ in range(a.tokens - 1)]
        f.write(json.dumps({"input_ids": ids,
                            "loss_mask": [0] * (a.tokens // 4) + [1] * (a.tokens - a.tokens // 4)}) + "\n")
print(f"{a.rows} rows x {a.tokens} tokens -> {a.out}")
