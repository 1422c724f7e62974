"""Nothing replaced or mislabelled without asking, one name rule on both sides, hints that act on
the same host (issue: data and runs you can trust). Over the real sshd."""

import json
from pathlib import Path

import pytest

from conftest import inv
from specops import inventory
from specops.ops import data, jobs
from specops.host.connection import connect
from specops.contract import name_problem
from specops.errors import SpecopsError


@pytest.mark.parametrize("bad", ["x\n", "../x", "/abs", "a/b", ".hidden", "-x", "a b", "é", "x" * 129, ""])
def test_one_name_rule_on_the_laptop_and_the_host(bad, light_host):
    """The laptop refuses the name; the host's job script, given it directly, refuses it too with
    the same rule (a framed error, not a traceback)."""
    assert name_problem(bad)
    with pytest.raises(SpecopsError, match="invalid run id"):
        jobs.validate_run_id(bad)
    from specops.host.remote_exec import run_script

    with connect(light_host) as t:
        res = run_script(t, "jobs.job", ["status", f"--run-id={bad}"], changes=False)
    assert res["ok"] is False and "invalid run id" in res["error"] and res["exit"] == 2


def test_bad_arguments_to_a_remote_script_are_one_framed_line(light_host):
    from specops.host.remote_exec import run_script

    with connect(light_host) as t:
        res = run_script(t, "jobs.job", ["status", "--no-such-flag"], changes=False)
    assert res["ok"] is False and res["exit"] == 2 and "unrecognized arguments: --no-such-flag" in res["error"]


def test_run_id_with_a_newline_refused_before_anything(light_host):
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    r = inv("train", "--host", "light", "--hosts", hf, "--run-id", "r1\n")
    assert r.returncode == 1 and "invalid run id 'r1\\n'" in r.stderr and "Traceback" not in r.stderr
    r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", "../../etc")
    assert r.returncode == 1 and "invalid run id" in r.stderr


def test_hints_repeat_the_hosts_file_and_host(light_host):
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    r = inv("fetch", "--host", "light", "--hosts", hf, "--run-id", "no-such-run")
    assert r.returncode == 1 and f"`inv status --host light --hosts {hf}` lists the runs" in r.stderr, r.stderr


def test_an_upload_never_replaces_another(light_host, tmp_path):
    """Two laptop files of the same name with other contents land side by side; the same content
    is not sent twice."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "convs.jsonl").write_text('{"x": 1}\n')
    (b / "convs.jsonl").write_text('{"x": 2}\n')
    with connect(light_host) as t:
        pa = data.remote_input(t, str(a / "convs.jsonl"))
        pb = data.remote_input(t, str(b / "convs.jsonl"))
        again = data.remote_input(t, str(a / "convs.jsonl"))
        assert pa != pb and again == pa
        assert t.read_bytes(pa) == b'{"x": 1}\n' and t.read_bytes(pb) == b'{"x": 2}\n'
        assert any("already on" in n.text for n in t.notes)
        assert not t.run(f"ls {t.workdir}/uploads/*.part 2>/dev/null").stdout.strip()


def test_make_verifier_never_replaces_a_model_without_overwrite(light_host, tmp_path):
    """Refused before anything runs, dry run included; with --overwrite the dry run says what it
    would replace. (The model build itself needs the heavy venv: tests/test_kimi.py covers it.)"""
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    with connect(light_host) as t:
        model = f"{t.workdir}/models/mine"
        t.check(f"mkdir -p {model} && echo '{{}}' > {model}/config.json", "a model")
    for extra in ([], ["--dry-run"]):
        r = inv("make-verifier", "--host", "light", "--hosts", hf, "--path", model, *extra)
        assert r.returncode == 1 and "already holds files: pass --overwrite" in r.stderr, r.stderr
    r = inv("make-verifier", "--host", "light", "--hosts", hf, "--path", model, "--overwrite", "--dry-run")
    assert r.returncode == 0 and f"would replace the model at {model}" in r.stdout, r.stdout + r.stderr
    with connect(light_host) as t:
        assert t.read_bytes(f"{model}/config.json") == b"{}\n"


def _plan(t, args):
    from specops.host.remote_exec import run_script

    return run_script(t, "data.datagen", [*args, "--plan"], changes=False)


def test_datagen_refuses_before_any_server(light_host, tmp_path):
    """Bad prepare-data / extract input is refused by the plan (which starts nothing): an empty or
    non-regular file, a bad sequence length, a dataset prepared from another file, hidden states of
    other layer ids (never relabelled); --overwrite lets the replacement through."""
    with connect(light_host) as t:
        wd = t.workdir
        ver, data, rows = f"{wd}/t-ver", f"{wd}/data/t-ds", f"{wd}/t-rows.jsonl"
        t.check(f"rm -rf {ver} {data} && mkdir -p {ver} {data}/hidden_states && "
                f"echo '{{\"hidden_size\": 8, \"num_hidden_layers\": 6, \"vocab_size\": 32}}' > {ver}/config.json && "
                f"echo '{{\"input_ids\": [1, 2], \"loss_mask\": [0, 1]}}' > {rows} && : > {wd}/t-empty.jsonl", "fixture")
        base = ["--data-dir", data, "--verifier", ver, "--kind", "cpu"]
        for src, seq, why in (("/dev/null", 8, "not a regular file"), (f"{wd}/t-empty.jsonl", 8, "the file is empty"),
                              (rows, -5, "--seq-length -5")):
            res = _plan(t, base + ["--prepare", src, "--seq-length", str(seq)])
            assert res["ok"] is False and why in res["error"], res
        ok = _plan(t, base + ["--prepare", rows, "--seq-length", "8"])
        assert ok["ok"] is True and ok["already_prepared"] is False
        # a dataset already prepared from another file
        t.check(f": > {data}/data-00000-of-00001.arrow && echo '{{\"prepared_from\": {{\"path\": \"/x/old.jsonl\", "
                f"\"sha256\": \"abc\", \"seq_length\": 8}}, \"layer_ids\": [1, 3, 4, 6]}}' > {data}/specops-data.json",
                "an earlier dataset")
        res = _plan(t, base + ["--prepare", rows, "--seq-length", "8"])
        assert res["ok"] is False and "already holds a dataset prepared from /x/old.jsonl" in res["error"], res
        assert "--overwrite" in res["error"]
        assert _plan(t, base + ["--prepare", rows, "--seq-length", "8", "--overwrite"])["ok"] is True
        # hidden states of other layer ids are not relabelled
        t.check(f"echo x > {data}/hidden_states/hs_0.safetensors", "a file")
        res = _plan(t, base + ["--extract", "--layers", "2,3,5,6"])
        assert res["ok"] is False and "extracted with layer ids [1, 3, 4, 6], not [2, 3, 5, 6]" in res["error"], res
        assert t.read_bytes(f"{data}/specops-data.json").count(b"[1, 3, 4, 6]") == 1


@pytest.mark.parametrize("row,why", [
    ({"text": "hello"}, "row 2 (line 2) has neither `conversations` (a list of {role, content} turns) nor `input_ids` "
                        "+ `loss_mask` (it has: text): fix the rows (nothing was started)"),
    ({"input_ids": [1, 2, 32], "loss_mask": [0, 1, 1]},
     "row 2 (line 2): token id 32 at position 2 is outside the verifier's vocabulary [0, 32) (vocab_size of "),
    ([1, 2], "row 2 (line 2) has neither `conversations`"),
])
def test_prepare_data_cheap_checks_first(light_host, tmp_path, row, why):
    """Rows speculators would drop (neither conversations nor input_ids + loss_mask: "No samples
    remain" after a vLLM server's start) or ids outside the verifier's vocabulary: `inv
    prepare-data` refuses in one line before any server starts, and leaves no dataset folder."""
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps({"input_ids": [1, 2], "loss_mask": [0, 1]}) + "\n" + json.dumps(row) + "\n")
    with connect(light_host) as t:
        ver = f"{t.workdir}/t-ver-cheap"
        t.check(f"mkdir -p {ver} && echo '{{\"hidden_size\": 8, \"num_hidden_layers\": 6, \"vocab_size\": 32}}' "
                f"> {ver}/config.json", "a verifier config")
        r = inv("prepare-data", "--host", "light", "--hosts", hf, "--data", str(src), "--verifier", ver,
                "--dataset", "t-cheap", "--seq-length", "64")
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith("specops: prepare on light refused: --prepare ") and why in lines[0], lines[0]
        assert "vLLM server" not in r.stdout + r.stderr
        assert not t.exists(f"{t.workdir}/data/t-cheap")


def test_push_restores_a_host_script_edited_or_deleted_there(light_host):
    """push and every command compare with the files on the host (a hash listing), not only with
    the manifest: a host script edited or deleted there is sent again (it used to say "already in
    sync", then `ModuleNotFoundError: errlines`)."""
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    r = inv("push", "--host", "light", "--hosts", hf)
    assert r.returncode == 0, r.stderr
    with connect(light_host) as t:
        wd = t.workdir
        t.check(f"echo 'raise SystemExit(3)' >> {wd}/specops_host/jobs/loglines.py && rm {wd}/specops_host/jobs/errlines.py", "tampering")
    r = inv("push", "--host", "light", "--hosts", hf)
    assert r.returncode == 0 and "push light: 2 file(s) sent" in r.stdout, r.stdout + r.stderr
    assert "2 host file(s) no longer as pushed (edited or deleted there): restoring" in r.stderr, r.stderr
    r = inv("push", "--host", "light", "--hosts", hf)
    assert r.returncode == 0 and "already in sync" in r.stdout
    with connect(light_host) as t:
        t.check(f"rm {t.workdir}/specops_host/jobs/errlines.py", "deleting a host script")
    r = inv("status", "--host", "light", "--hosts", hf)  # (any command: the connection pushes first)
    assert r.returncode == 0 and "ModuleNotFoundError" not in r.stdout + r.stderr, r.stdout + r.stderr
    with connect(light_host) as t:
        local = (Path(__file__).parents[1] / "remote" / "specops_host" / "jobs" / "errlines.py").read_bytes()
        assert t.read_bytes(f"{t.workdir}/specops_host/jobs/errlines.py") == local



def test_push_deletes_the_flat_remote_folder_an_older_specops_pushed(light_host):
    """An older specops pushed its host scripts flat into remote/ (and listed them in the push
    manifest): the next push deletes them, so no stale copy of a host module is left beside
    specops_host/ (which the host runs as `python -m specops_host.<job>.<module>`)."""
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    assert inv("push", "--host", "light", "--hosts", hf).returncode == 0
    old = ("remote/job.py", "remote/contract.py")
    with connect(light_host) as t:
        wd, man = t.workdir, f"{t.workdir}/.specops/pushed.json"
        pushed = json.loads(t.read_bytes(man))
        t.check(f"mkdir -p {wd}/remote && " + " && ".join(f"echo 'raise SystemExit(3)' > {wd}/{f}" for f in old),
                "an older specops' flat remote/")
        t.put_text(json.dumps({**pushed, **{f: "0" * 64 for f in old}}), man)
    r = inv("push", "--host", "light", "--hosts", hf)
    assert r.returncode == 0, r.stdout + r.stderr
    with connect(light_host) as t:
        assert not any(t.exists(f"{t.workdir}/{f}", "-f") for f in old)
        assert t.exists(f"{t.workdir}/specops_host/jobs/job.py", "-f")
        assert not set(old) & set(json.loads(t.read_bytes(f"{t.workdir}/.specops/pushed.json")))
    r = inv("status", "--host", "light", "--hosts", hf)
    assert r.returncode == 0, r.stdout + r.stderr

def test_fetch_without_a_run_id_names_the_newest_training_run_and_says_a_snapshot(light_host, tmp_path):
    """No --run-id: the newest *training* run (not a newer extraction), named; a running one is
    fetched as a snapshot, and fetch says so."""
    import time

    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    with connect(light_host) as t:
        tr = jobs.new_run_id("t") + "-fetchtrain"
        jobs.start(t, tr, ["sh", "-c", "echo step; sleep 60"], kind="train", lock="train")
        time.sleep(1.1)
        ex = jobs.new_run_id("t") + "-fetchextract"
        jobs.start(t, ex, ["true"], kind="extract")
        time.sleep(1)
        try:
            r = inv("fetch", "--host", "light", "--hosts", hf, "--dest", str(tmp_path))
            assert r.returncode == 0, r.stdout + r.stderr
            assert f"fetch: no --run-id given: the newest training run on light, {tr}" in r.stdout, r.stdout
            assert f"fetch: {tr} is still running: this is a snapshot of it now" in r.stderr, r.stderr
            assert (tmp_path / tr / "output.log").is_file() and not (tmp_path / ex).exists()
        finally:
            jobs.stop(t, tr, grace=2)


def test_a_relative_dataset_path_is_shown_as_the_absolute_path_it_writes(light_host, tmp_path):
    """`--dataset ../x` is the workdir's ../x: every line names it as the absolute path."""
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps({"input_ids": [1, 2], "loss_mask": [0, 1]}) + "\n")
    with connect(light_host) as t:
        ver, wd = f"{t.workdir}/t-ver-rel", t.workdir
        t.check(f"mkdir -p {ver} && echo '{{\"hidden_size\": 8, \"num_hidden_layers\": 6, \"vocab_size\": 32}}' "
                f"> {ver}/config.json", "a verifier config")
    r = inv("prepare-data", "--host", "light", "--hosts", hf, "--data", str(src), "--verifier", ver,
            "--dataset", "../t-rel-x", "--seq-length", "64", "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    absolute = wd.rsplit("/", 1)[0] + "/t-rel-x"
    assert f"--data-dir {absolute}" in r.stdout and "../t-rel-x" not in r.stdout, r.stdout


def test_a_yaml_error_in_a_training_config_is_one_line(light_host, tmp_path):
    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: 3\n   lr: [1\n")
    r = inv("train", "--host", "light", "--hosts", hf, "--config", str(bad), "--dry-run")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"specops: {bad}: YAML syntax error at line 3, column ") and \
        lines[0].endswith(": fix the file"), lines[0]


def test_an_unknown_checkpoint_lists_the_checkpoints_not_every_file(tmp_path):
    """`evaluate --checkpoint 99`: the run's checkpoints (folders with a config.json), in order."""
    from specops_host.serve import evaluate as ev

    for name in ("0", "2", "10", "interrupted"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
        (tmp_path / "checkpoints" / name / "config.json").write_text("{}")
    (tmp_path / "checkpoints" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoints" / "empty").mkdir()
    with pytest.raises(ev.Refused) as e:
        ev.checkpoint_dir(tmp_path, "99")
    assert str(e.value) == f"no checkpoint 99 in {tmp_path}/checkpoints (its checkpoints: 0, 2, 10, interrupted)"


def test_push_without_sha256sum_hashes_with_shasum_then_the_venvs_python(rig, tmp_path):  # (rig: an sshd test)
    """A host without GNU sha256sum (macOS has `shasum -a 256`) still gets a hash listing: the
    second push sends nothing (without one, every file was sent on every connection). Without
    shasum either, the host venv's python (hashlib) lists them. Over a real sshd whose login PATH
    holds every tool of this machine but those."""
    from rig import Rig

    r = Rig().start()
    try:
        ak = r.root / "authorized_keys"
        login = ak.read_text()
        assert f"PATH={r.bin}:/usr/local/bin:/usr/bin:/bin" in login
        hf = r.write_hosts(r.root / "hosts-nosha.yaml",
                           {"mac": r.host(venv="~/light-venv", workdir="~/specops-nosha")})
        h = inventory.load(str(hf)).get("mac")
        base = ["--host", "mac", "--hosts", str(hf)]
        for hidden in (("sha256sum",), ("sha256sum", "shasum")):
            tools = r.root / ("tools-without-" + "-".join(hidden))
            tools.mkdir()
            for d in ("/usr/local/bin", "/usr/bin", "/bin"):
                for f in sorted(Path(d).iterdir()):
                    if f.name not in hidden and not (tools / f.name).exists():
                        (tools / f.name).symlink_to(f)
            tools.chmod(0o755)
            ak.write_text(login.replace(f"PATH={r.bin}:/usr/local/bin:/usr/bin:/bin", f"PATH={tools}"))
            with connect(h) as t:
                for name in hidden:
                    assert t.run(f"command -v {name}").exited != 0, f"{name} still on the host's PATH"
                t.check("test -x ~/light-venv/bin/python3 || /usr/bin/python3 -m venv --without-pip ~/light-venv",
                        "light venv")
                t.check("rm -rf ~/specops-nosha", "a fresh workdir")
            first = inv("push", *base)
            assert first.returncode == 0 and "file(s) sent" in first.stdout, first.stdout + first.stderr
            again = inv("push", *base)
            assert again.returncode == 0 and "push mac: already in sync" in again.stdout, \
                (hidden, again.stdout + again.stderr)
            with connect(h) as t:  # (the listing is of the host's files: an edit there is still seen)
                t.check(f"echo '# edited' >> {t.workdir}/specops_host/jobs/loglines.py", "tampering")
            fixed = inv("push", *base)
            assert fixed.returncode == 0 and "push mac: 1 file(s) sent" in fixed.stdout, fixed.stdout + fixed.stderr
    finally:
        r.stop()


def test_disk_figures_are_in_units_that_fit():
    """Issue 24 item 12: a small dataset's disk budget reads in MiB (or KiB, B), never "0.00 GiB";
    the laptop and the host scripts share the one rule (specops_host/contract.py)."""
    from specops.contract import human_bytes
    from specops_host import contract as host_contract

    assert human_bytes(5.1 * 2**20) == "5.1 MiB" and human_bytes(0.004 * 2**30) == "4.1 MiB"
    assert human_bytes(512) == "512 B" and human_bytes(3 * 2**10) == "3.0 KiB"
    assert human_bytes(2.7 * 2**30) == "2.70 GiB" and human_bytes(3 * 2**40) == "3072.00 GiB"
    assert human_bytes(3 * 2**40, top="TiB") == "3.00 TiB"
    assert host_contract.human_bytes is human_bytes


def test_stop_of_an_ended_run_says_it_is_not_running(light_host):
    """Issue 24 item 12: `stop` of a run that has ended says so, with its end, and signals nothing."""
    import time

    hf = str(Path(light_host.key).parent / "hosts-light.yaml")
    rid = jobs.new_run_id("t") + "-ended"
    with connect(light_host) as t:
        jobs.start(t, rid, ["/bin/sh", "-c", "exit 0"], kind="train")
        t0 = time.time()
        while not jobs.status(t, rid)[0].ended:
            assert time.time() - t0 < 60, "the job did not end"
            time.sleep(0.5)
        assert jobs.status(t, rid)[0].state == "succeeded"
    r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", rid)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"stop {rid}: not running (succeeded" in r.stdout and "nothing was signalled" in r.stdout, r.stdout
