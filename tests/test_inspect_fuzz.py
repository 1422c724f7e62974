"""inspect-data under corrupt input: every run ends in a framed payload, never a traceback.

The header pass (remote/specops_host/data/inspect_data.py with --sample 0: stdlib + pyarrow, no torch) runs
in-process, through contract.main as on a host, over hundreds of seeded random corruptions of
the safetensors headers, specops-data.json, state.json, dataset_info.json and the verifier's
config.json. Each run must end in a payload: ok false with one-line violations naming the
corrupted file, or ok true only where an independent reference check (the safetensors rules
and the contract, written out below) finds the corruption harmless. The verifier's config is a
multimodal wrapper (text_config), as Kimi-K2.5's. Also here: the verifier contract (issue 12)
and convert-data's refusals, which come before torch is needed.
"""

from __future__ import annotations

import copy
import io
import json
import os
import random
import re
import shutil
import struct
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from specops import synth
from specops_host import contract
from specops_host import datafmt
from specops_host.data import convert_data, inspect_data
from specops_host.fetch import manifest

ROWS, SEQ, STORED, HIDDEN, N_LAYERS, VOCAB = 4, 6, 4, 16, 6, 500
ARROW = "data-00000-of-00001.arrow"
LAYER_IDS = [2, 3, 4, 6]
CASES = int(os.environ.get("SPECOPS_FUZZ_CASES", "1000"))  # (a longer run: SPECOPS_FUZZ_CASES=20000)
SEED = int(os.environ.get("SPECOPS_FUZZ_SEED", "20240514"))


def run_script(main, argv, name):
    """Run a remote script's main() as its `__main__` does (contract.main), in-process: (exit code,
    payload, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = [name, *argv]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                contract.main(main)
                code = None
            except SystemExit as e:
                code = e.code
    finally:
        sys.argv = old
    return code, contract.decode(out.getvalue()), err.getvalue()


def put(path: Path, data: bytes) -> None:
    """path's bytes replaced in place, without O_TRUNC: ext4 (auto_da_alloc) flushes a file
    truncated by its open to disk at its close, 5-14 ms a write here, 2,000 writes a fuzz run."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def inspect(*argv):
    return run_script(inspect_data.main, [str(a) for a in argv], "inspect_data.py")


def assert_framed(code, payload, err, what=""):
    """A framed payload, never a traceback nor a bug report; violations one line each."""
    assert payload is not None, f"{what}: no framed payload (exit {code}): {err[-800:]}"
    assert "Traceback" not in err and not payload.get("bug"), f"{what}: {payload.get('error')} {err[-800:]}"
    if payload.get("refused"):
        assert code == 2 and "\n" not in payload["error"], (what, payload)
        return
    assert code == (0 if payload["ok"] else 1), (what, code, payload.get("violations"))
    assert payload["n_violations"] == len(payload["violations"]) or len(payload["violations"]) == 200
    for v in payload["violations"] + payload["warnings"]:
        assert v["file"] and v["what"] and "\n" not in v["what"] and "\n" not in v["file"], (what, v)
    assert payload["ok"] == (not payload["violations"]), (what, payload["violations"])


# -- the reference checks: what a corruption breaks, written independently of datafmt ----------

BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
        "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F4": 4,
        "F6_E2M3": 6, "F6_E3M2": 6}


def u64(x):
    return type(x) is int and 0 <= x < 2**64


def posint(x):
    return type(x) is int and x > 0


def loads(b):
    try:
        return True, json.loads(b.decode("utf-8"))
    except (ValueError, RecursionError):
        return False, None


def ref_safetensors(b, seq):
    """True if the file is a valid safetensors file (the Rust loader's rules) holding what the
    contract wants for a row of seq tokens."""
    if len(b) < 8:
        return False
    n = struct.unpack("<Q", b[:8])[0]
    if n > 100_000_000 or 8 + n > len(b):
        return False
    ok, h = loads(b[8:8 + n])
    if not ok or not isinstance(h, dict):
        return False
    meta = h.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        return False
    spans = []
    for t in h.values():
        if not isinstance(t, dict) or not {"dtype", "shape", "data_offsets"} <= set(t):
            return False
        dt, shape, off = t["dtype"], t["shape"], t["data_offsets"]
        if not isinstance(dt, str) or dt not in BITS or not isinstance(shape, list) or not all(map(u64, shape)):
            return False
        if not isinstance(off, list) or len(off) != 2 or not all(map(u64, off)) or off[0] > off[1]:
            return False
        numel = 1
        for s in shape:
            numel *= s
        if numel * BITS[dt] % 8 or off[1] - off[0] != numel * BITS[dt] // 8:
            return False
        spans.append(tuple(off))
    end = 0
    for s, e in sorted(spans):
        if s != end:
            return False
        end = e
    if end != len(b) - 8 - n:
        return False
    hs, tid = h.get("hidden_states"), h.get("token_ids")
    return (hs is not None and tid is not None and hs["dtype"] == "BF16" and hs["shape"] == [seq, STORED, HIDDEN]
            and tid["dtype"] == "I64" and tid["shape"] == [seq])


def ref_arrow(b, vocab):
    """The number of rows of a valid Arrow stream holding the contract's columns, or None."""
    import pyarrow as pa

    try:
        t = pa.ipc.open_stream(pa.BufferReader(b)).read_all()
        t.validate(full=True)
    except Exception:  # noqa: BLE001 - (not an Arrow IPC stream: an IPC file? not here)
        return None
    types = {f.name: f.type for f in t.schema}
    if set(types) != {"input_ids", "loss_mask", "seq_len"} or not pa.types.is_integer(types["seq_len"]):
        return None
    for c, ok in (("input_ids", pa.types.is_integer),
                  ("loss_mask", lambda v: pa.types.is_integer(v) or pa.types.is_boolean(v))):
        if not (pa.types.is_list(types[c]) or pa.types.is_large_list(types[c])) or not ok(types[c].value_type):
            return None
    for i, r in enumerate(t.to_pylist()):
        ids, mask, n = r["input_ids"], r["loss_mask"], r["seq_len"]
        if ids is None or mask is None or n is None or None in ids or len(ids) != n or len(mask) != n:
            return None
        if any(x < 0 or (vocab and x >= vocab) for x in ids) or (i < ROWS and n != SEQ + i):
            return None
    return t.num_rows


def ref_verifier(cfg):
    """(hidden, layers, vocab or None) of a verifier config, or None if it is not valid."""
    if not isinstance(cfg, dict):
        return None
    inner = cfg
    if cfg.get("text_config") is not None:
        if not isinstance(cfg["text_config"], dict):
            return None
        inner = cfg["text_config"]
    h, n = inner.get("hidden_size"), inner.get("num_hidden_layers")
    if not posint(h) or not posint(n):
        return None
    src = inner if "vocab_size" in inner or "vocab_size" not in cfg else cfg
    if "vocab_size" in src and not posint(src["vocab_size"]):
        return None
    return h, n, src.get("vocab_size")


def ref_contract(world):
    """True if the data set `world` (its files' bytes by name) passes: each file valid and the
    files agreeing with each other and with the verifier."""
    ok, rec = loads(world["record"])
    if not ok or not isinstance(rec, dict):
        return False
    types = {"verifier": lambda v: isinstance(v, str) and v != "", "converted_from": lambda v: isinstance(v, str),
             "format": lambda v: isinstance(v, str), "backend": lambda v: isinstance(v, str),
             "data_dir": lambda v: isinstance(v, str),
             "updated": lambda v: type(v) in (int, float), "stored_layers": posint, "hidden_size": posint,
             "num_hidden_layers": posint}
    if not all(types[k](v) for k, v in rec.items() if k in types):
        return False
    ids = rec.get("layer_ids")
    if "layer_ids" in rec:
        if not isinstance(ids, list) or not ids or not all(type(x) is int and x >= 0 for x in ids):
            return False
        if any(a >= b for a, b in zip(ids, ids[1:])):
            return False
    if ids is not None and "stored_layers" in rec and rec["stored_layers"] != len(ids):
        return False
    layers = rec.get("stored_layers") or (len(ids) if ids else None)
    if layers is not None and layers != STORED:
        return False
    if rec.get("hidden_size") not in (None, HIDDEN):
        return False
    ver = None
    vpath = rec.get("verifier")
    if vpath is not None and (Path(vpath) / "config.json").is_file():
        if Path(vpath) / "config.json" != world["config_path"]:
            return False  # (a corrupted path that happens to lead elsewhere: not expected)
        ok, cfg = loads(world["config"])
        ver = ref_verifier(cfg) if ok else None
        if ver is None:
            return False
        h, n, vocab = ver
        if h != HIDDEN:
            return False
        if ids is not None and (max(ids) > n or ids[-1] != n):
            return False
    rows = ref_arrow(world["arrow"], ver[2] if ver else None)
    if rows is None or rows > ROWS:
        return False
    ok, state = loads(world["state"])
    if not ok or not isinstance(state, dict):
        return False
    need = {"_data_files", "_fingerprint", "_format_type", "_format_kwargs", "_format_columns",
            "_output_all_columns", "_split"}
    if not need <= set(state):
        return False
    df = state["_data_files"]
    if not isinstance(df, list) or [e.get("filename") if isinstance(e, dict) else None for e in df] != [ARROW]:
        return False
    fmt_types = {None, "python", "arrow", "pa", "pyarrow", "numpy", "np", "pandas", "pd", "custom", "polars", "pl",
                 "torch", "pt", "pytorch", "tensorflow", "tf", "jax"}
    if not isinstance(state["_fingerprint"], str) or not isinstance(state["_format_kwargs"], dict):
        return False
    if not (state["_format_type"] is None or isinstance(state["_format_type"], str)) or \
            state["_format_type"] not in fmt_types:
        return False
    fc = state["_format_columns"]
    if fc is not None and not (isinstance(fc, list) and all(c in ("input_ids", "loss_mask", "seq_len") for c in fc)):
        return False
    if type(state["_output_all_columns"]) is not bool:
        return False
    sp = state["_split"]
    if sp is not None and not (isinstance(sp, str) and re.match(r"^\w+(\.\w+)*$", sp)):
        return False
    ok, info = loads(world["info"])
    if not ok or not isinstance(info, dict):
        return False
    feats = info.get("features")
    if feats is not None:
        ints = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}

        def value(f, dts):
            return (isinstance(f, dict) and f.get("_type") == "Value" and isinstance(f.get("dtype"), str)
                    and f["dtype"] in dts)

        def listof(f, dts):
            if isinstance(f, list):
                return len(f) == 1 and value(f[0], dts)
            return (isinstance(f, dict) and f.get("_type") in ("List", "Sequence", "LargeList")
                    and value(f.get("feature"), dts))

        if not isinstance(feats, dict) or set(feats) != {"input_ids", "loss_mask", "seq_len"}:
            return False
        if not (listof(feats["input_ids"], ints) and listof(feats["loss_mask"], ints | {"bool"})
                and value(feats["seq_len"], ints)):
            return False
    return all(ref_safetensors(world[f"hs_{i}"], SEQ + i) for i in range(min(ROWS, rows)))


# -- the data set and its corruptions ---------------------------------------------------------

def wrapper_config(hidden, layers, vocab):
    """A multimodal wrapper config as Kimi-K2.5's: the language model's fields under text_config."""
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
            "text_config": {"model_type": "deepseek_v3", "hidden_size": hidden, "num_hidden_layers": layers,
                            "vocab_size": vocab, "architectures": ["DeepseekV3ForCausalLM"]}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    data, cfg = root / "set", root / "cfg"
    synth.make(data, rows=ROWS, seq=SEQ, n_layers=STORED, hidden=HIDDEN, vocab=VOCAB)
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps(wrapper_config(HIDDEN, N_LAYERS, VOCAB), indent=2))
    (data / datafmt.RECORD).write_text(json.dumps({
        "verifier": str(cfg), "layer_ids": LAYER_IDS, "stored_layers": STORED, "hidden_size": HIDDEN,
        "backend": "hf", "updated": 1715700000.25}, indent=1))
    paths = {"record": data / datafmt.RECORD, "state": data / "state.json", "info": data / "dataset_info.json",
             "config": cfg / "config.json", "arrow": data / ARROW,
             **{f"hs_{i}": data / "hidden_states" / f"hs_{i}.safetensors" for i in range(ROWS)}}
    return {"root": root, "data": data, "paths": paths}


def json_nodes(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from json_nodes(v, path + (k,))
    elif isinstance(obj, list):
        for k, v in enumerate(obj):
            yield from json_nodes(v, path + (k,))


def set_node(obj, path, value):
    if not path:
        return value
    obj = copy.deepcopy(obj)
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    if value is DELETE:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return obj


DELETE = object()


def random_value(rng, old):
    """A JSON value of a random type (often the wrong one), or one close to old."""
    picks = [-1, -rng.randint(2, 10**6), 0, 1, rng.randint(2, 10**6), 2**64 + rng.randint(0, 9), 2**63, 1.5, -0.0,
             float("nan"), "", "x", "BF16", "F16", "I64", "bf16", True, False, None, [], [0], [-8, 8], [16, 8],
             [1, 2, 3], {}, {"a": 1}, {"filename": "x.arrow"}, "torch", "text_config", [[1]]]
    if type(old) is int:
        picks += [old + 1, old - 1, old + 8, old * 2, -old]
    if isinstance(old, list) and old and all(type(x) is int for x in old):
        picks += [old[::-1], old[:-1], old + [old[-1] + 1], [x - 8 for x in old], [x + 8 for x in old]]
    if isinstance(old, str):
        picks += [old.upper(), old + "x", old[:-1]]
    return rng.choice(picks)


def st_split(b):
    n = struct.unpack("<Q", b[:8])[0]
    return n, json.loads(b[8:8 + n]), b[8 + n:]


def st_join(hdr, data, pad=True):
    raw = json.dumps(hdr).encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


TARGETED = ["negative", "overlap", "out_of_range", "swapped", "unknown_dtype", "dtype_width", "shape_numel",
            "shape_negative", "offsets_type", "huge_length", "short_length", "truncate", "append", "header_list",
            "metadata_type", "missing_field"]


def targeted(rng, b):
    """A corruption the header pass must catch: (name, new bytes)."""
    n, h, data = st_split(b)
    t = rng.choice(["hidden_states", "token_ids"])
    lo, hi = h[t]["data_offsets"]
    kind = rng.choice(TARGETED)
    h2 = copy.deepcopy(h)
    if kind == "negative":
        h2[t]["data_offsets"] = [lo - rng.randint(1, 64) if lo else -rng.randint(1, 64), hi]
    elif kind == "overlap":
        k = rng.choice([2, 8, 16])
        other = "token_ids" if t == "hidden_states" else "hidden_states"
        a, z = h2[other]["data_offsets"]
        h2[t]["data_offsets"] = [a + k, a + k + (hi - lo)] if a + k <= z else [a, a + hi - lo]
    elif kind == "out_of_range":
        extra = rng.choice([1, 8, 10**6, 2**40])
        h2[t]["data_offsets"] = [lo + extra, hi + extra]
    elif kind == "swapped":
        h2[t]["data_offsets"] = [hi, lo]
    elif kind == "unknown_dtype":
        h2[t]["dtype"] = rng.choice(["BF17", "bf16", "int64", "", 16, None, ["BF16"]])
    elif kind == "dtype_width":
        h2[t]["dtype"] = rng.choice(["F32", "U8", "F64", "BOOL"] if t == "hidden_states" else ["I32", "U8", "F16"])
    elif kind == "shape_numel":
        s = list(h2[t]["shape"])
        s[rng.randrange(len(s))] += rng.choice([1, 2, -1])
        h2[t]["shape"] = s
    elif kind == "shape_negative":
        s = list(h2[t]["shape"])
        s[rng.randrange(len(s))] = -s[0]
        h2[t]["shape"] = s
    elif kind == "offsets_type":
        h2[t]["data_offsets"] = rng.choice([[lo], [lo, hi, hi], [str(lo), hi], [lo, float(hi) + 0.5], None, lo, {}])
    elif kind == "huge_length":
        return kind, struct.pack("<Q", rng.choice([2**63, 2**64 - 1, 100_000_001, len(b)])) + b[8:]
    elif kind == "short_length":
        return kind, struct.pack("<Q", max(0, n - rng.randint(1, 40))) + b[8:]
    elif kind == "truncate":
        return kind, b[:rng.randrange(len(b))]
    elif kind == "append":
        return kind, b + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == "header_list":
        return kind, st_join(rng.choice([[h], "x", 3, None]), data)
    elif kind == "metadata_type":
        h2["__metadata__"] = rng.choice([[1], "pt", 3, {"format": 1}, {"a": None}])
    elif kind == "missing_field":
        del h2[t][rng.choice(["dtype", "shape", "data_offsets"])]
    return kind, st_join(h2, data)


def flip(rng, b, lo, hi, k=None):
    b = bytearray(b)
    for _ in range(k or rng.randint(1, 3)):
        if hi > lo:
            b[rng.randrange(lo, hi)] = rng.randrange(256)
    return bytes(b)


def corrupt(rng, name, b):
    """(kind, new bytes, must_catch): must_catch True for a corruption that cannot be harmless,
    None where the reference check decides."""
    if name.startswith("hs_"):
        n = struct.unpack("<Q", b[:8])[0]
        r = rng.random()
        if r < 0.35:
            kind, nb = targeted(rng, b)
            return f"hs/{kind}", nb, True
        if r < 0.55:
            return "hs/flip-header", flip(rng, b, 0, 8 + n), None
        if r < 0.62:
            return "hs/flip-data", flip(rng, b, 8 + n, len(b)), None
        _, h, data = st_split(b)
        path = rng.choice(list(json_nodes(h)))
        cur = h
        for k in path:
            cur = cur[k]
        val = DELETE if path and rng.random() < 0.15 else random_value(rng, cur)
        return f"hs/json:{'.'.join(map(str, path)) or 'root'}", st_join(set_node(h, path, val), data), None
    r = rng.random()
    if name == "arrow":  # (a cut stream may still read whole: the reference decides)
        if r < 0.3:
            return "arrow/truncate", b[:rng.randrange(len(b))], None
        return "arrow/flip", flip(rng, b, 0, len(b)), None
    if r < 0.15:
        return f"{name}/truncate", b[:rng.randrange(len(b))], True
    if r < 0.45:
        return f"{name}/flip", flip(rng, b, 0, len(b)), None
    obj = json.loads(b)
    path = rng.choice(list(json_nodes(obj)))
    cur = obj
    for k in path:
        cur = cur[k]
    val = DELETE if path and rng.random() < 0.2 else random_value(rng, cur)
    return (f"{name}/json:{'.'.join(map(str, path)) or 'root'}",
            json.dumps(set_node(obj, path, val), indent=1).encode(), None)


def test_fuzz_header_pass(world):
    """CASES seeded corruptions, one file each: a framed payload every time; ok only if harmless."""
    rng = random.Random(SEED)
    paths = world["paths"]
    orig = {k: p.read_bytes() for k, p in paths.items()}
    base = {**orig, "config_path": paths["config"]}
    assert ref_contract(base)
    code, payload, err = inspect("--path", world["data"], "--sample", "0")
    assert_framed(code, payload, err, "pristine")
    assert payload["ok"], payload["violations"]
    assert payload["verifier_text_config"] is True and payload["verifier_num_hidden_layers"] == N_LAYERS
    names = list(paths)
    weights = [3 if n.startswith("hs_") else (4 if n in ("record", "state") else 3) for n in names]
    stats = {"cases": 0, "caught": 0, "harmless": 0}
    kinds = {}
    t0 = time.time()
    for case in range(CASES):
        name = rng.choices(names, weights)[0]
        kind, nb, must = corrupt(rng, name, orig[name])
        if nb == orig[name]:
            continue
        p = paths[name]
        put(p, nb)
        try:
            code, payload, err = inspect("--path", world["data"], "--sample", "0")
        finally:
            put(p, orig[name])
        what = f"case {case} {kind} of {p.name}"
        assert_framed(code, payload, err, what)
        harmless = ref_contract({**base, name: nb})
        if must:
            assert not harmless, f"{what}: the reference passes a corruption said to be fatal"
        if payload["ok"]:
            assert harmless, f"{what}: passed, but the reference check fails it"
            stats["harmless"] += 1
        else:
            assert not harmless, f"{what}: false violation(s) {payload['violations'][:3]}"
            assert any(str(p) in v["file"] or str(p) in v["what"] for v in payload["violations"]), \
                f"{what}: no violation names {p}: {payload['violations'][:3]}"
            stats["caught"] += 1
        stats["cases"] += 1
        kinds[kind.split(":")[0]] = kinds.get(kind.split(":")[0], 0) + 1
    elapsed = time.time() - t0
    print(f"fuzz: {stats} in {elapsed:.1f}s; kinds {sorted(kinds.items())}")
    assert stats["cases"] >= min(500, CASES * 0.9) and stats["harmless"] >= 10, stats
    want = {f"hs/{k}" for k in TARGETED} | {f"{n}/{k}" for n in ("record", "state", "config", "info")
                                            for k in ("json", "flip", "truncate")} | {"arrow/flip", "arrow/truncate"}
    assert want <= set(kinds), sorted(want - set(kinds))


@pytest.mark.parametrize("name,mutate,expect", [
    ("hs_1", lambda h: h["token_ids"].update(data_offsets=[-8, h["token_ids"]["data_offsets"][1]]),
     "tensor \"token_ids\" data_offsets: [-8,"),
    ("hs_2", lambda h: h["token_ids"].update(data_offsets=[h["token_ids"]["data_offsets"][0] - 8,
                                                            h["token_ids"]["data_offsets"][1] - 8]),
     "overlap tensor \"hidden_states\""),
    ("hs_0", lambda h: h["hidden_states"].update(dtype="BF17"), "tensor \"hidden_states\" dtype: \"BF17\""),
    ("hs_3", lambda h: h["token_ids"].update(shape=[-1]), "tensor \"token_ids\" shape: [-1]"),
    ("hs_3", lambda h: h["token_ids"].update(data_offsets=[h["token_ids"]["data_offsets"][0] + 8,
                                                            h["token_ids"]["data_offsets"][1] + 8]), "truncated:"),
])
def test_each_header_violation_is_one_line_naming_file_and_field(world, name, mutate, expect):
    p = world["paths"][name]
    b = p.read_bytes()
    n, h, data = st_split(b)
    mutate(h)
    put(p, st_join(h, data))
    try:
        code, payload, err = inspect("--path", world["data"])
    finally:
        put(p, b)
    assert_framed(code, payload, err, name)
    assert not payload["ok"]
    mine = [v for v in payload["violations"] if v["file"] == str(p)]
    assert mine and any(expect in v["what"] for v in mine), payload["violations"]


@pytest.mark.parametrize("argv,expect", [
    (["--sample", "-1"], "--sample -1: give how many files"),
    (["--sample", "x"], "argument --sample: invalid int value: 'x'"),
    (["--layers", "0"], "--layers 0:"),
    (["--layers", "2.5"], "argument --layers: invalid int value"),
    (["--path", ""], "--path is empty"),
    (["--verifier", ""], "--verifier is empty"),
    (["--colour", "red"], "unrecognized arguments: --colour red"),
    ([], None),
])
def test_bad_arguments_refused_with_one_line(world, argv, expect):
    if expect is None:  # no --path at all
        code, payload, err = run_script(inspect_data.main, [], "inspect_data.py")
        expect = "the following arguments are required: --path"
    else:
        code, payload, err = inspect(*(argv if "--path" in argv else ["--path", world["data"], *argv]))
    assert_framed(code, payload, err, str(argv))
    assert payload["refused"] and code == 2 and expect in payload["error"], payload


def test_missing_and_unreadable_inputs_are_violations(world, tmp_path):
    code, payload, err = inspect("--path", tmp_path / "nope")
    assert_framed(code, payload, err)
    assert "does not exist" in payload["violations"][0]["what"]
    f = tmp_path / "file"
    f.write_text("x")
    code, payload, err = inspect("--path", f)
    assert_framed(code, payload, err)
    assert "is a file" in payload["violations"][0]["what"]
    d = tmp_path / "set"
    shutil.copytree(world["data"], d)
    (d / "state.json").unlink()
    (d / "dataset_info.json").write_text("[]")
    code, payload, err = inspect("--path", d, "--verifier", tmp_path / "nowhere")
    assert_framed(code, payload, err)
    got = {(Path(v["file"]).name, v["what"].split(":")[0]) for v in payload["violations"]}
    assert ("state.json", "missing") in got, payload["violations"]
    assert any(w["file"] == str(tmp_path / "nowhere") for w in payload["warnings"])


# -- the verifier contract (issue 12): a multimodal wrapper config ------------------------------

def contract_set(root, *, vocab=1000, layers=61, hidden=64, bad_id=None, layer_ids=(2, 30, 58, 61),
                 rec_hidden=64, flat=False):
    rows = synth.make(root / "set", rows=3, seq=5, n_layers=len(layer_ids), hidden=64, vocab=vocab)
    if bad_id is not None:  # row 1's token 2, in the dataset and in its file alike
        rows[1]["input_ids"][2] = bad_id
        synth.write_dataset(root / "set", rows)
        synth.write_hs(root / "set/hidden_states/hs_1.safetensors", rows[1]["input_ids"], len(layer_ids), 64)
    cfg = root / "model"
    cfg.mkdir()
    c = wrapper_config(hidden, layers, vocab)
    (cfg / "config.json").write_text(json.dumps(c["text_config"] if flat else c))
    (root / "set" / datafmt.RECORD).write_text(json.dumps({
        "verifier": str(cfg), "layer_ids": list(layer_ids), "stored_layers": len(layer_ids),
        "hidden_size": rec_hidden}))
    return root / "set", cfg / "config.json"


@pytest.mark.parametrize("flat", [False, True])
def test_verifier_contract_passes_through_text_config(tmp_path, flat):
    d, cfg = contract_set(tmp_path, flat=flat)
    code, payload, err = inspect("--path", d)
    assert_framed(code, payload, err)
    assert payload["ok"], payload["violations"]
    assert (payload["verifier_hidden_size"], payload["verifier_num_hidden_layers"], payload["verifier_vocab_size"],
            payload["verifier_text_config"], payload["verifier_config"]) == (64, 61, 1000, not flat, str(cfg))


@pytest.mark.parametrize("case", ["token_id", "layer_ids", "hidden_size", "layer_out_of_range"])
def test_verifier_contract_violations(tmp_path, case):
    kw = {"token_id": {"bad_id": 1000}, "layer_ids": {"layer_ids": (2, 30, 58, 60)},
          "hidden_size": {"rec_hidden": 48, "hidden": 48},
          "layer_out_of_range": {"layer_ids": (2, 30, 62, 64)}}[case]
    d, cfg = contract_set(tmp_path, **kw)
    code, payload, err = inspect("--path", d)
    assert_framed(code, payload, err, case)
    assert not payload["ok"]
    vs = payload["violations"]
    rec = str(d / datafmt.RECORD)
    if case == "token_id":
        (v,) = vs
        assert v["file"] == str(d / "data-00000-of-00001.arrow")
        assert v["what"].startswith("input_ids: row 1 position 2 holds token id 1000, outside the verifier's "
                                    "vocabulary [0, 1000) (text_config.vocab_size of " + str(cfg)), v
    elif case == "layer_ids":
        (v,) = vs
        assert v["file"] == rec and v["what"].startswith("layer_ids [2, 30, 58, 60]: the last id must be 61, "
                                                         "text_config.num_hidden_layers of " + str(cfg)), v
    elif case == "layer_out_of_range":
        (v,) = vs
        assert v["file"] == rec and v["what"].startswith("layer_ids [2, 30, 62, 64]: 62 lies outside [0, 61]"), v
    else:  # the record says 48 like the verifier, the files hold 64: both lines name their file and field
        got = sorted((Path(v["file"]).name, v["what"]) for v in vs)
        assert len(got) == 2, got
        assert got[0][0] == "hidden_states" and got[0][1].startswith("hidden size 64 but the verifier's hidden_size "
                                                                     "is 48 (text_config.hidden_size of"), got
        assert got[1] == (datafmt.RECORD, "hidden_size: 48 but the hidden_states files hold 64"), got


def test_token_ids_of_a_dataset_in_several_arrow_files(tmp_path):
    """The row and the file named are the right ones when the dataset spans several Arrow files."""
    d, cfg = contract_set(tmp_path)
    rows = [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}, {"input_ids": [4, 1001, 6], "loss_mask": [1, 1, 1]}]
    synth.write_dataset(tmp_path / "other", rows)
    shutil.copy(tmp_path / "other" / ARROW, d / "data-00001-of-00002.arrow")
    (d / ARROW).rename(d / "data-00000-of-00002.arrow")
    state = json.loads((d / "state.json").read_text())
    state["_data_files"] = [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]
    (d / "state.json").write_text(json.dumps(state))
    code, payload, err = inspect("--path", d)
    assert_framed(code, payload, err)
    vs = [v for v in payload["violations"] if "input_ids:" in v["what"]]
    assert len(vs) == 1 and vs[0]["file"] == str(d / "data-00001-of-00002.arrow"), payload["violations"]
    assert vs[0]["what"].startswith("input_ids: row 4 position 1 holds token id 1001"), vs
    assert payload["rows"] == 5 and payload["input_ids_range"][1] == 1001


def test_record_hidden_size_against_the_verifier(tmp_path):
    d, cfg = contract_set(tmp_path, rec_hidden=32)
    code, payload, err = inspect("--path", d)
    assert_framed(code, payload, err)
    whats = {v["what"] for v in payload["violations"] if v["file"] == str(d / datafmt.RECORD)}
    assert f"hidden_size: 32 but text_config.hidden_size of {cfg} is 64: data from another model?" in whats, whats


@pytest.mark.parametrize("cfg,expect", [
    ({"text_config": {"hidden_size": 64}}, "text_config.num_hidden_layers: missing (read through text_config)"),
    ({"architectures": ["X"]}, "hidden_size: missing (a multimodal wrapper keeps it under text_config)"),
    ({"text_config": [1]}, "text_config: a list; expected an object"),
    ({"hidden_size": "64", "num_hidden_layers": 61}, 'hidden_size: "64"; expected a positive integer'),
    ({"hidden_size": 64, "num_hidden_layers": 61, "vocab_size": -5}, "vocab_size: -5; expected a positive integer"),
    ([], "a list; expected an object"),
])
def test_bad_verifier_config_is_one_line_naming_config_json(tmp_path, cfg, expect):
    d, path = contract_set(tmp_path)
    path.write_text(json.dumps(cfg))
    code, payload, err = inspect("--path", d)
    assert_framed(code, payload, err)
    assert any(v["file"] == str(path) and v["what"].startswith(expect) for v in payload["violations"]), \
        payload["violations"]


# -- convert-data: the refusals that come before torch -----------------------------------------

def legacy_dir(root):
    (root / "rows_0-10").mkdir(parents=True)
    (root / "rows_0-10" / "data_0.pt").write_bytes(b"not a torch file")
    return root


@pytest.mark.parametrize("case", ["dst_file", "dst_not_empty", "dst_under_file", "no_src", "bad_args", "dst_in_src"])
def test_convert_refusals_are_one_line(tmp_path, case):
    src = legacy_dir(tmp_path / "legacy")
    dst = tmp_path / "new"
    argv = ["--src", str(src), "--dst", str(dst)]
    if case == "dst_file":
        dst.write_text("x")
        expect = "is a file, not a directory"
    elif case == "dst_not_empty":
        (dst / "keep").mkdir(parents=True)
        expect = "exists and is not empty"
    elif case == "dst_under_file":
        (tmp_path / "f").write_text("x")
        argv[-1] = str(tmp_path / "f" / "new")
        expect = "is a file, not a directory: give a path under a directory"
    elif case == "no_src":
        argv[1] = str(tmp_path / "nope")
        expect = "no rows_*/data_*.pt files"
    elif case == "dst_in_src":
        argv[-1] = str(src / "out")
        expect = "lies inside --src"
    else:
        argv = ["--src", str(src)]
        expect = "the following arguments are required: --dst"
    code, payload, err = run_script(convert_data.main, argv, "convert_data.py")
    assert payload and payload.get("refused") and code == 2 and "Traceback" not in err, (payload, err[-500:])
    assert expect in payload["error"] and "\n" not in payload["error"], payload
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    if case == "dst_file":
        assert dst.read_text() == "x"


def test_convert_clears_stale_temp_dirs_of_dead_runs(tmp_path):
    dst = tmp_path / "new"
    stale = tmp_path / f".new{convert_data.TMP}999999999"
    stale.mkdir()
    (stale / "hs_0.safetensors").write_text("partial")
    mine = tmp_path / f".new{convert_data.TMP}{__import__('os').getpid()}"  # (a live pid: kept)
    mine.mkdir()
    convert_data.clear_stale(dst)
    assert not stale.exists() and mine.exists()


# -- the sha256 manifest's cache: a corrupt one is ignored, never a traceback -------------------

@pytest.mark.parametrize("cache", ['[1, 2]', '{"a.txt": 3}', '{"a.txt": {"size": "x"}}', "not json", '{"a.txt": {}}',
                                   '{"a.txt": {"size": 1, "mtime_ns": 2, "ctime_ns": 3, "sha256": 7}}'])
def test_manifest_survives_a_corrupt_cache(tmp_path, cache):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / manifest.CACHE).write_text(cache)
    got = manifest.manifest(tmp_path)
    assert got["a.txt"]["sha256"] == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    code, payload, err = run_script(manifest.main, [str(tmp_path)], "manifest.py")
    assert payload["ok"] and payload["files"]["a.txt"]["size"] == 5


def test_manifest_arguments_refused_with_one_line(tmp_path):
    code, payload, err = run_script(manifest.main, [], "manifest.py")
    assert payload and payload.get("refused") and code == 2 and "Traceback" not in err, payload
    code, payload, err = run_script(manifest.main, [str(tmp_path / "nope")], "manifest.py")
    assert payload and not payload["ok"] and "no directory" in payload["error"], payload


# -- the sample pass: whole files read with numpy alone ---------------------------------------------

def test_the_sample_pass_reads_whole_files_with_numpy_alone(world, tmp_path):
    """--sample loads its files with numpy (hsfile.load_tensors: no torch; the pass before each `inv train` took
    1.4 s, 1.3 of them torch's import): BF16 widened to float32 exactly, F16 read as it is, a short read refused;
    and what the pass checks is found in what it reads: NaN, an all-zero stored layer, token ids not the row's."""
    import numpy as np

    from specops_host.data import hsfile

    x = tmp_path / "x.safetensors"
    for dtype, fill in (("BF16", -2.5), ("F16", 0.5), ("F32", 1e-3)):
        synth.write_hs(x, [7, 8, 9], 2, 4, dtype=dtype, fill=fill)
        got = hsfile.load_tensors(x, hsfile.check_safetensors(x)[0], ("hidden_states", "token_ids", "absent"))
        assert set(got) == {"hidden_states", "token_ids"} and got["token_ids"].tolist() == [7, 8, 9]
        hs = got["hidden_states"]
        assert hs.shape == (3, 2, 4) and (hs == np.asarray(fill, hs.dtype)).all(), (dtype, hs)
    tensors = hsfile.check_safetensors(x)[0]
    put(x, x.read_bytes()[:-8])
    with pytest.raises(ValueError, match='tensor "token_ids": 16 of its 24 bytes on disk'):
        hsfile.load_tensors(x, tensors, ("token_ids",))

    p = world["paths"]["hs_1"]
    orig = p.read_bytes()
    ids = hsfile.load_tensors(p, hsfile.check_safetensors(p)[0], ("token_ids",))["token_ids"].tolist()
    code, payload, err = inspect("--path", world["data"], "--sample", str(ROWS))
    assert payload["ok"] and payload["full_checked"] == ROWS, (payload.get("violations"), err[-800:])
    try:
        for write, want in ((dict(fill=float("nan")), f"{len(ids) * STORED * HIDDEN} NaN and 0 Inf values"),
                            (dict(fill=0.0), "hidden_states all zero in stored layer(s) [0, 1, 2, 3]"),
                            (dict(token_ids=ids[::-1]), "token_ids differ from dataset row 1 input_ids")):
            synth.write_hs(p, write.pop("token_ids", ids), STORED, HIDDEN, **write)
            code, payload, err = inspect("--path", world["data"], "--sample", str(ROWS))
            assert_framed(code, payload, err, want)
            assert any(v["what"].startswith(want) and v["file"].endswith("hs_1.safetensors")
                       for v in payload["violations"]), (want, payload["violations"])
    finally:
        put(p, orig)
