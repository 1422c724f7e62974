"""Synthesise speculators-0.9-format data (for tests and bench/): numpy + pyarrow only.

Writes what `datasets.Dataset.save_to_disk` writes (state.json, dataset_info.json,
data-00000-of-00001.arrow as an Arrow IPC stream) and hidden_states/hs_{i}.safetensors.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

DT = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8}


def bf16_bytes(a: np.ndarray) -> bytes:
    return (np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for b in blobs:
            f.write(b)


def write_hs(path: Path, token_ids: list[int], n_layers: int, hidden: int, *, dtype: str = "BF16",
             rng: np.random.Generator | None = None, fill: float | None = None) -> None:
    seq = len(token_ids)
    rng = rng or np.random.default_rng(0)
    a = (np.full((seq, n_layers, hidden), fill, np.float32) if fill is not None
         else rng.standard_normal((seq, n_layers, hidden), dtype=np.float32))
    data = bf16_bytes(a) if dtype == "BF16" else a.astype(np.float16 if dtype == "F16" else np.float32).tobytes()
    write_safetensors(path, {"hidden_states": (dtype, [seq, n_layers, hidden], data),
                             "token_ids": ("I64", [seq], np.asarray(token_ids, np.int64).tobytes())})


def write_dataset(root: Path, rows: list[dict], seq_lens: list[int] | None = None) -> None:
    import pyarrow as pa

    root.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "input_ids": pa.array([r["input_ids"] for r in rows], pa.list_(pa.int32())),
        "loss_mask": pa.array([r["loss_mask"] for r in rows], pa.list_(pa.int64())),
        "seq_len": pa.array(seq_lens or [len(r["input_ids"]) for r in rows], pa.int64()),
    })
    with pa.OSFile(str(root / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
    (root / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_fingerprint": "synthetic",
        "_format_columns": ["input_ids", "loss_mask", "seq_len"], "_format_kwargs": {},
        "_format_type": "torch", "_output_all_columns": False, "_split": None}))
    (root / "dataset_info.json").write_text(json.dumps({"features": {
        "input_ids": {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "List"},
        "loss_mask": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
        "seq_len": {"dtype": "int64", "_type": "Value"}}}))


def make(root: Path, *, rows: int = 8, seq: int = 32, n_layers: int = 4, hidden: int = 64,
         vocab: int = 1000, seed: int = 0) -> list[dict]:
    """A small valid dataset; returns its rows."""
    rng = np.random.default_rng(seed)
    data = []
    for i in range(rows):
        n = int(seq + i)
        ids = rng.integers(0, vocab, n).tolist()
        data.append({"input_ids": ids, "loss_mask": [0] * (n // 2) + [1] * (n - n // 2)})
    write_dataset(root, data)
    (root / "hidden_states").mkdir(exist_ok=True)
    for i, r in enumerate(data):
        write_hs(root / "hidden_states" / f"hs_{i}.safetensors", r["input_ids"], n_layers, hidden, rng=rng)
    return data


def verifier_config(root: Path, hidden: int, layers: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"hidden_size": hidden, "num_hidden_layers": layers,
                                                  "model_type": "llama"}))
    return root
