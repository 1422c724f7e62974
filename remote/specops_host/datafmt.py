"""Data layouts specops knows, and cheap readers for them (stdlib + pyarrow only at import).

- speculators 0.9: an Arrow dataset saved with `datasets` (state.json, dataset_info.json,
  data-*.arrow; columns input_ids, loss_mask, seq_len) plus hidden_states/hs_{i}.safetensors
  holding `hidden_states` bf16 [seq, n_layers, hidden] and `token_ids` int64 [seq].
- legacy speculators v0.3: rows_*/data_*.pt ({input_ids, hidden_states: list of [seq, hidden],
  loss_mask}) plus data_config.json. speculators 0.9 can no longer read it.
- SpecForge: data_*.ckpt ({input_ids, loss_mask, hidden_state, aux_hidden_state}).

Below the stages that share it: data/, train/online.py, serve/evaluate.py (the Arrow columns, the
verifier's positions) and serve/vllm_server.py (the model-length check). The validators here never
raise on bad input: they return one-line problems, each naming the field (the caller names the file).
"""

import json
import re
from pathlib import Path

from specops_host.contract import Refused

HS_DIR = "hidden_states"
HS_NAME = re.compile(r"^hs_(\d+)\.safetensors$")
LEGACY_NAME = re.compile(r"^data_(\d+)\.pt$")
RECORD = "specops-data.json"  # what specops knows about how the data was made
STATE = "state.json"
INFO = "dataset_info.json"


def detect(root):
    root = Path(root)
    if not root.is_dir():
        return None
    if (root / STATE).is_file() or list(root.glob("data-*.arrow")):
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


def file_sha256(path) -> str:
    """A file's sha256, read 1 MiB at a time (a data source's record, a downloaded wheel's pin)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- JSON type helpers ------------------------------------------------------------------------

def jtype(v):
    """The JSON name of v's type, for messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def short(v, n=60):
    """v as compact JSON, cut to n characters (a message never grows with the input)."""
    try:
        s = json.dumps(v, separators=(", ", ": "))
    except (TypeError, ValueError, RecursionError):
        s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def is_uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def is_u64(v):
    return is_uint(v) and v < 1 << 64


def is_posint(v):
    return is_uint(v) and v > 0


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def read_json(path):
    """(value, problem): the parsed JSON of a file, or (None, one line saying why not)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        return None, f"cannot read: {e.strerror or e}"
    try:
        return json.loads(raw.decode("utf-8")), None
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 (byte {e.start}): not a JSON file"
    except ValueError as e:  # JSONDecodeError: "Expecting ',' delimiter: line 1 column 5 (char 4)"
        return None, f"not valid JSON ({str(e).splitlines()[0]})"
    except RecursionError:
        return None, "not valid JSON (nested too deeply)"


# -- the Arrow dataset (datasets' save_to_disk layout) ---------------------------------------

#: datasets' format types and their aliases (state.json "_format_type")
FORMAT_TYPES = {None, "python", "arrow", "pa", "pyarrow", "numpy", "np", "pandas", "pd", "custom", "polars",
                "pl", "torch", "pt", "pytorch", "tensorflow", "tf", "jax"}
SPLIT_NAME = re.compile(r"^\w+(\.\w+)*$")


def check_state(state, root):
    """(arrow files, problems) of a parsed state.json: the fields `datasets.load_from_disk` reads,
    by type; each data file a plain name that exists under root."""
    if not isinstance(state, dict):
        return [], [f"{jtype(state)}; expected an object (datasets' save_to_disk state)"]
    problems, files = [], []
    df = state.get("_data_files")
    if "_data_files" not in state:
        problems.append("no _data_files field: the list of Arrow files of the dataset")
    elif not isinstance(df, list) or not df:
        problems.append(f"_data_files: {short(df)}; expected a non-empty list of {{\"filename\": ...}}")
    else:
        for k, e in enumerate(df):
            fn = e.get("filename") if isinstance(e, dict) else None
            if not isinstance(fn, str) or not fn or fn in (".", "..") or "/" in fn or "\\" in fn or "\0" in fn:
                problems.append(f"_data_files[{k}]: {short(e)}; expected {{\"filename\": NAME}}, a file name in "
                                f"the dataset directory")
            elif not (Path(root) / fn).is_file():
                problems.append(f"_data_files[{k}].filename: {fn!r} does not exist in {root}")
            else:
                files.append(Path(root) / fn)
    rules = {
        "_fingerprint": (lambda v: isinstance(v, str), "a string"),
        "_format_type": (lambda v: (v is None or isinstance(v, str)) and v in FORMAT_TYPES,
                         "null or a datasets format type (torch, numpy, arrow, ...)"),
        "_format_kwargs": (lambda v: isinstance(v, dict), "an object"),
        "_format_columns": (lambda v: v is None or (isinstance(v, list) and all(isinstance(c, str) for c in v)),
                            "null or a list of column names"),
        "_output_all_columns": (lambda v: isinstance(v, bool), "true or false"),
        "_split": (lambda v: v is None or (isinstance(v, str) and bool(SPLIT_NAME.match(v))),
                   "null or a split name (letters, digits, '_', '.')"),
    }
    for key, (ok, want) in rules.items():
        if key not in state:
            problems.append(f"no {key} field: datasets.load_from_disk reads it")
        elif not ok(state[key]):
            problems.append(f"{key}: {short(state[key])}; expected {want}")
    return files, problems


#: datasets' feature types ("_type" in dataset_info.json; Sequence is the pre-4.0 name of List)
FEATURE_TYPES = {"Value", "ClassLabel", "Translation", "TranslationVariableLanguages", "LargeList", "List",
                 "Sequence", "Array2D", "Array3D", "Array4D", "Array5D", "Audio", "Image", "Mesh", "Video", "Pdf",
                 "Nifti", "BioSequence", "BioStructure", "Json"}
INT_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
#: the features speculators reads: (list of values?, value dtypes allowed)
COLUMN_FEATURES = {"input_ids": (True, INT_DTYPES), "loss_mask": (True, INT_DTYPES | {"bool"}),
                   "seq_len": (False, INT_DTYPES)}


def _feature_problem(f, want=None):
    """Why feature f is not valid (None if it is); want: (is a list, allowed value dtypes)."""
    if isinstance(f, list):  # the legacy sequence form: [feature]
        if len(f) != 1:
            return f"{short(f)}; a list feature holds exactly one feature"
        f = {"_type": "List", "feature": f[0]}
    if not isinstance(f, dict) or not isinstance(f.get("_type"), str):
        return f"{short(f)}; expected a feature object with a \"_type\""
    if f["_type"] not in FEATURE_TYPES:
        return f"_type {short(f['_type'])} is not a datasets feature type"
    if want is None:
        return None
    is_list, dtypes = want
    if is_list:
        if f["_type"] not in ("List", "Sequence", "LargeList"):
            return f"_type {f['_type']!r}; expected List (a list of token ids / mask values)"
        f = f.get("feature")
        if isinstance(f, list) or not isinstance(f, dict):
            return f"feature: {short(f)}; expected a Value feature"
    if f.get("_type") != "Value" or not isinstance(f.get("dtype"), str) or f["dtype"] not in dtypes:
        return f"{short(f)}; expected a Value of {'/'.join(sorted(dtypes)[:4])}..."
    return None


def check_info(info, columns=None):
    """Problems of a parsed dataset_info.json: an object; `features`, when given, an object with one
    valid feature per Arrow column (the columns speculators reads: lists of integers, an integer)."""
    if not isinstance(info, dict):
        return [f"{jtype(info)}; expected an object (datasets' DatasetInfo)"]
    feats = info.get("features")
    if feats is None:
        return []
    if not isinstance(feats, dict):
        return [f"features: {jtype(feats)}; expected an object {{column: feature}}"]
    problems = []
    for col, f in feats.items():
        why = _feature_problem(f, COLUMN_FEATURES.get(col))
        if why:
            problems.append(f"features.{col[:40]}: {why}")
    if columns is not None and set(feats) != set(columns):
        problems.append(f"features: columns {short(sorted(feats))} but the Arrow files hold {short(sorted(columns))}: "
                        f"datasets refuses the mismatch")
    return problems


def open_arrow(path):
    """The pyarrow Table of one Arrow file (IPC stream, as datasets writes, or IPC file), validated
    in full; an exception (ArrowException, OSError, UnicodeDecodeError, ...) if it is not one."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as src:
        try:
            table = pa.ipc.open_stream(src).read_all()
        except pa.ArrowInvalid:
            src.seek(0)
            table = pa.ipc.open_file(src).read_all()
    table.validate(full=True)  # (corrupt offsets would otherwise surface later, or crash a compute kernel)
    return table


def dataset_files(root):
    """The Arrow files of a dataset dir, per its state.json (or data-*.arrow without one);
    Refused (one line) if state.json does not say which they are (its other fields are
    inspect-data's business)."""
    root = Path(root)
    state_path = root / STATE
    if state_path.is_file():
        state, why = read_json(state_path)
        if why:
            raise Refused(f"{state_path}: {why}")
        files, problems = check_state(state, root)
        problems = [p for p in problems if "_data_files" in p or not isinstance(state, dict)]
        if problems:
            raise Refused(f"{state_path}: {problems[0]}")
        return files
    return sorted(root.glob("data-*.arrow"))


def read_arrow_columns(root, columns):
    """{column: list} from the dataset's Arrow files (datasets' save_to_disk layout)."""
    import pyarrow as pa

    tables = []
    for f in dataset_files(root):
        try:
            tables.append(open_arrow(f))
        except Exception as e:  # noqa: BLE001 - whatever a corrupt file makes pyarrow raise
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise Refused(f"{f}: cannot read as Arrow ({why})") from None
    try:
        table = pa.concat_tables(tables) if tables else pa.table({})
    except pa.ArrowException as e:
        raise Refused(f"{root}: the Arrow files disagree on the schema ({str(e).splitlines()[0]})") from None
    out = {}
    for c in columns:
        if c in table.column_names:
            out[c] = table.column(c).to_pylist()
    out["_num_rows"] = table.num_rows
    out["_columns"] = {name: str(table.schema.field(name).type) for name in table.column_names}
    return out


# -- the verifier's config and specops' extraction record ------------------------------------

def check_verifier(cfg):
    """(info, problems, warnings) of a parsed HF config.json: info {hidden_size, num_hidden_layers,
    vocab_size, text_config} read through `text_config` when there is one (multimodal wrappers
    such as Kimi-K2.5 keep the language model's fields there)."""
    if not isinstance(cfg, dict):
        return None, [f"{jtype(cfg)}; expected an object (a HF model config)"], []
    inner, prefix = cfg, ""
    if "text_config" in cfg and cfg["text_config"] is not None:
        if not isinstance(cfg["text_config"], dict):
            return None, [f"text_config: {jtype(cfg['text_config'])}; expected an object "
                          f"(the language model's config)"], []
        inner, prefix = cfg["text_config"], "text_config."
    info = {"text_config": bool(prefix)}
    problems, warnings = [], []
    for key in ("hidden_size", "num_hidden_layers"):
        v = inner.get(key)
        if key not in inner:
            problems.append(f"{prefix}{key}: missing" + (" (read through text_config)" if prefix else
                                                        " (a multimodal wrapper keeps it under text_config)"))
        elif not is_posint(v):
            problems.append(f"{prefix}{key}: {short(v)}; expected a positive integer")
        else:
            info[key] = v
    key, src, vocab = "vocab_size", inner, inner.get("vocab_size")
    if "vocab_size" not in inner and "vocab_size" in cfg:
        src, prefix, vocab = cfg, "", cfg.get("vocab_size")
    if "vocab_size" not in src:
        warnings.append(f"{prefix}vocab_size: missing, token ids not checked against the vocabulary")
    elif not is_posint(vocab):
        problems.append(f"{prefix}vocab_size: {short(vocab)}; expected a positive integer")
    else:
        info["vocab_size"] = vocab
    return info, problems, warnings


def verifier_config(path):
    """(hidden_size, num_hidden_layers) of a HF model directory (through text_config when the
    config wraps one), None without a config.json; Refused if the config is not valid."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        return None
    cfg, why = read_json(cfg_path)
    if why:
        raise Refused(f"{cfg_path}: {why}")
    info, problems, _ = check_verifier(cfg)
    if problems:
        raise Refused(f"{cfg_path}: {problems[0]}")
    return info["hidden_size"], info["num_hidden_layers"]


def verifier_positions(verifier):
    """(max_position_embeddings, where it is read) of the verifier's config.json (through text_config
    where there is one), or (None, None)."""
    cfg, why = read_json(Path(verifier) / "config.json")
    if why or not isinstance(cfg, dict):
        return None, None
    inner = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    key = "text_config.max_position_embeddings" if inner is not cfg else "max_position_embeddings"
    v = inner.get("max_position_embeddings")
    return (v, f"{key} of {verifier}/config.json") if type(v) is int and v > 0 else (None, None)


def verifier_vocab(verifier):
    """(vocab_size, where it is read) of the verifier, or (None, None)."""
    cfg, why = read_json(Path(verifier) / "config.json")
    info = check_verifier(cfg)[0] if not why else None
    return ((info or {}).get("vocab_size"), f"vocab_size of {verifier}/config.json")


def check_model_len(max_model_len, verifier, source):
    """A vLLM server's --max-model-len within the verifier's positions, before any server starts
    (vLLM's own refusal comes after its start, as a pydantic ValidationError in the server's log).
    source: what set it (a flag, the longest row)."""
    mpe, where = verifier_positions(verifier)
    if max_model_len and mpe and max_model_len > mpe:
        raise Refused(f"{source} makes the vLLM server's --max-model-len {max_model_len}, but the verifier holds "
                      f"{mpe} positions ({where}): give --seq-length {mpe - 1} or less (nothing was started)"
                      if source.startswith("--seq-length") else
                      f"{source} makes the vLLM server's --max-model-len {max_model_len}, but the verifier holds "
                      f"{mpe} positions ({where}): give --max-model-len {mpe} or less (nothing was started)")


def check_layer_ids(v):
    """Problem with a layer id list on its own (None if fine): distinct, ascending, non-negative."""
    if not isinstance(v, list) or not v or not all(is_uint(x) for x in v):
        return f"{short(v)}; expected a non-empty list of non-negative integers"
    if any(a >= b for a, b in zip(v, v[1:])):
        return f"{short(v)}; ids must be distinct and ascending"
    return None


#: specops-data.json fields: (valid?, what is expected)
RECORD_FIELDS = {
    "verifier": (lambda v: isinstance(v, str) and v != "", "a path (a non-empty string)"),
    "converted_from": (lambda v: isinstance(v, str), "a string"),
    "format": (lambda v: isinstance(v, str), "a string"),
    "backend": (lambda v: isinstance(v, str), "a string"),
    "data_dir": (lambda v: isinstance(v, str), "a string"),
    "updated": (is_number, "a number (a unix time)"),
    "stored_layers": (is_posint, "a positive integer"),
    "hidden_size": (is_posint, "a positive integer"),
    "num_hidden_layers": (is_posint, "a positive integer"),
}


def check_record(rec):
    """(clean record, problems) of a parsed specops-data.json: fields of the wrong type are
    dropped from the clean record (unknown fields pass through)."""
    if not isinstance(rec, dict):
        return {}, [f"{jtype(rec)}; expected an object (specops' extraction record)"]
    clean, problems = {}, []
    for k, v in rec.items():
        if k == "layer_ids":
            why = check_layer_ids(v)
            if why:
                problems.append(f"layer_ids: {why}")
                continue
        elif k in RECORD_FIELDS and not RECORD_FIELDS[k][0](v):
            problems.append(f"{k}: {short(v)}; expected {RECORD_FIELDS[k][1]}")
            continue
        clean[k] = v
    ids, n = clean.get("layer_ids"), clean.get("stored_layers")
    if ids is not None and n is not None and n != len(ids):
        problems.append(f"stored_layers: {n} but layer_ids {short(ids)} name {len(ids)} layer(s)")
        del clean["stored_layers"]
    return clean, problems


# -- text files as their readers read them: UTF-8 ----------------------------------------------
def not_utf8(what, f, e, line, offset):
    """The one line of a byte that is not UTF-8 (e: the UnicodeDecodeError): the file, its line, the
    byte and its offset in the file."""
    return Refused(f"{what} {f}: line {line} is not UTF-8: byte 0x{e.object[e.start]:02x} at byte offset {offset} "
                   f"of the file ({e.reason}); speculators and vLLM read it as UTF-8: save it as UTF-8 (e.g. "
                   f"iconv -f latin1 -t utf-8) (nothing was started)")


def utf8_lines(f, what="--prepare"):
    """(line number, text) of each line of the file, decoded as UTF-8 as the readers after it decode
    it; Refused naming the line and the byte offset of the first byte that is not UTF-8."""
    with open(f, "rb") as fh:
        offset = 0
        for n, raw in enumerate(fh, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise not_utf8(what, f, e, n, offset + e.start) from None
            yield n, text
            offset += len(raw)


def utf8_text(f, what="--prepare"):
    """The whole file as UTF-8 text, or Refused as utf8_lines'."""
    raw = Path(f).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise not_utf8(what, f, e, raw.count(b"\n", 0, e.start) + 1, e.start) from None
