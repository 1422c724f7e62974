"""Inspect extracted training data against a schema contract, in seconds.

Launch (what `inv inspect-data` sends, from the host workdir):
    <venv>/bin/python3 remote/inspect_data.py --path data/DIR [--sample 8] \
        [--verifier /models/V] [--layers 4]

Every hidden-states file is checked from its safetensors header alone (keys, dtypes, shapes,
size vs the header: truncation); --sample N files are loaded fully (NaN/Inf, all-zero
states, token_ids == the row's input_ids, loss-mask sum, seq_len). Contract: hidden size and
stored-layer count against the verifier config (and the extraction record), every dataset
row has its file, one dtype throughout. One payload: summary, per-key table, violations.
"""

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from contract import emit
from datafmt import (RECORD, HeaderError, detect, hs_files, read_arrow_columns, safetensors_header,
                     verifier_config)

MAX_LISTED = 20


class Report:
    def __init__(self):
        self.violations = []
        self.warnings = []

    def bad(self, where, what):
        self.violations.append({"file": str(where), "what": what})

    def warn(self, where, what):
        self.warnings.append({"file": str(where), "what": what})


def shape_str(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


def inspect_speculators(root, rep, sample, verifier, layers):
    t0 = time.time()
    ds = read_arrow_columns(root, ["seq_len", "loss_mask", "input_ids"] if sample else ["seq_len"])
    n_rows = ds["_num_rows"]
    cols = ds["_columns"]
    for need in ("input_ids", "loss_mask", "seq_len"):
        if need not in cols:
            rep.bad(root, f"dataset has no column {need!r} (columns: {sorted(cols)})")
    seq_lens = ds.get("seq_len") or []
    files = hs_files(root)
    if not files:
        rep.bad(Path(root) / "hidden_states", "no hidden_states/hs_{i}.safetensors files: run `inv extract`")
    missing = [i for i in range(n_rows) if i not in files]
    if missing:
        shown = ", ".join(f"hs_{i}.safetensors" for i in missing[:10])
        rep.bad(Path(root) / "hidden_states", f"{len(missing)} dataset row(s) have no file: {shown}"
                + (" ..." if len(missing) > 10 else "") + " (resume with `inv extract`)")
    extra = sorted(i for i in files if i >= n_rows)
    if extra:
        rep.warn(Path(root) / "hidden_states", f"{len(extra)} file(s) beyond the dataset's {n_rows} rows "
                 f"(e.g. hs_{extra[0]}.safetensors)")

    keys = {}  # key -> Counter of (dtype, shape pattern)
    dtypes = Counter()
    n_layers_seen, hidden_seen = Counter(), Counter()
    total_bytes = 0
    tokens = 0
    for i, p in sorted(files.items()):
        try:
            hdr, meta, expect = safetensors_header(p)
        except (HeaderError, OSError) as e:
            rep.bad(p, f"unreadable: {e}")
            continue
        size = p.stat().st_size
        total_bytes += size
        if size < expect:
            rep.bad(p, f"truncated: {size} bytes, header says {expect}")
            continue
        for k, v in hdr.items():
            keys.setdefault(k, Counter())[(v["dtype"], len(v["shape"]))] += 1
        hs, tid = hdr.get("hidden_states"), hdr.get("token_ids")
        if hs is None or tid is None:
            rep.bad(p, f"keys {sorted(hdr)}; expected hidden_states and token_ids")
            continue
        dtypes[hs["dtype"]] += 1
        if len(hs["shape"]) != 3:
            rep.bad(p, f"hidden_states shape {shape_str(hs['shape'])}; expected [seq, n_layers, hidden]")
            continue
        seq, nl, hid = hs["shape"]
        tokens += seq
        n_layers_seen[nl] += 1
        hidden_seen[hid] += 1
        if tid["dtype"] != "I64" or tid["shape"] != [seq]:
            rep.bad(p, f"token_ids {tid['dtype']} {shape_str(tid['shape'])}; expected I64 [{seq}]")
        if i < len(seq_lens) and seq_lens[i] is not None and seq != seq_lens[i]:
            rep.bad(p, f"{seq} positions but dataset row {i} has seq_len {seq_lens[i]}")
    if len(dtypes) > 1:
        rep.bad(Path(root) / "hidden_states", f"mixed dtypes: {dict(dtypes)}; one dtype throughout is required")
    elif dtypes and "BF16" not in dtypes:
        rep.bad(Path(root) / "hidden_states", f"dtype {next(iter(dtypes))}; speculators expects BF16")
    if len(n_layers_seen) > 1:
        rep.bad(Path(root) / "hidden_states", f"files disagree on the stored-layer count: {dict(n_layers_seen)}")
    if len(hidden_seen) > 1:
        rep.bad(Path(root) / "hidden_states", f"files disagree on the hidden size: {dict(hidden_seen)}")
    hid = hidden_seen.most_common(1)[0][0] if hidden_seen else None
    nl = n_layers_seen.most_common(1)[0][0] if n_layers_seen else None
    if verifier and hid is not None:
        vh, vl = verifier
        if hid != vh:
            odd = [str(files[i].name) for i in sorted(files)][:3]
            rep.bad(Path(root) / "hidden_states", f"hidden size {hid} but the verifier's hidden_size is {vh} "
                    f"(e.g. {', '.join(odd)}): data from another model?")
    if layers is not None and nl is not None and nl != layers:
        rep.bad(Path(root) / "hidden_states", f"{nl} stored layers per position, expected {layers} "
                f"(layer ids + the final slot)")
    header_s = time.time() - t0

    # Full loads of a sample.
    sampled = []
    if sample and files:
        import torch
        from safetensors.torch import load_file

        rng = random.Random(0)
        ids = [i for i in sorted(files) if i < n_rows]
        picks = sorted(rng.sample(ids, min(sample, len(ids))))
        for i in picks:
            p = files[i]
            try:
                t = load_file(str(p))
            except Exception as e:  # noqa: BLE001
                rep.bad(p, f"cannot load: {type(e).__name__}: {str(e)[:200]}")
                continue
            hs, tid = t.get("hidden_states"), t.get("token_ids")
            if hs is None or tid is None:
                continue
            if not bool(torch.isfinite(hs).all()):  # counts only when something is wrong
                n_nan, n_inf = int(torch.isnan(hs).sum()), int(torch.isinf(hs).sum())
                rep.bad(p, f"{n_nan} NaN and {n_inf} Inf values in hidden_states")
            absval = hs.abs()
            if hs.ndim == 3:
                peak = absval.amax(dim=(0, 2))  # one pass: per stored layer
                zero_layers = [k for k in range(hs.shape[1]) if float(peak[k]) == 0.0]
                if zero_layers:
                    rep.bad(p, f"hidden_states all zero in stored layer(s) {zero_layers}")
            ids_row = ds.get("input_ids", [None] * n_rows)[i]
            if ids_row is not None:
                if len(ids_row) != tid.numel() or tid.tolist() != list(ids_row):
                    first = next((k for k, (a, b) in enumerate(zip(tid.tolist(), ids_row)) if a != b), None)
                    rep.bad(p, f"token_ids differ from dataset row {i} input_ids (lengths {tid.numel()} vs "
                            f"{len(ids_row)}, first difference at position {first})")
            lm = ds.get("loss_mask", [None] * n_rows)[i]
            lm_sum = int(sum(lm)) if lm is not None else None
            if lm is not None and lm_sum == 0:
                rep.warn(p, f"row {i} has an all-zero loss_mask: it trains nothing")
            sampled.append({"row": i, "file": p.name, "seq": int(tid.numel()), "loss_mask_sum": lm_sum,
                            "abs_mean": round(float(absval.float().mean()), 5)})
    table = [{"key": k, "dtype": dt, "ndim": nd, "files": c} for k, cnt in sorted(keys.items())
             for (dt, nd), c in sorted(cnt.items())]
    return {
        "rows": n_rows, "columns": cols, "files": len(files), "bytes": total_bytes, "tokens": tokens,
        "hidden_size": hid, "stored_layers": nl, "dtypes": dict(dtypes), "keys": table,
        "sampled": sampled, "header_seconds": round(header_s, 3),
    }


def inspect_torch_files(root, rep, sample, pattern, kind):
    """Legacy v0.3 and SpecForge: torch files, read lazily (mmap, weights only)."""
    import torch

    files = sorted(Path(root).glob(pattern))
    keys = {}
    total = 0
    picks = files if not sample else files[: max(sample, 1)]
    for p in files:
        total += p.stat().st_size
    for p in picks:
        try:
            obj = torch.load(p, map_location="cpu", mmap=True, weights_only=True)
        except Exception as e:  # noqa: BLE001
            rep.bad(p, f"cannot load: {type(e).__name__}: {str(e)[:200]}")
            continue
        for k, v in obj.items():
            if isinstance(v, (list, tuple)):
                desc = f"list[{len(v)}] of " + (f"{v[0].dtype} {shape_str(v[0].shape)}" if v and hasattr(v[0], "shape") else "?")
            elif hasattr(v, "shape"):
                desc = f"{v.dtype} {shape_str(v.shape)}"
            else:
                desc = type(v).__name__
            keys.setdefault(k, Counter())[desc.split(" [")[0] if "[" in desc and not desc.startswith("list") else desc] += 1
    table = [{"key": k, "dtype": d, "ndim": "", "files": c} for k, cnt in sorted(keys.items()) for d, c in cnt.items()]
    hint = ("speculators 0.9 cannot read this layout: `inv convert-data --src DIR --dst NEW`"
            if kind == "legacy-v0.3" else "a SpecForge layout: speculators 0.9 does not read it")
    rep.bad(root, f"format {kind}: {hint}")
    return {"files": len(files), "bytes": total, "keys": table, "sampled": [p.name for p in picks]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--path", required=True)
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--verifier", default=None)
    ap.add_argument("--layers", type=int, default=None)
    a = ap.parse_args()
    t0 = time.time()
    root = Path(a.path)
    rep = Report()
    fmt = detect(root)
    record = {}
    if (root / RECORD).is_file():
        record = json.loads((root / RECORD).read_text())
    verifier_path = a.verifier or record.get("verifier")
    verifier = verifier_config(verifier_path) if verifier_path else None
    if verifier_path and verifier is None:
        rep.warn(verifier_path, "no config.json there: hidden size not checked against the verifier")
    layers = a.layers
    if layers is None:
        layers = record.get("stored_layers") or (len(record["layer_ids"]) if record.get("layer_ids") else None)
    summary = {}
    if fmt is None:
        what = "does not exist" if not root.exists() else "holds no recognised format"
        rep.bad(root, f"{what}: expected a speculators 0.9 dataset (state.json, data-*.arrow, hidden_states/), "
                f"legacy v0.3 rows_*/data_*.pt or SpecForge data_*.ckpt")
    elif fmt == "speculators-0.9":
        summary = inspect_speculators(root, rep, a.sample, verifier, layers)
    elif fmt == "legacy-v0.3":
        summary = inspect_torch_files(root, rep, a.sample, "rows_*/data_*.pt", fmt)
    else:
        summary = inspect_torch_files(root, rep, a.sample, "**/data_*.ckpt", fmt)
    ok = not rep.violations
    emit({
        "ok": ok, "path": str(root.resolve()) if root.exists() else str(root), "format": fmt,
        "verifier": verifier_path, "verifier_hidden_size": verifier[0] if verifier else None,
        "expected_layers": layers, "record": record, **summary,
        "violations": rep.violations[:200], "n_violations": len(rep.violations), "warnings": rep.warnings[:50],
        "seconds": round(time.time() - t0, 3),
    })
    return 0 if ok else 1


if __name__ == "__main__":
    import contract

    contract.main(main)
