"""Data layouts specops knows, and cheap readers for them (stdlib + pyarrow only at import).

- speculators 0.9: an Arrow dataset saved with `datasets` (state.json, data-*.arrow; columns
  input_ids, loss_mask, seq_len) plus hidden_states/hs_{i}.safetensors holding
  `hidden_states` bf16 [seq, n_layers, hidden] and `token_ids` int64 [seq].
- legacy speculators v0.3: rows_*/data_*.pt ({input_ids, hidden_states: list of [seq, hidden],
  loss_mask}) plus data_config.json. speculators 0.9 can no longer read it.
- SpecForge: data_*.ckpt ({input_ids, loss_mask, hidden_state, aux_hidden_state}).
"""

import json
import re
import struct
from pathlib import Path

HS_DIR = "hidden_states"
HS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")
LEGACY_NAME = re.compile(r"^data_(\d+)\.pt$")
RECORD = "specops-data.json"  # what specops knows about how the data was made


def detect(root):
    root = Path(root)
    if not root.is_dir():
        return None
    if (root / "state.json").is_file() or list(root.glob("data-*.arrow")):
        return "speculators-0.9"
    if list(root.glob("rows_*/data_*.pt")):
        return "legacy-v0.3"
    if list(root.glob("**/data_*.ckpt")):
        return "specforge"
    if (root / HS_DIR).is_dir():
        return "speculators-0.9"
    return None


def hs_files(root):
    """{row index: path} of hidden_states/hs_{i}.safetensors."""
    out = {}
    d = Path(root) / HS_DIR
    if d.is_dir():
        for p in d.iterdir():
            m = HS_NAME.match(p.name)
            if m:
                out[int(m.group(1))] = p
    return out


class HeaderError(Exception):
    pass


def safetensors_header(path):
    """(tensors {name: {dtype, shape, data_offsets}}, metadata, expected file size) from the
    header alone: no tensor is read."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise HeaderError("file shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > 100 << 20:
            raise HeaderError(f"header length {n} is implausible: not a safetensors file")
        raw = f.read(n)
        if len(raw) < n:
            raise HeaderError("truncated inside the header")
    try:
        hdr = json.loads(raw)
    except ValueError as e:
        raise HeaderError(f"header is not JSON: {e}") from None
    meta = hdr.pop("__metadata__", {}) or {}
    end = max((t["data_offsets"][1] for t in hdr.values()), default=0)
    return hdr, meta, 8 + n + end


def read_arrow_columns(root, columns):
    """{column: list} from the dataset's Arrow files (datasets' save_to_disk layout)."""
    import pyarrow as pa

    root = Path(root)
    files = []
    state = root / "state.json"
    if state.is_file():
        files = [root / f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
    if not files:
        files = sorted(root.glob("data-*.arrow"))
    tables = []
    for f in files:
        with pa.memory_map(str(f)) as src:
            try:
                tables.append(pa.ipc.open_stream(src).read_all())
            except pa.ArrowInvalid:
                tables.append(pa.ipc.open_file(src).read_all())
    table = pa.concat_tables(tables) if tables else pa.table({})
    out = {}
    for c in columns:
        if c in table.column_names:
            out[c] = table.column(c).to_pylist()
    out["_num_rows"] = table.num_rows
    out["_columns"] = {name: str(table.schema.field(name).type) for name in table.column_names}
    return out


def verifier_config(path):
    """(hidden_size, num_hidden_layers) of a HF model directory, or None."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    cfg = cfg.get("text_config", cfg)
    return cfg["hidden_size"], cfg["num_hidden_layers"]
