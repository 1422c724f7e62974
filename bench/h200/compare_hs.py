"""Two extractions of the same rows compared, file by file (hs_<i>.safetensors): token ids
equal, then per token and layer the relative difference |a - b| / |b| of the hidden states.

    <venv>/bin/python3 bench/h200/compare_hs.py DATA_A DATA_B    # prints one JSON object

Reports the files compared, the median over all tokens and layers (and the worst file's
median), and the share of token-layers more than 5% apart.
"""

import glob
import json
import os
import sys

import torch
from safetensors.torch import load_file

a_dir, b_dir = sys.argv[1], sys.argv[2]
diffs, worst, n, mismatched = [], 0.0, 0, []
for f in sorted(glob.glob(os.path.join(a_dir, "hidden_states", "hs_*.safetensors"))):
    g = os.path.join(b_dir, "hidden_states", os.path.basename(f))
    if not os.path.exists(g):
        mismatched.append(os.path.basename(f) + ": missing in B")
        continue
    a, b = load_file(f), load_file(g)
    if not torch.equal(a["token_ids"], b["token_ids"]) or a["hidden_states"].shape != b["hidden_states"].shape:
        mismatched.append(os.path.basename(f))
        continue
    x, y = a["hidden_states"].float(), b["hidden_states"].float()
    d = ((x - y).norm(dim=-1) / y.norm(dim=-1).clamp_min(1e-6)).flatten()
    diffs.append(d)
    worst = max(worst, float(d.median()))
    n += 1
allv = torch.cat(diffs) if diffs else torch.zeros(0)
print(json.dumps({"files": n, "mismatched": mismatched[:5], "token_layers": int(allv.numel()),
                  "median_relative_difference": float(allv.median()) if n else None,
                  "worst_file_median": worst, "share_over_5pct": float((allv > 0.05).float().mean()) if n else None}))
