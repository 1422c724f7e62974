"""The data stage's inputs, checked before anything starts (datagen.py --plan, and online.py's
plan): layer ids, a shard or row range, the rows to prepare, the verifier's vocabulary, a
dataset's record of how it was made, free disk, and a running train reading the dataset."""

import json
import os
import shutil
from pathlib import Path

from specops_host import contract
from specops_host.contract import Refused
from specops_host.datafmt import RECORD, file_sha256, hs_files, utf8_lines, utf8_text, verifier_vocab


HEADROOM = 1.10
def parse_layers(spec, n):
    if spec:
        try:
            ids = [int(x) for x in str(spec).replace(" ", "").split(",") if x != ""]
        except ValueError:
            raise Refused(f"--layers {spec!r}: give comma-separated integers, e.g. 2,{n // 2},{n - 3},{n}") from None
        if not ids:
            raise Refused(f"--layers {spec!r}: no layer id in it: give comma-separated integers, "
                          f"e.g. 2,{n // 2},{n - 3},{n}")
    else:
        ids = [2, n // 2, n - 3, n]
        if not all(a < b for a, b in zip(ids, ids[1:])) or ids[0] < 0:
            raise Refused(f"the verifier has {n} layers: speculators' default layer ids {ids} are not valid "
                          f"there; pass --layers explicitly (distinct, ascending, last = {n}), "
                          f"e.g. {max(n // 4, 1)},{n // 2},{n - 1},{n}")
    if len(set(ids)) != len(ids) or ids != sorted(ids):
        raise Refused(f"--layers {ids}: ids must be distinct and ascending")
    if min(ids) < 0 or max(ids) > n:
        raise Refused(f"--layers {ids}: the verifier has {n} layers, so ids must lie in [0, {n}]")
    if ids[-1] != n:
        raise Refused(f"--layers {ids}: the last id must be {n} (the residual stream before the final norm, "
                      f"which EAGLE-3 trains against)")
    if len(ids) < 2:
        raise Refused(f"--layers {ids}: give at least one auxiliary layer id before {n}")
    return ids


def parse_range(shard, rows, n_rows):
    """-> (start, end) rows, speculators' contiguous split for --shard i/n."""
    if shard and rows:
        raise Refused("give --shard or --rows, not both")
    if shard:
        try:
            i, n = (int(x) for x in shard.split("/"))
            assert 0 <= i < n
        except (ValueError, AssertionError):
            raise Refused(f"--shard {shard!r}: use i/n with 0 <= i < n, e.g. 0/4") from None
        chunk, rem = divmod(n_rows, n)
        start = i * chunk + min(i, rem)
        return start, start + chunk + (1 if i < rem else 0)
    if rows:
        try:
            a, b = rows.split(":")
            a, b = int(a or 0), int(b) if b else n_rows
            assert 0 <= a <= b
        except (ValueError, AssertionError):
            raise Refused(f"--rows {rows!r}: use a:b with 0 <= a <= b, e.g. 0:2000") from None
        return a, min(b, n_rows)
    return 0, n_rows


def rows_need_render(src):
    """True if the data are conversations (need the render endpoint), False if pre-tokenised."""
    p = Path(src)
    files = sorted(p.glob("*.json*")) if p.is_dir() else [p]
    if not files:
        raise Refused(f"{src}: no .json/.jsonl data found")
    for f, line, row in source_rows(src):  # (its first row: not JSON, or not an object, names file and line)
        if not isinstance(row, dict):
            raise Refused(f"--prepare {f}: {row_at(1, line)} is {json_kind(row)}, "
                          f"not an object with `conversations` or `input_ids` + `loss_mask`: fix the rows "
                          f"(nothing was started)")
        return not ("input_ids" in row and "loss_mask" in row)
    raise Refused(f"--prepare {src}: no rows in it: nothing to prepare")


def json_kind(v):
    """A JSON value's kind as JSON names it: 'a JSON array', 'a JSON number', 'JSON null', ..."""
    if v is None or isinstance(v, bool):
        return f"JSON {json.dumps(v)}"
    kinds = ((int, "number"), (float, "number"), (str, "string"), (list, "array"), (dict, "object"))
    return "a JSON " + next((k for t, k in kinds if isinstance(v, t)), type(v).__name__)


def row_at(n, line):
    """Where row n is: 'row 3 (line 3)' of a .jsonl file, 'row 3 of its JSON array' (the file holds
    one array: a first line `[1, 2, 3]` is an array of three rows, numbers)."""
    return f"row {n} (line {line})" if line else f"row {n} of its JSON array"


def source_rows(src):
    """(file, line, row) of every row of the --prepare data: a file's lines (.jsonl), or the rows
    of the JSON array it holds (a file that starts with `[`: line None); each file read as UTF-8 (a
    byte that is not: its line and offset, before anything starts)."""
    p = Path(src)
    for f in (sorted(p.glob("*.json*")) if p.is_dir() else [p]):
        with open(f, "rb") as fh:
            first = fh.read(1 << 12).lstrip()
        if first.startswith(b"["):
            text = utf8_text(f)
            try:
                rows = json.loads(text)
            except ValueError as e:
                raise Refused(f"--prepare {f}: not JSON ({e})") from None
            yield from ((f, None, r) for r in rows)
            continue
        for n, line in utf8_lines(f):
            if line.strip():
                try:
                    yield f, n, json.loads(line)
                except ValueError as e:
                    raise Refused(f"--prepare {f}: line {n} is not JSON ({e})") from None


def check_rows(src, verifier):
    """The cheap checks, before any server starts: every row is conversations or input_ids +
    loss_mask, and a pre-tokenised row's ids lie in the verifier's vocabulary."""
    vocab, where = verifier_vocab(verifier)
    n = 0
    for n, (f, line, row) in enumerate(source_rows(src), 1):
        at = f"--prepare {f}: {row_at(n, line)}"
        if isinstance(row, dict) and "input_ids" in row and "loss_mask" in row:
            ids = row["input_ids"]
            if not isinstance(ids, list) or not all(type(x) is int for x in ids):
                raise Refused(f"{at}: input_ids is not a list of integers (nothing was started)")
            bad = next((j for j, x in enumerate(ids) if x < 0 or (vocab and x >= vocab)), None)
            if bad is not None:
                rng = f"[0, {vocab}) ({where})" if vocab else "[0, ...): token ids are never negative"
                raise Refused(f"{at}: token id {ids[bad]} at position {bad} is outside the verifier's vocabulary "
                              f"{rng}: were the rows tokenised for another model? (nothing was started)")
        elif not (isinstance(row, dict) and isinstance(row.get("conversations"), list)):
            keys = ", ".join(map(str, row)) if isinstance(row, dict) else json_kind(row)
            raise Refused(f"{at} has neither `conversations` (a list of {{role, content}} turns) nor `input_ids` + "
                          f"`loss_mask` (it has: {keys or 'nothing'}): fix the rows (nothing was started)")
    if not n:
        raise Refused(f"--prepare {src}: no rows in it: nothing to prepare")
    return n


def read_record(data):
    try:
        rec = json.loads((Path(data) / RECORD).read_text())
        return rec if isinstance(rec, dict) else {}
    except (OSError, ValueError):
        return {}


def check_prepare_source(a, data):
    """The --prepare file: a non-empty regular file (or a folder of .json/.jsonl); and, where the
    dataset is already prepared, the same file and sequence length as then, unless --overwrite.
    Returns (already prepared and to be kept, the file's sha256)."""
    src = Path(a.prepare)
    if a.seq_length < 1:
        raise Refused(f"--seq-length {a.seq_length}: give the longest row in tokens, 1 or more (e.g. 2048)")
    if src.is_dir():
        digest = None
    elif not src.is_file():
        raise Refused(f"--prepare {a.prepare}: not a regular file (a .jsonl of conversations or input_ids + loss_mask)")
    elif src.stat().st_size == 0:
        raise Refused(f"--prepare {a.prepare}: the file is empty: nothing to prepare")
    else:
        digest = file_sha256(src)
    if not list(data.glob("*.arrow")) or a.overwrite:
        return False, digest
    was = read_record(data).get("prepared_from") or {}
    same = was.get("sha256") == digest and digest is not None and was.get("seq_length") == a.seq_length
    if not same:
        what = (f"from {was.get('path')} (sha256 {str(was.get('sha256'))[:12]}, seq length {was.get('seq_length')})"
                if was else "by an earlier prepare-data")
        raise Refused(f"{data} already holds a dataset prepared {what}: pass --overwrite to replace it (its hidden "
                      f"states go too), or give another --dataset (nothing was changed)")
    return True, digest


def check_layers_against_files(a, data, layer_ids):
    """Hidden-state files extracted with other layer ids are never relabelled: refused unless
    --overwrite (which removes them first)."""
    rec = read_record(data)
    if a.overwrite or not rec.get("layer_ids") or rec["layer_ids"] == layer_ids or not hs_files(data):
        return
    raise Refused(f"{data} holds hidden states extracted with layer ids {rec['layer_ids']}, not {layer_ids}: pass "
                  f"--overwrite to extract them again with the new ids, or give another --dataset "
                  f"(nothing was changed)")


def free_bytes(path):
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def reader_of(data):
    """The running job (a train: its run folder holds a train-spec.json) that reads the dataset
    at data, or None. Any running job counts, its record readable or not."""
    from specops_host.jobs import records

    me = Path(data).resolve()
    for rec in records.all_jobs():
        if rec["state"] != "running" or not rec.get("dir"):
            continue
        d = contract.read_json(Path(rec["dir"]) / "train-spec.json")
        used = d.get("data") if isinstance(d, dict) else None
        if isinstance(used, str) and Path(os.path.expanduser(used)).resolve() == me:
            return rec
    return None


def refuse_if_in_use(a, data):
    """--overwrite replaces what a running train reads (it would die mid-run: `Failed to load
    hidden states`): refused, naming the run."""
    rec = reader_of(data) if a.overwrite and (a.prepare or a.extract) else None
    if rec:
        raise Refused(f"{data} is the dataset of the running train {rec['run_id']!r} (pid {rec.get('pid')}): "
                      f"--overwrite would change its files under it; stop it first (`inv stop --run-id "
                      f"{rec['run_id']}`), wait for its end, or give another --dataset (nothing was changed)")
