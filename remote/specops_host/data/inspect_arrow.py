"""inspect_data.py's pass over the Arrow dataset (datasets' save_to_disk layout: state.json,
dataset_info.json, data-*.arrow): its columns, their types and lengths, token ids against the
verifier's vocabulary; what could not be read becomes violations in the report (never raises)."""

from pathlib import Path

from specops_host.datafmt import INFO, STATE, check_info, check_state, open_arrow, read_json


def first_line(e):
    """An exception's first line, <= 200 characters (its type name when it has no message)."""
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]


# -- the Arrow dataset ------------------------------------------------------------------------

class Dataset:
    """The Arrow dataset as far as it could be read: table None when it could not."""

    def __init__(self):
        self.table = None
        self.parts = []  # (arrow file, rows)
        self.state = None
        self.ok_columns = set()  # columns of the expected type
        self.id_range = None  # [min, max] of input_ids

    @property
    def rows(self):
        return None if self.table is None else self.table.num_rows

    def file_of(self, row):
        for f, n in self.parts:
            if row < n:
                return f
            row -= n
        return self.parts[-1][0] if self.parts else None

    def cell(self, col, row):
        if self.table is None or col not in self.ok_columns or row >= self.table.num_rows:
            return None
        return self.table.column(col)[row].as_py()


def read_dataset(root, rep, vocab, vname):
    import pyarrow as pa
    import pyarrow.compute as pc

    root = Path(root)
    ds = Dataset()
    state_path, info_path = root / STATE, root / INFO
    if not state_path.is_file():
        rep.bad(state_path, "missing: speculators reads the dataset with datasets.load_from_disk, which needs it "
                            "(re-run `inv prepare-data`)")
        return ds
    state, why = read_json(state_path)
    if why:
        rep.bad(state_path, why)
        return ds
    files, problems = check_state(state, root)
    for what in problems:
        rep.bad(state_path, what)
    ds.state = state if isinstance(state, dict) else None
    info, info_read = None, False
    if not info_path.is_file():
        rep.bad(info_path, "missing: datasets.load_from_disk reads it (re-run `inv prepare-data`)")
    else:
        info, why = read_json(info_path)
        if why:
            rep.bad(info_path, why)
        else:
            info_read = True
    tables = []
    for f in files:
        try:
            t = open_arrow(f)
        except Exception as e:  # noqa: BLE001 - whatever a corrupt file makes pyarrow raise (UnicodeDecodeError too)
            rep.bad(f, f"cannot read as Arrow: {type(e).__name__}: {first_line(e)}")
            continue
        tables.append(t)
        ds.parts.append((f, t.num_rows))
    if files and len(tables) == len(files):
        try:
            ds.table = pa.concat_tables(tables)
        except pa.ArrowException as e:
            odd = next((f for (f, _), t in zip(ds.parts, tables) if not t.schema.equals(tables[0].schema)), files[0])
            rep.bad(odd, f"schema differs from {files[0].name}'s ({first_line(e)}): one schema throughout is required")
    if info_read:  # (the columns are checked against the Arrow files' when they could be read)
        for what in check_info(info, None if ds.table is None else ds.table.column_names):
            rep.bad(info_path, what)
    if ds.table is None:
        return ds
    table = ds.table
    names = table.column_names
    fc = ds.state.get("_format_columns") if ds.state else None
    if isinstance(fc, list):
        for c in fc:
            if isinstance(c, str) and c not in names:
                rep.bad(state_path, f"_format_columns: {c!r} is not a column of the dataset (columns: {names})")
    where = files[0] if len(files) == 1 else root
    for need in ("input_ids", "loss_mask", "seq_len"):
        if need not in names:
            rep.bad(where, f"dataset has no column {need!r} (columns: {sorted(names)})")
    types = {c: table.schema.field(c).type for c in names}

    def list_of(t, ok_value):
        return (pa.types.is_list(t) or pa.types.is_large_list(t)) and ok_value(t.value_type)

    want = {"input_ids": (lambda t: list_of(t, pa.types.is_integer), "a list of integers"),
            "loss_mask": (lambda t: list_of(t, lambda v: pa.types.is_integer(v) or pa.types.is_boolean(v)),
                          "a list of integers (0/1)"),
            "seq_len": (pa.types.is_integer, "an integer")}
    for c, (ok, what) in want.items():
        if c in types:
            if ok(types[c]):
                ds.ok_columns.add(c)
            else:
                rep.bad(where, f"column {c}: type {types[c]}; expected {what}")
    for c in sorted(ds.ok_columns):
        nulls = table.column(c).null_count
        if nulls:
            rep.bad(where, f"column {c}: {nulls} null row(s)")

    def first_row(mask, what):
        """One violation for the rows where mask is true, naming the first one's file."""
        mask = pc.fill_null(mask, False)
        count = pc.sum(pc.cast(mask, pa.int64())).as_py() or 0
        if count:
            row = pc.index(mask, True).as_py()
            rep.bad(ds.file_of(row), what(row) + (f" ({count} row(s) in all)" if count > 1 else ""))

    ok = ds.ok_columns
    if "input_ids" in ok and "seq_len" in ok:
        lens, seq = pc.list_value_length(table.column("input_ids")), table.column("seq_len")
        first_row(pc.not_equal(pc.cast(lens, pa.int64()), pc.cast(seq, pa.int64())),
                  lambda r: f"seq_len: row {r} says {ds.cell('seq_len', r)} but its input_ids hold "
                            f"{len(ds.cell('input_ids', r) or [])} ids")
    if "input_ids" in ok and "loss_mask" in ok:
        a = pc.list_value_length(table.column("input_ids"))
        b = pc.list_value_length(table.column("loss_mask"))
        first_row(pc.not_equal(pc.cast(a, pa.int64()), pc.cast(b, pa.int64())),
                  lambda r: f"loss_mask: row {r} has {len(ds.cell('loss_mask', r) or [])} entries but "
                            f"{len(ds.cell('input_ids', r) or [])} input_ids")
    if "input_ids" in ok:
        col = table.column("input_ids")
        flat = pc.list_flatten(col)
        if len(flat):
            mm = pc.min_max(flat)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            ds.id_range = [lo, hi]
            if lo is not None and (lo < 0 or (vocab and hi >= vocab)):
                bad = pc.less(flat, 0) if not vocab else pc.or_(pc.less(flat, 0), pc.greater_equal(flat, vocab))
                bad = pc.fill_null(bad, False)
                k = pc.index(bad, True).as_py()
                count = pc.sum(pc.cast(bad, pa.int64())).as_py()
                row = pc.list_parent_indices(col)[k].as_py()
                ids = ds.cell("input_ids", row) or []
                pos = next((j for j, x in enumerate(ids) if x is not None and (x < 0 or (vocab and x >= vocab))), None)
                rng = f"[0, {vocab}) ({vname})" if vocab else "[0, ...): token ids are never negative"
                tok = ids[pos] if pos is not None else "?"
                rep.bad(ds.file_of(row), f"input_ids: row {row} position {pos} holds token id {tok}, "
                                         f"outside the verifier's vocabulary {rng}; {count} such id(s) in all: "
                                         f"tokenised for another model?")
    return ds
