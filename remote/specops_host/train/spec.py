"""The train spec (runs/R/train-spec.json) as the host reads it: stdlib, the same field names and
types as the laptop's pydantic model (specops/payloads.py TrainSpec; tests/test_trainspec.py
proves the two agree on every field).

`inv train` writes the spec; train/run.py, train/online.py and check/dist.py read it
with ``read(path)``: an unknown field, a missing required one or a value of the wrong type is
refused in one line naming the field (a spec written by another specops version, or by hand).
The reader returns a plain dict with every field present (absent optional ones at their default),
so the scripts index it (`spec["nnodes"]`) without guessing.
"""

import json
from pathlib import Path

from specops_host.contract import Refused

#: field -> (the JSON types it may hold, required, default). None is allowed for optional fields.
FIELDS: dict = {
    "run_dir": ((str,), True, None),
    "kind": ((str,), True, None),
    "nproc": ((int,), False, 1),
    "verifier": ((str,), False, None),
    "data": ((str,), False, None),
    "target_layer_ids": ((list,), False, None),
    "flags": ((dict,), False, {}),
    "hidden_states": ((str,), False, "offline"),
    "trust_remote_code": ((str, bool), False, "auto"),
    "online": ((dict,), False, None),
    "online_timing": ((dict,), False, None),
    "record": ((dict,), False, {}),
    "nnodes": ((int,), False, 1),
    "node_rank": ((int,), False, None),
    "rdzv_endpoint": ((str,), False, None),
    "rdzv_port": ((int,), False, None),
    "local_addr": ((str,), False, None),
    "nodes": ((list,), False, None),
    "scheduler": ((str,), False, None),
    "slurm_job_id": ((str,), False, None),
}
#: a list field's item type
ITEMS = {"target_layer_ids": int, "nodes": str}
KINDS = ("cpu", "cuda")
HIDDEN_STATES = ("offline", "online")


def _type_name(types):
    return " or ".join({"str": "a string", "int": "an integer", "bool": "true/false", "list": "a list",
                        "dict": "an object"}[t.__name__] for t in types)


def check(spec, where="the train spec"):
    """spec with every field present, or Refused naming the first field that breaks the contract."""
    if not isinstance(spec, dict):
        raise Refused(f"{where}: a JSON object is expected, got {type(spec).__name__}: write it again with `inv train`")
    unknown = sorted(set(spec) - set(FIELDS))
    if unknown:
        raise Refused(f"{where}: unknown field {unknown[0]!r} (the fields: {', '.join(FIELDS)}): written by another "
                      f"specops version? start it again with `inv train`")
    out = {}
    for name, (types, required, default) in FIELDS.items():
        value = spec.get(name)
        if value is None:
            if required:
                raise Refused(f"{where}: field {name!r} is missing ({_type_name(types)} is required)")
            out[name] = dict(default) if isinstance(default, dict) else default
            continue
        # (bool is an int in Python: an integer field takes no true/false)
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise Refused(f"{where}: field {name!r} is {type(value).__name__} {value!r:.60}, expected "
                          f"{_type_name(types)}")
        item = ITEMS.get(name)
        bad = [x for x in value if not isinstance(x, item) or isinstance(x, bool)] if item else []
        if bad:
            raise Refused(f"{where}: field {name!r} holds {type(bad[0]).__name__} {bad[0]!r:.40}, expected a list of "
                          f"{ {int: 'integer', str: 'string'}[item]}s")
        out[name] = value
    if out["kind"] not in KINDS:
        raise Refused(f"{where}: field 'kind' is {out['kind']!r}: cpu or cuda")
    if out["hidden_states"] not in HIDDEN_STATES:
        raise Refused(f"{where}: field 'hidden_states' is {out['hidden_states']!r}: offline or online")
    if out["hidden_states"] == "online" and out["online"] is None:
        raise Refused(f"{where}: field 'online' (the server's settings) is missing for online hidden states")
    return out


def read(path):
    """The spec at path, checked (Refused: one line naming the file and the field)."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise Refused(f"train spec {p}: no such file (`inv train` writes it)") from None
    except ValueError as e:
        raise Refused(f"train spec {p}: not JSON ({e})") from None
    return check(raw, f"train spec {p}")
