"""Convert legacy speculators v0.3 data (rows_*/data_*.pt) to the speculators 0.9 layout.

Launch (what `inv convert-data` sends, from the host workdir):
    <venv>/bin/python3 remote/convert_data.py --src OLD_DIR --dst NEW_DIR

Each data_{i}.pt ({input_ids, hidden_states: list of [seq, hidden], loss_mask}) becomes
hidden_states/hs_{k}.safetensors (hidden_states bf16 [seq, n_layers, hidden], token_ids int64)
and row k of an Arrow dataset (input_ids, loss_mask, seq_len), k in (rows range, file index)
order. NEW_DIR must not exist or be empty: nothing is overwritten.
"""

import argparse
import json
import re
import sys
import time
from pathlib import Path

from contract import emit
from datafmt import RECORD

ROWS = re.compile(r"^rows_(\d+)")
DATA = re.compile(r"^data_(\d+)\.pt$")


def order(p):
    m, d = ROWS.match(p.parent.name), DATA.match(p.name)
    return (int(m.group(1)) if m else 0, int(d.group(1)) if d else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True)
    ap.add_argument("--dst", required=True)
    a = ap.parse_args()
    src, dst = Path(a.src), Path(a.dst)
    files = sorted(src.glob("rows_*/data_*.pt"), key=order)
    if not files:
        emit({"ok": False, "error": f"{src}: no rows_*/data_*.pt files: not a legacy v0.3 layout"})
        return 1
    if dst.exists() and any(dst.iterdir()):
        emit({"ok": False, "error": f"{dst} exists and is not empty: give a new --dst (nothing is overwritten)"})
        return 1

    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    t0 = time.time()
    (dst / "hidden_states").mkdir(parents=True, exist_ok=True)
    cols = {"input_ids": [], "loss_mask": [], "seq_len": []}
    n_layers = None
    for k, p in enumerate(files):
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True)
            ids = obj["input_ids"].reshape(-1).to(torch.int64)
            hs = obj["hidden_states"]
            hs = torch.stack(list(hs), dim=1) if isinstance(hs, (list, tuple)) else hs
            mask = obj["loss_mask"].reshape(-1).to(torch.int64)
        except Exception as e:  # noqa: BLE001
            emit({"ok": False, "error": f"{p}: cannot convert: {type(e).__name__}: {str(e)[:200]}",
                  "converted": k})
            return 1
        if hs.shape[0] != ids.numel() or mask.numel() != ids.numel():
            emit({"ok": False, "error": f"{p}: lengths disagree (input_ids {ids.numel()}, hidden_states "
                  f"{hs.shape[0]}, loss_mask {mask.numel()})", "converted": k})
            return 1
        n_layers = hs.shape[1]
        save_file({"hidden_states": hs.to(torch.bfloat16).contiguous(), "token_ids": ids.contiguous()},
                  str(dst / "hidden_states" / f"hs_{k}.safetensors"))
        cols["input_ids"].append(ids.tolist())
        cols["loss_mask"].append(mask.tolist())
        cols["seq_len"].append(ids.numel())
    Dataset.from_dict(cols).save_to_disk(str(dst))
    record = {"converted_from": str(src.resolve()), "format": "legacy-v0.3", "stored_layers": n_layers}
    cfg = src / "data_config.json"
    if cfg.is_file():
        legacy = json.loads(cfg.read_text())
        (dst / "legacy_data_config.json").write_text(json.dumps(legacy, indent=1))
        for key in ("layer_ids", "eagle_aux_hidden_state_layer_ids"):
            if isinstance(legacy.get(key), list):
                record["layer_ids"] = legacy[key]
        for key in ("verifier", "model", "base_model", "verifier_name_or_path"):
            if isinstance(legacy.get(key), str) and Path(legacy[key]).is_dir():
                record["verifier"] = legacy[key]
    (dst / RECORD).write_text(json.dumps(record, indent=1))
    emit({"ok": True, "rows": len(files), "dst": str(dst.resolve()), "seconds": round(time.time() - t0, 2)})
    return 0


if __name__ == "__main__":
    import contract

    contract.main(main)
