"""Inspect extracted training data against a schema contract, in seconds.

Launch (what `inv inspect-data` sends, from the host workdir):
    <venv>/bin/python3 -m specops_host.data.inspect_data --path data/DIR [--sample 8] \
        [--verifier /models/V] [--layers 4]

The header pass (stdlib + pyarrow, no torch) validates every hidden-states file from its
safetensors header alone (length, JSON shape, each tensor's dtype / shape / data_offsets, the
offsets tiling the data section: truncation, overlap, gaps), state.json and dataset_info.json
by the fields `datasets.load_from_disk` reads, the Arrow columns (types, lengths vs seq_len),
and specops-data.json (the extraction record) by schema. --sample N files are loaded fully
(NaN/Inf, all-zero states, token_ids == the row's input_ids, loss-mask sum, seq_len).
Contract against the verifier's config.json (read through `text_config` when it wraps one):
hidden size, stored-layer count, the record's layer ids (in [0, num_hidden_layers], the last
equal to it) and hidden size, every token id < vocab_size; every dataset row has its file, one
dtype throughout. One payload: summary, per-key table, violations (one line each, naming the
file and the field). Bad arguments are refused with one line (exit 2).
"""

import argparse
import random
import time
from collections import Counter
from pathlib import Path

from specops_host.contract import Refused, emit
from specops_host.datafmt import RECORD, check_record, check_verifier, detect, hs_files, read_json, short
from specops_host.data.hsfile import check_safetensors, load_tensors
from specops_host.data.inspect_arrow import first_line, read_dataset

MAX_LISTED = 20
USAGE = "--path DIR [--sample N] [--verifier MODEL_DIR] [--layers N]"


class Report:
    def __init__(self):
        self.violations = []
        self.warnings = []

    def bad(self, where, what):
        self.violations.append({"file": str(where), "what": what})

    def warn(self, where, what):
        self.warnings.append({"file": str(where), "what": what})


class Args(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit 2 without a payload
        raise Refused(f"inspect_data.py: {message} (arguments: {USAGE})")


def parse_args(argv=None):
    ap = Args(prog="inspect_data.py")
    ap.add_argument("--path", required=True)
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--seed", type=int, default=None, help="which files are loaded fully (default: a new one each run)")
    ap.add_argument("--verifier", default=None)
    ap.add_argument("--layers", type=int, default=None)
    a = ap.parse_args(argv)
    if not a.path.strip():
        raise Refused("--path is empty: give the data directory on this host")
    if a.sample < 0:
        raise Refused(f"--sample {a.sample}: give how many files to load fully, 0 or more (0 checks headers only)")
    if a.layers is not None and a.layers < 1:
        raise Refused(f"--layers {a.layers}: give the stored layers per position, 1 or more "
                      f"(the layer ids + the final slot)")
    if a.verifier is not None and not a.verifier.strip():
        raise Refused("--verifier is empty: give the verifier model directory on this host, or leave it out")
    return a


def shape_str(shape):
    return "[" + ", ".join(str(s) for s in shape) + "]"


# -- the extraction record and the verifier ---------------------------------------------------

def load_record(root, rep):
    """specops-data.json, validated by schema: the fields of the right type ({} if none)."""
    p = Path(root) / RECORD
    if not p.exists():
        return {}
    if not p.is_file():
        rep.bad(p, "not a regular file: specops' extraction record is a JSON file")
        return {}
    rec, why = read_json(p)
    if why:
        rep.bad(p, why)
        return {}
    clean, problems = check_record(rec)
    for what in problems:
        rep.bad(p, what)
    return clean


def load_verifier(path, rep):
    """The verifier's {hidden_size, num_hidden_layers, vocab_size, text_config, config} (the
    fields that are valid), or None without a readable config.json."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        rep.warn(path, "no config.json there: hidden size, layer ids and token ids not checked against the verifier")
        return None
    cfg, why = read_json(cfg_path)
    if why:
        rep.bad(cfg_path, why)
        return None
    info, problems, warnings = check_verifier(cfg)
    for what in problems:
        rep.bad(cfg_path, what)
    for what in warnings:
        rep.warn(cfg_path, what)
    if info is None:
        return None
    info["config"] = str(cfg_path)
    return info


def vfield(v, key):
    """How a verifier field is named in messages: config.json's key, through text_config if so."""
    return f"{'text_config.' if v.get('text_config') else ''}{key}"


def record_vs_verifier(root, rec, v, rep):
    p = Path(root) / RECORD
    n, ids = v.get("num_hidden_layers"), rec.get("layer_ids")
    if n and ids:
        out = [x for x in ids if x > n]
        if out:
            rep.bad(p, f"layer_ids {short(ids)}: {out[0]} lies outside [0, {n}] ({vfield(v, 'num_hidden_layers')} "
                       f"of {v['config']}): data extracted from another model?")
        elif ids[-1] != n:
            rep.bad(p, f"layer_ids {short(ids)}: the last id must be {n}, {vfield(v, 'num_hidden_layers')} of "
                       f"{v['config']} (the residual stream before the final norm, which EAGLE-3 trains "
                       f"against): data extracted from another model?")
    h = v.get("hidden_size")
    if h and rec.get("hidden_size") is not None and rec["hidden_size"] != h:
        rep.bad(p, f"hidden_size: {rec['hidden_size']} but {vfield(v, 'hidden_size')} of {v['config']} is {h}: "
                   f"data from another model?")



# -- speculators 0.9 --------------------------------------------------------------------------

def inspect_speculators(root, rep, sample, verifier, layers, record, seed=0):
    t0 = time.time()
    root = Path(root)
    v = verifier or {}
    vocab = v.get("vocab_size")
    vname = f"{vfield(v, 'vocab_size')} of {v.get('config')}" if vocab else None
    ds = read_dataset(root, rep, vocab, vname)
    n_rows = ds.rows
    seq_lens = ds.table.column("seq_len").to_pylist() if "seq_len" in ds.ok_columns else []
    hs_dir = root / "hidden_states"
    try:
        files = hs_files(root)
    except OSError as e:
        rep.bad(hs_dir, f"cannot list: {e.strerror or e}")
        files = {}
    if not files:
        rep.bad(hs_dir, "no hidden_states/hs_{i}.safetensors files: run `inv extract`")
    if n_rows is not None:
        missing = [i for i in range(n_rows) if i not in files]
        if missing and files:
            shown = ", ".join(f"hs_{i}.safetensors" for i in missing[:10])
            rep.bad(hs_dir, f"{len(missing)} dataset row(s) have no file: {shown}"
                    + (" ..." if len(missing) > 10 else "") + " (resume with `inv extract`)")
        extra = sorted(i for i in files if i >= n_rows)
        if extra:
            rep.warn(hs_dir, f"{len(extra)} file(s) beyond the dataset's {n_rows} rows "
                     f"(e.g. hs_{extra[0]}.safetensors)")

    keys = {}  # key -> Counter of (dtype, ndim)
    seen = {}  # row -> (dtype, stored layers, hidden) of hidden_states
    total_bytes = 0
    tokens = 0
    broken = set()  # files whose header is not valid: never loaded
    headers = {}  # row -> its file's checked header (check_safetensors)
    for i, p in sorted(files.items()):
        hdr, _meta, _expect, problems = check_safetensors(p)
        try:
            total_bytes += p.stat().st_size
        except OSError:
            pass
        if problems:
            for what in problems:
                rep.bad(p, what)
            broken.add(i)
            continue
        headers[i] = hdr  # (the sample pass reads its tensors by it)
        for k, t in hdr.items():
            keys.setdefault(k, Counter())[(t["dtype"], len(t["shape"]))] += 1
        hs, tid = hdr.get("hidden_states"), hdr.get("token_ids")
        if hs is None or tid is None:
            rep.bad(p, f"keys {short(sorted(hdr))}; expected hidden_states and token_ids")
            continue
        if len(hs["shape"]) != 3:
            rep.bad(p, f"hidden_states shape {shape_str(hs['shape'])}; expected [seq, n_layers, hidden]")
            continue
        seq, nl, hid = hs["shape"]
        seen[i] = (hs["dtype"], nl, hid)
        tokens += seq
        if tid["dtype"] != "I64" or tid["shape"] != [seq]:
            rep.bad(p, f"token_ids {tid['dtype']} {shape_str(tid['shape'])}; expected I64 [{seq}]")
        if i < len(seq_lens) and seq_lens[i] is not None and seq != seq_lens[i]:
            rep.bad(p, f"{seq} positions but dataset row {i} has seq_len {seq_lens[i]}")
    dtypes = Counter(d for d, _, _ in seen.values())
    n_layers_seen = Counter(n for _, n, _ in seen.values())
    hidden_seen = Counter(h for _, _, h in seen.values())
    for k, (counts, what) in enumerate(((dtypes, "mixed dtypes: hidden_states {v} here, {m} in {c} other file(s) "
                                                  "({all}); one dtype throughout is required"),
                                        (n_layers_seen, "files disagree on the stored-layer count: {v} here, {m} in "
                                                        "{c} other file(s) ({all})"),
                                        (hidden_seen, "files disagree on the hidden size: {v} here, {m} in {c} "
                                                      "other file(s) ({all})"))):
        if len(counts) > 1:
            major, c = counts.most_common(1)[0]
            odd = [i for i in sorted(seen) if seen[i][k] != major]
            for i in odd[:10]:
                rep.bad(files[i], what.format(v=seen[i][k], m=major, c=c, all=dict(counts)))
            if len(odd) > 10:
                rep.bad(hs_dir, what.format(v="...", m=major, c=c, all=dict(counts))
                        + f" (+{len(odd) - 10} more files)")
    if dtypes and dtypes.most_common(1)[0][0] != "BF16":
        d, c = dtypes.most_common(1)[0]
        rep.bad(hs_dir, f"hidden_states dtype {d} in {c} file(s); speculators expects BF16")
    hid = hidden_seen.most_common(1)[0][0] if hidden_seen else None
    nl = n_layers_seen.most_common(1)[0][0] if n_layers_seen else None
    vh = v.get("hidden_size")
    if vh and hid is not None and hid != vh:
        odd = [files[i].name for i in sorted(files) if i not in broken][:3]
        rep.bad(hs_dir, f"hidden size {hid} but the verifier's hidden_size is {vh} ({vfield(v, 'hidden_size')} of "
                f"{v['config']}; e.g. {', '.join(odd)}): data from another model?")
    if hid is not None and record.get("hidden_size") is not None and record["hidden_size"] != hid:
        rep.bad(root / RECORD, f"hidden_size: {record['hidden_size']} but the hidden_states files hold {hid}")
    if layers is not None and nl is not None and nl != layers:
        rep.bad(hs_dir, f"{nl} stored layers per position, expected {layers} "
                f"(layer ids + the final slot)")
    header_s = time.time() - t0

    # Full loads of a sample (of the files whose header is valid).
    sampled = []
    ids = [i for i in sorted(files) if i not in broken and (n_rows is None or i < n_rows)]
    if sample and ids:
        import numpy as np

        rng = random.Random(seed)  # (another sample each run unless --seed repeats one: shown in the result)
        picks = sorted(rng.sample(ids, min(sample, len(ids))))
        for i in picks:
            p = files[i]
            try:  # (numpy alone: hsfile.load_tensors, by the header the header pass checked)
                t = load_tensors(p, headers[i], ("hidden_states", "token_ids"))
            except Exception as e:  # noqa: BLE001
                rep.bad(p, f"cannot load: {type(e).__name__}: {first_line(e)}")
                continue
            hs, tid = t.get("hidden_states"), t.get("token_ids")
            if hs is None or tid is None:
                continue
            if not bool(np.isfinite(hs).all()):  # counts only when something is wrong
                n_nan, n_inf = int(np.isnan(hs).sum()), int(np.isinf(hs).sum())
                rep.bad(p, f"{n_nan} NaN and {n_inf} Inf values in hidden_states")
            absval = np.abs(hs)
            if hs.ndim == 3 and hs.size:
                peak = absval.max(axis=(0, 2))  # one pass: per stored layer
                zero_layers = [k for k in range(hs.shape[1]) if float(peak[k]) == 0.0]
                if zero_layers:
                    rep.bad(p, f"hidden_states all zero in stored layer(s) {zero_layers}")
            tl = tid.reshape(-1).tolist()
            if tl:
                bad = next((j for j, x in enumerate(tl) if x < 0 or (vocab and x >= vocab)), None)
                if bad is not None:
                    rng_s = f"[0, {vocab}) ({vname})" if vocab else "[0, ...): token ids are never negative"
                    rep.bad(p, f"token_ids: position {bad} holds token id {tl[bad]}, outside the verifier's "
                               f"vocabulary {rng_s}")
            ids_row = ds.cell("input_ids", i)
            if ids_row is not None:
                if len(ids_row) != len(tl) or tl != list(ids_row):
                    first = next((k for k, (a, b) in enumerate(zip(tl, ids_row)) if a != b), None)
                    rep.bad(p, f"token_ids differ from dataset row {i} input_ids (lengths {len(tl)} vs "
                            f"{len(ids_row)}, first difference at position {first})")
            lm = ds.cell("loss_mask", i)
            lm_sum = int(sum(x for x in lm if x)) if lm is not None else None
            if lm is not None and lm_sum == 0:
                rep.warn(p, f"row {i} has an all-zero loss_mask: it trains nothing")
            sampled.append({"row": i, "file": p.name, "seq": int(tid.size), "loss_mask_sum": lm_sum,
                            "abs_mean": round(float(absval.mean(dtype=np.float32)), 5) if hs.size else 0.0})
    table = [{"key": k, "dtype": dt, "ndim": nd, "files": c} for k, cnt in sorted(keys.items())
             for (dt, nd), c in sorted(cnt.items())]
    cols = {} if ds.table is None else {c: str(ds.table.schema.field(c).type) for c in ds.table.column_names}
    return {
        "rows": n_rows, "columns": cols, "files": len(files), "bytes": total_bytes, "tokens": tokens,
        "hidden_size": hid, "stored_layers": nl, "dtypes": dict(dtypes), "keys": table,
        "input_ids_range": ds.id_range,
        "sampled": sampled, "full_checked": len(sampled), "seed": seed, "header_seconds": round(header_s, 3),
    }


def inspect_torch_files(root, rep, sample, pattern, kind):
    """Legacy v0.3 and SpecForge: torch files, read lazily (mmap, weights only)."""
    import torch

    files = sorted(Path(root).glob(pattern))
    keys = {}
    total = 0
    picks = files if not sample else files[: max(sample, 1)]
    for p in files:
        try:
            total += p.stat().st_size
        except OSError:
            pass
    for p in picks:
        try:
            obj = torch.load(p, map_location="cpu", mmap=True, weights_only=True)
        except Exception as e:  # noqa: BLE001
            rep.bad(p, f"cannot load: {type(e).__name__}: {first_line(e)}")
            continue
        if not isinstance(obj, dict):
            rep.bad(p, f"holds {type(obj).__name__}; expected a dict of tensors")
            continue
        for k, v in obj.items():
            if isinstance(v, (list, tuple)):
                first = f"{v[0].dtype} {shape_str(v[0].shape)}" if v and hasattr(v[0], "shape") else "?"
                desc = f"list[{len(v)}] of {first}"
            elif hasattr(v, "shape"):
                desc = f"{v.dtype} {shape_str(v.shape)}"
            else:
                desc = type(v).__name__
            seen = desc.split(" [")[0] if "[" in desc and not desc.startswith("list") else desc
            keys.setdefault(str(k), Counter())[seen] += 1
    table = [{"key": k, "dtype": d, "ndim": "", "files": c} for k, cnt in sorted(keys.items()) for d, c in cnt.items()]
    hint = ("speculators 0.9 cannot read this layout: `inv convert-data --src DIR --dst NEW`"
            if kind == "legacy-v0.3" else "a SpecForge layout: speculators 0.9 does not read it")
    rep.bad(root, f"format {kind}: {hint}")
    return {"files": len(files), "bytes": total, "keys": table, "sampled": [p.name for p in picks]}


def main(argv=None):
    a = parse_args(argv)
    t0 = time.time()
    root = Path(a.path)
    rep = Report()
    unreadable = False
    try:
        fmt = detect(root)
    except OSError as e:
        rep.bad(root, f"cannot read: {e.strerror or e}")
        fmt, unreadable = None, True
    record = load_record(root, rep) if fmt else {}
    verifier_path = a.verifier or record.get("verifier")
    verifier = load_verifier(verifier_path, rep) if verifier_path else None
    if verifier and record:
        record_vs_verifier(root, record, verifier, rep)
    layers = a.layers
    if layers is None:
        layers = record.get("stored_layers") or (len(record["layer_ids"]) if record.get("layer_ids") else None)
    summary = {}
    if fmt is None:
        if unreadable:
            pass
        elif root.is_file():
            rep.bad(root, "is a file: give the data directory (state.json, data-*.arrow, hidden_states/)")
        else:
            what = "does not exist" if not root.exists() else "holds no recognised format"
            rep.bad(root, f"{what}: expected a speculators 0.9 dataset (state.json, data-*.arrow, hidden_states/), "
                    f"legacy v0.3 rows_*/data_*.pt or SpecForge data_*.ckpt")
    elif fmt == "speculators-0.9":
        seed = a.seed if a.seed is not None else random.SystemRandom().randrange(10**6)
        summary = inspect_speculators(root, rep, a.sample, verifier, layers, record, seed)
    elif fmt == "legacy-v0.3":
        summary = inspect_torch_files(root, rep, a.sample, "rows_*/data_*.pt", fmt)
    else:
        summary = inspect_torch_files(root, rep, a.sample, "**/data_*.ckpt", fmt)
    ok = not rep.violations
    v = verifier or {}
    emit({
        "ok": ok, "path": str(root.resolve()) if root.exists() else str(root), "format": fmt,
        "verifier": verifier_path, "verifier_config": v.get("config"),
        "verifier_text_config": v.get("text_config"), "verifier_hidden_size": v.get("hidden_size"),
        "verifier_num_hidden_layers": v.get("num_hidden_layers"), "verifier_vocab_size": v.get("vocab_size"),
        "expected_layers": layers, "record": record, **summary,
        "violations": rep.violations[:200], "n_violations": len(rep.violations), "warnings": rep.warnings[:50],
        "seconds": round(time.time() - t0, 3),
    })
    return 0 if ok else 1


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
