"""A hidden-states file (safetensors) checked from its header alone, no tensor read (stdlib only):
the header's length and JSON, each tensor's dtype, shape and data_offsets, the offsets tiling the
data section; and `readable`: a file whole on disk. Like datafmt.py's validators it returns
one-line problems and never raises on bad input (safetensors_header raises HeaderError with the
first). load_tensors reads a checked file's tensors with numpy alone (inspect-data's sample pass: no torch import)."""

import json
import os
import struct

from specops_host.datafmt import is_u64, jtype, short


#: safetensors' own limit on the JSON header (the Rust loader refuses larger ones)
MAX_HEADER = 100_000_000
#: every dtype safetensors knows, with its width in bits
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
              "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}


# -- safetensors ------------------------------------------------------------------------------

class HeaderError(Exception):
    pass


def check_safetensors(path, max_problems=8):
    """Validate a safetensors file from its header alone (no tensor is read).

    Returns (tensors, metadata, expect, problems): tensors {name: {dtype, shape, data_offsets}}
    of the well-formed entries, expect the file size the header implies (None if unknown),
    problems one line each, naming the field. The rules are the Rust loader's: an 8-byte
    little-endian length, a UTF-8 JSON object of at most 100 MB, `__metadata__` an object of
    strings, every tensor a known dtype, a shape of non-negative integers and data_offsets
    [begin, end] with end - begin = numel x itemsize, the tensors tiling the data section
    exactly (no overlap, no gap, no trailing bytes)."""
    problems = []
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                return {}, {}, None, [f"{size} byte(s): shorter than a safetensors header "
                                      f"(an 8-byte length, then JSON)"]
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER:
                return {}, {}, None, [f"header length {n} is over safetensors' limit of {MAX_HEADER} bytes: "
                                      f"a corrupt length prefix, or not a safetensors file"]
            if 8 + n > size:
                return {}, {}, None, [f"truncated inside the header: header length {n} but the file holds "
                                      f"{size} bytes"]
            raw = f.read(n)
    except OSError as e:
        return {}, {}, None, [f"cannot read: {e.strerror or e}"]
    if len(raw) < n:
        return {}, {}, None, [f"truncated inside the header: header length {n}, read {len(raw)} bytes"]
    try:
        hdr = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return {}, {}, None, [f"header: not UTF-8 (byte {8 + e.start} of the file): corrupt header"]
    except ValueError as e:
        return {}, {}, None, [f"header: not valid JSON ({str(e).splitlines()[0]})"]
    except RecursionError:
        return {}, {}, None, ["header: not valid JSON (nested too deeply)"]
    if not isinstance(hdr, dict):
        return {}, {}, None, [f"header: {jtype(hdr)}; expected an object "
                              f"{{tensor name: {{dtype, shape, data_offsets}}}}"]
    meta = hdr.pop("__metadata__", None)
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        bad = meta if not isinstance(meta, dict) else next(v for v in meta.values() if not isinstance(v, str))
        problems.append(f"__metadata__: holds {jtype(bad)} ({short(bad, 30)}); expected an object of strings")
        meta = {}
    data_len = size - 8 - n
    tensors = {}
    for name, t in hdr.items():
        where = f"tensor {short(name, 40)}"
        if not isinstance(t, dict):
            problems.append(f"{where}: {jtype(t)}; expected an object with dtype, shape, data_offsets")
            continue
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in t]
        if missing:
            problems.append(f"{where}: no {' / '.join(missing)} field")
            continue
        dt, shape, off = t["dtype"], t["shape"], t["data_offsets"]
        ok = True
        if not isinstance(dt, str) or dt not in DTYPE_BITS:
            problems.append(f"{where} dtype: {short(dt, 30)} is not a safetensors dtype "
                            f"(known: BF16, F16, F32, I64, ...)")
            ok = False
        if not isinstance(shape, list) or not all(is_u64(s) for s in shape):
            problems.append(f"{where} shape: {short(shape)}; expected a list of non-negative integers")
            ok = False
        if not isinstance(off, list) or len(off) != 2 or not all(is_u64(o) for o in off):
            problems.append(f"{where} data_offsets: {short(off)}; expected [begin, end], two non-negative integers")
            ok = False
        elif off[0] > off[1]:
            problems.append(f"{where} data_offsets: {short(off)}; begin is after end")
            ok = False
        if not ok:
            continue
        numel = 0 if 0 in shape else 1
        for s in shape if numel else ():
            numel *= s
            if numel > 1 << 64:  # (a corrupt shape: the offsets cannot match it)
                break
        bits = numel * DTYPE_BITS[dt]
        if bits % 8:
            problems.append(f"{where} shape: {short(shape)} of {dt} is {bits} bits, not whole bytes")
            continue
        if off[1] - off[0] != bits // 8:
            problems.append(f"{where} data_offsets: {short(off)} span {off[1] - off[0]} bytes but shape "
                            f"{short(shape)} of {dt} needs {bits // 8}")
            continue
        tensors[name] = {"dtype": dt, "shape": shape, "data_offsets": off}
    expect = None
    if len(tensors) == len(hdr):  # the layout is only meaningful when every entry is well-formed
        end, prev = 0, None
        for name, t in sorted(tensors.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
            b, stop = t["data_offsets"]
            if b < end:
                problems.append(f"tensor {short(name, 40)} data_offsets: {short([b, stop])} overlap tensor "
                                f"{short(prev[0], 40)} {short(prev[1])}")
            elif b > end:
                problems.append(f"tensor {short(name, 40)} data_offsets: {short([b, stop])} leave a gap of {b - end} "
                                f"byte(s) after {'tensor ' + short(prev[0], 40) if prev else 'the header'}: "
                                f"the loader refuses holes")
            if stop >= end:
                end, prev = stop, (name, [b, stop])
        expect = 8 + n + end
        if end > data_len:
            problems.append(f"truncated: {size} bytes, header says {expect} (data_offsets of tensor "
                            f"{short(prev[0], 40)} end at {end}, the data section holds {data_len})")
        elif end < data_len:
            problems.append(f"{data_len - end} trailing byte(s) after the last tensor's data_offsets (file "
                            f"{size} bytes, header says {expect}): the loader refuses the file")
    if len(problems) > max_problems:
        problems = problems[: max_problems - 1] + [f"... and {len(problems) - max_problems + 1} more header problem(s)"]
    return tensors, meta, expect, problems


def safetensors_header(path):
    """(tensors, metadata, expected file size) from the header alone; HeaderError (its first
    problem) if the header is not valid or the file's size disagrees with it."""
    tensors, meta, expect, problems = check_safetensors(path)
    if problems:
        raise HeaderError(problems[0])
    return tensors, meta, expect


def readable(p):
    """A hidden-state file whole on disk: its header parses and its size reaches the end of its data."""
    try:
        _, _, expect = safetensors_header(p)
        return p.stat().st_size >= expect
    except (HeaderError, OSError):
        return False


#: numpy's dtype for each safetensors dtype load_tensors reads (BF16 read as its bits, then widened to float32)
NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
         "I8": "i1", "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?"}


def load_tensors(path, tensors, names):
    """The named tensors of a file whose header check_safetensors passed (its `tensors`) as numpy arrays, BF16
    widened to float32 exactly (a bf16 is a float32's upper half): what inspect-data's sample pass needs, without
    importing torch (1.3 of the 1.4 s such a pass took). A tensor the header lacks is left out; a dtype not in NUMPY
    or a short read raises ValueError (the caller reports the file as not loadable)."""
    import numpy as np

    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        for name in names:
            e = tensors.get(name)
            if e is None:
                continue
            if e["dtype"] not in NUMPY:
                raise ValueError(f'tensor "{name}" dtype {e["dtype"]}: not read by inspect-data\'s sample pass')
            begin, end = e["data_offsets"]
            f.seek(8 + n + begin)
            buf = f.read(end - begin)
            if len(buf) != end - begin:
                raise ValueError(f'tensor "{name}": {len(buf)} of its {end - begin} bytes on disk')
            a = np.frombuffer(buf, dtype=NUMPY[e["dtype"]]).reshape(e["shape"])
            out[name] = (a.astype(np.uint32) << 16).view(np.float32) if e["dtype"] == "BF16" else a
    return out
