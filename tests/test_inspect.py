"""inspect-data over the real sshd, run by the real cpu venv: a valid set and each bad case."""

import json
import shutil
import struct
from pathlib import Path

import pytest

from conftest import inv
from specops import inventory, synth
from specops.host.connection import connect


def corrupt_nan(p: Path):
    hdr_len = struct.unpack("<Q", p.read_bytes()[:8])[0]
    data = bytearray(p.read_bytes())
    data[8 + hdr_len: 8 + hdr_len + 2] = b"\xc0\x7f"  # bf16 NaN
    p.write_bytes(bytes(data))


def rewrite_header(p: Path, fn):
    """Apply fn to the file's safetensors header (a dict), keeping its data bytes."""
    raw = p.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    fn(hdr)
    new = json.dumps(hdr).encode()
    p.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def negative_offsets(h):
    h["token_ids"]["data_offsets"][0] = -8


def overlapping_offsets(h):
    h["token_ids"]["data_offsets"] = [o - 16 for o in h["token_ids"]["data_offsets"]]


def token_mismatch(p: Path):
    raw = p.read_bytes()
    p.write_bytes(raw[:-8] + struct.pack("<q", 999999))  # last token id


CASES = {
    "wrong_hidden": (lambda d, r: shutil.copy(d / "cfg32" / "config.json", d / "cfg" / "config.json"),
                     "hidden size 64 but the verifier's hidden_size is 32"),
    "missing_file": (lambda d, r: (d / "set/hidden_states/hs_3.safetensors").unlink(),
                     "1 dataset row(s) have no file: hs_3.safetensors"),
    "nan": (lambda d, r: corrupt_nan(d / "set/hidden_states/hs_2.safetensors"), "NaN"),
    "token_mismatch": (lambda d, r: token_mismatch(d / "set/hidden_states/hs_5.safetensors"),
                       "token_ids differ from dataset row 5 input_ids"),
    "mixed_dtypes": (lambda d, r: synth.write_hs(d / "set/hidden_states/hs_1.safetensors", r[1]["input_ids"], 4, 64,
                                                 dtype="F16"), "mixed dtypes"),
    "truncated": (lambda d, r: (d / "set/hidden_states/hs_4.safetensors").write_bytes(
        (d / "set/hidden_states/hs_4.safetensors").read_bytes()[:-100]), "truncated"),
    "zeroed": (lambda d, r: synth.write_hs(d / "set/hidden_states/hs_6.safetensors", r[6]["input_ids"], 4, 64,
                                           fill=0.0), "all zero"),
    "wrong_format": (lambda d, r: [shutil.rmtree(d / "set"), (d / "set").mkdir(), (d / "set" / "x.bin").write_bytes(b"x")],
                     "holds no recognised format"),
    "wrong_layers": (None, "4 stored layers per position, expected 3"),
    # every header field is validated in the header pass (before: these passed with the default sample)
    "negative_offsets": (lambda d, r: rewrite_header(d / "set/hidden_states/hs_2.safetensors", negative_offsets),
                         'hs_2.safetensors: tensor "token_ids" data_offsets: [-8, '),
    "overlapping_offsets": (lambda d, r: rewrite_header(d / "set/hidden_states/hs_6.safetensors", overlapping_offsets),
                            'hs_6.safetensors: tensor "token_ids" data_offsets: '),
    "unknown_dtype": (lambda d, r: rewrite_header(d / "set/hidden_states/hs_0.safetensors",
                                                  lambda h: h["hidden_states"].update(dtype="BF61")),
                      'hs_0.safetensors: tensor "hidden_states" dtype: "BF61" is not a safetensors dtype'),
    "bad_record": (lambda d, r: (d / "set/specops-data.json").write_text('{"layer_ids": "2,4,8"}'),
                   'specops-data.json: layer_ids: "2,4,8"; expected a non-empty list of non-negative integers'),
    "bad_state": (lambda d, r: (d / "set/state.json").write_text('{"_data_files": [{"filename": 3}]}'),
                  'state.json: _data_files[0]: {"filename": 3}; expected {"filename": NAME}'),
}


def build(tmp_path):
    rows = synth.make(tmp_path / "set", rows=8, seq=24, n_layers=4, hidden=64)
    synth.verifier_config(tmp_path / "cfg", 64, 8)
    synth.verifier_config(tmp_path / "cfg32", 32, 8)
    return rows


def push_and_inspect(cpu_box, hosts_file, tmp_path, name, *extra, work=None, sample="8"):
    h = inventory.load(str(hosts_file)).get("box")
    remote = f"{work}/data/test-{name}"
    with connect(h) as t:
        t.check(f"rm -rf {remote}", "clean")
        t.sync_up(str(tmp_path), remote)
    return inv("inspect-data", "--host", "box", "--hosts", str(hosts_file), "--path", f"{remote}/set",
               "--verifier", f"{remote}/cfg", "--sample", sample, *extra)


def test_valid_data_passes(cpu_box, hosts_file, tmp_path, work):
    build(tmp_path)
    r = push_and_inspect(cpu_box, hosts_file, tmp_path, "valid", "--json", work=work)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    res = json.loads(r.stdout)
    assert res["format"] == "speculators-0.9" and res["rows"] == 8 and res["files"] == 8
    assert res["hidden_size"] == 64 and res["stored_layers"] == 4 and res["dtypes"] == {"BF16": 8}
    assert len(res["sampled"]) == 8 and res["violations"] == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_data_detected(cpu_box, hosts_file, tmp_path, case, work):
    rows = build(tmp_path)
    fn, expect = CASES[case]
    extra = ["--layers", "3"] if case == "wrong_layers" else []
    if fn:
        fn(tmp_path, rows)
    r = push_and_inspect(cpu_box, hosts_file, tmp_path, case, *extra, work=work)
    assert r.returncode != 0, r.stdout[-2000:]
    err = r.stderr.strip()
    assert err.startswith("specops: inspect-data: ") and "\n" not in err, err
    assert expect in err or expect in r.stdout, (expect, err, r.stdout[-1500:])


def test_verifier_contract_through_text_config(cpu_box, hosts_file, tmp_path, work):
    """A wrapper config (text_config, as Kimi-K2.5): a token id >= vocab_size in the dataset and in
    the sampled file, the record's layer ids not ending at num_hidden_layers, its hidden size."""
    rows = build(tmp_path)
    rows[5]["input_ids"][-1] = 1000
    synth.write_dataset(tmp_path / "set", rows)
    synth.write_hs(tmp_path / "set/hidden_states/hs_5.safetensors", rows[5]["input_ids"], 4, 64)
    (tmp_path / "cfg" / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"hidden_size": 64, "num_hidden_layers": 61, "vocab_size": 1000}}))
    (tmp_path / "set" / "specops-data.json").write_text(json.dumps(
        {"layer_ids": [2, 30, 58, 60], "stored_layers": 4, "hidden_size": 32}))
    r = push_and_inspect(cpu_box, hosts_file, tmp_path, "contract", "--json", work=work)
    assert r.returncode != 0
    res = json.loads(r.stdout)
    assert (res["verifier_text_config"], res["verifier_num_hidden_layers"],
            res["verifier_vocab_size"]) == (True, 61, 1000)
    got = {(Path(v["file"]).name, v["what"].split(" ")[0]): v["what"] for v in res["violations"]}
    assert got[("data-00000-of-00001.arrow", "input_ids:")].startswith(
        "input_ids: row 5 position 28 holds token id 1000, outside the verifier's vocabulary [0, 1000) "
        "(text_config.vocab_size of "), got
    assert got[("hs_5.safetensors", "token_ids:")].startswith(
        "token_ids: position 28 holds token id 1000, outside the verifier's vocabulary [0, 1000)"), got
    assert got[("specops-data.json", "layer_ids")].startswith(
        "layer_ids [2, 30, 58, 60]: the last id must be 61, text_config.num_hidden_layers of"), got
    assert any(Path(v["file"]).name == "specops-data.json" and v["what"].startswith(
        "hidden_size: 32 but text_config.hidden_size of") for v in res["violations"]), got
    assert len(res["violations"]) == 5, res["violations"]  # (+ the record's 32 against the files' 64)


def test_bad_arguments_are_one_refused_line(cpu_box, hosts_file, work):
    from specops.host.push import push
    from specops.host.remote_exec import run_script

    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        push(t)
        for args, expect in ((["--sample", "-1"], "--sample -1: give how many files to load fully"),
                             (["--sample", "many"], "argument --sample: invalid int value: 'many'"),
                             (["--layers", "0"], "--layers 0: give the stored layers per position")):
            res = run_script(t, "data.inspect_data", ["--path", f"{work}/data", *args], changes=False)
            assert res["ok"] is False and res.get("refused") and res["exit"] == 2, res
            assert expect in res["error"] and "\n" not in res["error"], res


LEGACY = r'''
import json, sys, torch
from pathlib import Path
root = Path(sys.argv[1])
g = torch.Generator().manual_seed(0)
for i in range(5):
    d = root / ("rows_0-2000" if i < 3 else "rows_2000-4000")
    d.mkdir(parents=True, exist_ok=True)
    n = 10 + i
    torch.save({"input_ids": torch.randint(0, 500, (n,), generator=g),
                "hidden_states": [torch.randn(n, 64, generator=g).to(torch.bfloat16) for _ in range(4)],
                "loss_mask": torch.ones(n, dtype=torch.long)}, d / f"data_{i}.pt")
(root / "data_config.json").write_text(json.dumps({"layer_ids": [1, 3, 5, 8]}))
'''


def test_legacy_detected_then_converted(cpu_box, hosts_file, tmp_path, work):
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        t.check(f"rm -rf {work}/data/legacy {work}/data/converted && mkdir -p {work}/data", "clean")
        gen = tmp_path / "gen.py"
        gen.write_text(LEGACY)
        t.put(str(gen), f"{work}/data/gen_legacy.py")
        t.check(f"cd {work}/data && {cpu_box['venv']}/bin/python3 gen_legacy.py legacy", "make legacy data")
    synth.verifier_config(tmp_path / "cfg", 64, 8)
    with connect(h) as t:
        t.sync_up(str(tmp_path / "cfg"), f"{work}/data/cfg64")
    r = inv("inspect-data", "--host", "box", "--hosts", str(hosts_file), "--path", f"{work}/data/legacy")
    assert r.returncode != 0 and "format legacy-v0.3" in r.stderr and "inv convert-data" in r.stderr
    r = inv("convert-data", "--host", "box", "--hosts", str(hosts_file), "--src", f"{work}/data/legacy",
            "--dst", f"{work}/data/converted", "--verifier", f"{work}/data/cfg64")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "converted 5 rows" in r.stdout and "verdict: OK" in r.stdout
    # nothing is overwritten
    r = inv("convert-data", "--host", "box", "--hosts", str(hosts_file), "--src", f"{work}/data/legacy",
            "--dst", f"{work}/data/converted")
    assert r.returncode != 0 and "not empty" in r.stderr


def test_convert_failure_leaves_nothing_and_the_rerun_works(cpu_box, hosts_file, tmp_path, work):
    """A corrupt source file: one line naming it, nothing at --dst nor next to it (the temp dir is
    gone), so the re-run after the fix just works; --dst a file: one line."""
    h = inventory.load(str(hosts_file)).get("box")
    d = f"{work}/data/conv-fail"
    gen = tmp_path / "gen.py"
    gen.write_text(LEGACY)
    with connect(h) as t:
        t.check(f"rm -rf {d} && mkdir -p {d}", "clean")
        t.put(str(gen), f"{d}/gen_legacy.py")
        t.check(f"cd {d} && {cpu_box['venv']}/bin/python3 gen_legacy.py legacy && cp legacy/rows_2000-4000/data_3.pt "
                f"good.pt && head -c 300 good.pt > legacy/rows_2000-4000/data_3.pt && echo x > a-file", "legacy data")
    conv = ["convert-data", "--host", "box", "--hosts", str(hosts_file), "--src", f"{d}/legacy"]
    r = inv(*conv, "--dst", f"{d}/out/new")
    err = r.stderr.strip()
    assert r.returncode != 0 and "\n" not in err, err
    assert "legacy/rows_2000-4000/data_3.pt: cannot convert" in err and "nothing was written" in err, err
    with connect(h) as t:
        left = t.run(f"ls -A {d}/out").stdout.split()
    assert left == [], left  # no partial new/, no .new.converting-PID
    r = inv(*conv, "--dst", f"{d}/a-file")
    err = r.stderr.strip()
    assert r.returncode != 0 and "\n" not in err and "a-file is a file, not a directory" in err, err
    with connect(h) as t:
        t.check(f"cp {d}/good.pt {d}/legacy/rows_2000-4000/data_3.pt && test \"$(cat {d}/a-file)\" = x", "fix")
    r = inv(*conv, "--dst", f"{d}/out/new")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "converted 5 rows" in r.stdout and "verdict: OK" in r.stdout


def test_the_full_load_sample_is_seeded_shown_and_counted(cpu_box, hosts_file, tmp_path, work):
    """The files loaded fully differ from run to run (a new seed each time, shown); --seed repeats
    a sample; the result says how many files were checked in full, of how many."""
    build(tmp_path)
    runs = [json.loads(push_and_inspect(cpu_box, hosts_file, tmp_path, "seeded", "--json", work=work,
                                        sample="3").stdout) for _ in range(3)]
    assert all(r["full_checked"] == 3 and r["files"] == 8 for r in runs)
    assert len({r["seed"] for r in runs}) > 1, "the same seed three times"
    same = [json.loads(push_and_inspect(cpu_box, hosts_file, tmp_path, "seeded", "--json", "--seed", "7",
                                        work=work, sample="3").stdout) for _ in range(2)]
    assert same[0]["seed"] == same[1]["seed"] == 7
    assert [s["file"] for s in same[0]["sampled"]] == [s["file"] for s in same[1]["sampled"]]
    r = push_and_inspect(cpu_box, hosts_file, tmp_path, "seeded", "--seed", "7", work=work, sample="3")
    assert r.returncode == 0 and "3 of 8 file(s) fully loaded (seed 7: --seed 7 loads the same ones)" in r.stdout, \
        r.stdout
    r = push_and_inspect(cpu_box, hosts_file, tmp_path, "seeded", "--seed", "abc", work=work)
    assert r.returncode == 2 and "--seed" in r.stderr and "Traceback" not in r.stderr, r.stderr
