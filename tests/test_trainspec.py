"""The train spec, both sides: the laptop's pydantic TrainSpec (specops/payloads.py) and the host's
stdlib reader (remote/specops_host/train/spec.py) agree on every field's name, whether it is required, its
default and which JSON types it takes; a spec that breaks the contract is refused in one line
naming the field, on either side."""

from __future__ import annotations

import json
import typing

import pytest

from specops import paths
from specops.errors import SpecopsError
from specops.payloads import TrainSpec
from specops_host.train import spec as spec_reader

host = spec_reader

#: one value of each JSON type, to try against every field
SAMPLES = {str: "x", int: 3, bool: True, list: [1, 2], dict: {"a": 1}}
MINIMAL = {"run_dir": "/w/runs/r1", "kind": "cpu"}


def laptop_accepts(field: str, value) -> bool:
    spec = {**MINIMAL, field: value}
    if field == "hidden_states" and value == "x":
        return False
    try:
        TrainSpec.model_validate(spec)
        return True
    except Exception:  # noqa: BLE001  (any refusal of the model is the answer)
        return False


def host_accepts(field: str, value) -> bool:
    try:
        host.check({**MINIMAL, field: value})
        return True
    except host.Refused:
        return False


def test_the_two_sides_have_the_same_fields_required_and_defaults():
    fields = TrainSpec.model_fields
    assert list(fields) == list(host.FIELDS)
    for name, info in fields.items():
        _types, required, default = host.FIELDS[name]
        assert info.is_required() == required, name
        if not required:
            assert info.default == default, name


def test_the_two_sides_take_the_same_json_types_for_every_field():
    for name in host.FIELDS:
        for typ, value in SAMPLES.items():
            if name == "kind" or (name == "hidden_states" and typ is str):
                continue  # (a closed set of strings: below)
            assert laptop_accepts(name, value) == host_accepts(name, value), (name, typ.__name__)
    for name, good, bad in (("kind", "cuda", "tpu"), ("hidden_states", "offline", "sometimes")):
        assert laptop_accepts(name, good) and host_accepts(name, good)
        assert not laptop_accepts(name, bad) and not host_accepts(name, bad)


def test_what_the_laptop_writes_the_host_reads_back_whole(tmp_path):
    spec = TrainSpec(run_dir="/w/runs/r1", kind="cuda", nproc=2, verifier="/m/v", data="/w/data/d",
                     target_layer_ids=[1, 2], flags={"epochs": 2, "logger": "wandb"}, nnodes=2, node_rank=1,
                     rdzv_endpoint="10.0.0.1:29500", local_addr="10.0.0.2", nodes=["a", "b"],
                     record={"run_id": "r1"})
    p = tmp_path / "train-spec.json"
    p.write_text(spec.to_json())
    got = host.read(p)
    assert set(got) == set(host.FIELDS)
    assert {k: got[k] for k in spec.model_fields_set} == spec.model_dump(include=spec.model_fields_set)
    assert got["hidden_states"] == "offline" and got["online"] is None and got["trust_remote_code"] == "auto"
    # only what was set is written: the host fills in the rest
    assert set(json.loads(p.read_text())) == spec.model_fields_set


@pytest.mark.parametrize("bad,field", [({"nproc": "2"}, "nproc"), ({"nprocs": 2}, "nprocs"),
                                       ({"flags": ["epochs"]}, "flags"), ({"nnodes": True}, "nnodes"),
                                       ({"run_dir": None}, "run_dir")])
def test_a_broken_spec_is_one_line_naming_the_field_on_both_sides(tmp_path, bad, field):
    spec = {**MINIMAL, **bad}
    p = tmp_path / "train-spec.json"
    p.write_text(json.dumps(spec))
    with pytest.raises(host.Refused) as e:
        host.read(p)
    assert f"'{field}'" in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SpecopsError) as e:
        TrainSpec.of(spec)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_an_online_spec_without_its_server_is_refused_on_both_sides():
    spec = {**MINIMAL, "hidden_states": "online"}
    with pytest.raises(host.Refused, match="'online'"):
        host.check(spec)
    with pytest.raises(SpecopsError, match="online"):
        TrainSpec.of(spec)


def test_the_host_reader_refuses_a_missing_or_broken_file(tmp_path):
    with pytest.raises(host.Refused, match="no such file"):
        host.read(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(host.Refused, match="not JSON"):
        host.read(tmp_path / "bad.json")


def test_the_launchers_read_the_spec_through_the_checked_reader():
    for script in ("train/run", "check/dist"):
        text = (paths.HOST_PKG_DIR / f"{script}.py").read_text()
        assert "trainspec.read(" in text and "json.loads(Path(" not in text.split("trainspec.read(")[0][-400:], script
    assert typing.get_type_hints(TrainSpec)["run_dir"] is str


def test_every_host_script_reply_has_a_model():
    """Every run_script call in specops names the reply's model (specops/payloads.py): callers read
    attributes, and a reply outside the contract is one line naming the field."""
    import ast

    from specops import paths as p

    missing = []
    for f in sorted((p.REPO / "specops").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "run_script":
                if not any(k.arg == "model" for k in node.keywords):
                    missing.append(f"{f.relative_to(p.REPO)}:{node.lineno}")
    assert missing == []


def test_a_reply_outside_the_contract_is_one_line_naming_the_field():
    from fakes import RecordingTransport
    from specops import inventory
    from specops.contract import BEGIN, END
    from specops.host.remote_exec import run_script
    from specops.payloads import HiddenStatesPlan

    h = inventory.Host(name="h", transport="local", profile="cpu", venv="/v", workdir="/w")
    bad = RecordingTransport(h,
                             answers=[(r"specops_host\.train\.online", 0, f"{BEGIN}{json.dumps({'ok': True, 'mode': 'x'})}{END}")])
    with pytest.raises(SpecopsError, match=r"specops_host/train/online\.py on h answered outside the contract: mode: "):
        run_script(bad, "train.online", [], changes=False, model=HiddenStatesPlan)
    good = RecordingTransport(h, answers=[(r"specops_host\.train\.online", 0, f"{BEGIN}" + json.dumps(
        {"ok": True, "mode": "online", "notes": None, "need_bytes": 5}) + f"{END}")])
    p = run_script(good, "train.online", [], changes=False, model=HiddenStatesPlan)
    assert (p.mode, p.notes, p.need_bytes, p["need_bytes"], "need_bytes" in p, "rows" in p) == (
        "online", [], 5, 5, True, False)


def test_an_online_dry_run_asks_no_server_its_command_an_offline_ones(tmp_path):
    """The untrained control of an online run (`dry-run`: speculators saves the draft before it reads a row) runs as
    an offline run would: no --online, no endpoint, the verifier's server never started (train/run.py no_rows);
    test_real.py's must-show runs it for real; an online run that trains keeps its server."""
    from specops_host.train import run as host_run

    (tmp_path / "config.json").write_text("{}")
    online = {"layer_ids": [1, 2], "tensor_parallel": 1}
    spec = host.check({**MINIMAL, "verifier": str(tmp_path), "hidden_states": "online", "online": online,
                       "flags": {"dry-run": True, "on-missing": "generate", "epochs": 1}})
    dry = host_run.no_rows(spec)
    assert dry["hidden_states"] == "offline" and dry["flags"] == {"dry-run": True, "epochs": 1}
    argv = host_run.command(dry)
    assert "--online" not in argv and "--vllm-endpoint" not in argv and "--dry-run" in argv, argv
    trains = {**spec, "flags": {"epochs": 1}}
    assert host_run.no_rows(trains) is trains and "--online" in host_run.command(trains, "http://h:1/v1")
