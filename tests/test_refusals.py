"""Every bad input is a cheap one-line refusal (issue 34, item 4): training configs, empty names,
layer ids and shards, hosts.yaml's Slurm time and vllm_args, data files, and --seq-length against
the verifier's positions. Through the real CLI where the refusal comes before anything connects;
the host's checks (remote/specops_host/data/inputs.py) called as its scripts call them."""

import json

import pytest

from conftest import inv
from specops import args
from specops.errors import SpecopsError
from specops_host import datafmt
from specops_host.contract import Refused
from specops_host.data import inputs
from test_args import refused


@pytest.mark.parametrize("name,text,want", [
    ("latin1", b"train:\n  lr: \xff\n", "not UTF-8 text (byte 0xff on line 2): save it as UTF-8"),
    ("list", b"- epochs\n- 3\n", "top level must be a mapping"),
    ("dup", b"train:\n  epochs: 3\n  lr: 1.0e-3\n  epochs: 4\n",
     "line 4, column 3: key 'epochs' given twice (first on line 2): keep one"),
    ("unknown", b"train:\n  epoch: 3\n", "'epoch' is not a flag of speculators 0.9.0's train: did you mean 'epochs'?"),
    ("range", b"train:\n  epochs: 99999999999999999999\n", "epochs: 99999999999999999999: give how many epochs to "
                                                          "train, 1 or more, at most 2147483647"),
    ("type", b"train:\n  max-steps: soon\n", "max-steps: 'soon': give how many steps to train at most"),
])
def test_a_bad_training_config_is_shown_by_the_dry_run(tmp_path, name, text, want):
    f = tmp_path / f"{name}.yaml"
    f.write_bytes(text)
    line = refused(inv("train", "--dry-run", "--config", str(f)), code=1)
    assert line.startswith(f"specops: {f}") and want in line, line


def test_a_number_past_any_real_one_is_refused():
    line = refused(inv("train", "--host", "no-such-host", "--epochs", "99999999999999999999"))
    assert line == "specops: --epochs 99999999999999999999: give how many epochs to train, 1 or more, at most " \
                   "2147483647 (e.g. 3)", line


@pytest.mark.parametrize("task,name", [
    ("train", "dataset"), ("prepare_data", "dataset"), ("logs", "run_id"), ("stop", "run_id"), ("evaluate", "run_id"),
    ("train", "config"), ("plan", "config"), ("evaluate", "prompts"), ("prepare_data", "data"), ("status", "kind"),
    ("train", "verifier"),
])
def test_an_empty_name_is_refused_like_an_empty_host(task, name):
    from invoke.exceptions import Exit

    for value in ("", " "):
        with pytest.raises(Exit) as e:
            args.flags(task, {name: value})
        flag = "--" + name.replace("_", "-")
        assert e.value.code == 2 and str(e.value.message).startswith(f"specops: {flag} {value!r}: nothing given: give ")


def test_an_empty_name_through_the_cli():
    for task, extra in (("train", ["--dataset", ""]), ("evaluate", ["--run-id", "r1", "--prompts", ""])):
        line = refused(inv(task, "--host", "no-such-host", *extra))
        assert line.startswith(f"specops: {extra[-2]} '': nothing given") and "unset variable" in line, line


@pytest.mark.parametrize("name,value,want", [
    ("layers", ",,,", "give comma-separated layer ids"),
    ("layers", "1,,3", "give comma-separated layer ids"),
    ("layers", "-1,2,3,4", "layer id -1 is negative: ids count from 0"),
    ("layers", "2,x,4", "give comma-separated integers"),
    ("shard", "-1/2", "use i/n with 0 <= i < n"),
    ("shard", "2/2", "use i/n"),
    ("shard", "a/b", "use i/n"),
])
def test_layer_ids_and_shards_in_specops_words(name, value, want):
    from invoke.exceptions import Exit

    for task in ("extract", "train", "plan", "pipeline") if name == "layers" else ("extract",):
        with pytest.raises(Exit) as e:
            args.flags(task, {name: value})
        assert e.value.code == 2 and str(e.value.message).startswith(f"specops: --{name} {value}: {want}")
    assert args.flags("extract", {"layers": "1, 3,4,6", "shard": "0/4"}) == {"layers": "1, 3,4,6", "shard": "0/4"}
    assert args.flags("inspect_data", {"layers": "4"}) == {"layers": 4}  # (a count there)


def test_layer_ids_through_the_cli_not_argparse():
    for argv in (["--layers", "-1,2,3,4"], ["--shard", "-1/2"]):
        line = refused(inv("extract", "--host", "no-such-host", *argv))
        assert line.startswith(f"specops: {argv[0]} {argv[1]}: ") and "argument" not in line, line


@pytest.mark.parametrize("field,want", [
    ("slurm: {time: '0'}", "field 'slurm.time': '0': give a limit"),
    ("slurm: {time: '00:99:99'}", "field 'slurm.time': '00:99:99': minutes and seconds after a colon are 0 to 59"),
    ("vllm_args: [--tensor-parallel-size, '2']", "--tensor-parallel-size sets --tensor-parallel-size, which specops "
                                                 "sets from this host's `tensor_parallel: N`"),
    ("vllm_args: ['-tp=2']", "sets -tp, which specops sets from this host's `tensor_parallel: N`"),
    ("vllm_args: [--trust-remote-code]", "from this host's `trust_remote_code: true`"),
])
def test_hosts_yaml_refuses_what_clashes_with_specops(tmp_path, field, want):
    f = tmp_path / "h.yaml"
    sched = "scheduler: slurm, " if field.startswith("slurm") else ""
    f.write_text(f"hosts:\n  g: {{address: h, {sched}{field}}}\n")
    line = refused(inv("hosts", "--hosts", str(f)), code=1)
    assert want in line, line


@pytest.mark.parametrize("groups,want", [
    ("g: [box, box]", "group 'g' names host 'box' twice: list each host once"),
    ("g: []", "group 'g' lists no host: list its hosts (e.g. g: [a, b]) or remove it"),
])
def test_a_group_with_a_host_twice_or_none_is_one_line(tmp_path, groups, want):
    """Issue 45: `g: [box, box]` ran every task twice at once on box (fetch wrote both into one
    folder); `g: []` said `no host given`. Both refused as hosts.yaml is read, by any task."""
    f = tmp_path / "h.yaml"
    f.write_text(f"hosts:\n  box: {{address: h}}\ngroups:\n  {groups}\n")
    for argv in (["hosts"], ["status", "--host", "@g"]):
        line = refused(inv(*argv, "--hosts", str(f)), code=1)
        assert line == f"specops: {f}: {want}", line


def test_speedup_0_is_refused_as_the_docs_say():
    """Issue 45: `--speedup 0` was taken as none, though docs/evaluation.md refuses levels of 0."""
    line = refused(inv("evaluate", "--host", "local", "--run-id", "r1", "--speedup", "0"), code=1)
    assert line == "specops: --speedup '0': give concurrent request counts (1-1024) such as 1,16, or none", line


# -- the host's checks of the data and the verifier (before any server starts) -------------------
@pytest.mark.parametrize("text,want", [
    ("not json\n", "line 1 is not JSON"),
    ("[1, 2]\n", "row 1 of its JSON array is a JSON number, not an object"),  # (issue 45: was "a JSON int")
    ("[[1, 2, 3]]\n", "row 1 of its JSON array is a JSON array, not an object"),
    ('[1, 2]\n{"conversations": []}\n', "not JSON (Extra data: line 2 column 1"),
    ('"just a string"\n', "row 1 (line 1) is a JSON string, not an object"),
    ("null\n", "row 1 (line 1) is JSON null, not an object"),
    ("\n\n", "no rows in it"),
])
def test_a_data_files_first_row_is_named(tmp_path, text, want):
    f = tmp_path / "rows.jsonl"
    f.write_text(text)
    with pytest.raises(Refused) as e:
        inputs.rows_need_render(str(f))
    assert str(e.value).startswith(f"--prepare {f}") and want in str(e.value), str(e.value)


@pytest.mark.parametrize("line2,want", [
    ("{oops", "line 2 is not JSON"),
    ("[3, 4]", "row 2 (line 2) has neither `conversations` (a list of {role, content} turns) nor `input_ids` + "
               "`loss_mask` (it has: a JSON array)"),
    ('{"text": "hi"}', "row 2 (line 2) has neither `conversations` (a list of {role, content} turns) nor "
                      "`input_ids` + `loss_mask` (it has: text)"),
])
def test_every_line_of_a_data_file_is_checked(tmp_path, line2, want):
    f = tmp_path / "rows.jsonl"
    f.write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n' + line2 + "\n")
    with pytest.raises(Refused) as e:
        inputs.check_rows(str(f), str(tmp_path))
    assert want in str(e.value) and str(f) in str(e.value), str(e.value)


@pytest.mark.parametrize("name,raw", [
    ("rows.jsonl", b'{"conversations": []}\n{"conversations": [{"role": "user", "content": "caf\xe9"}]}\n'),
    ("rows.json", b'[{"conversations": []},\n {"conversations": [{"role": "user", "content": "caf\xe9"}]}]\n'),
])
def test_a_data_file_is_read_as_utf8_naming_the_line_and_the_byte(tmp_path, name, raw):
    """failures row 163, the host's check alone: a byte that is not UTF-8 (here latin-1's e-acute), in a
    .jsonl or a .json array, is named by its line and its offset in the file (a prompts file too)."""
    f = tmp_path / name
    f.write_bytes(raw)
    for check in (inputs.check_rows, lambda f, _: inputs.rows_need_render(f) and list(inputs.source_rows(f))):
        with pytest.raises(Refused) as e:
            check(str(f), str(tmp_path))
        assert str(e.value) == (f"--prepare {f}: line 2 is not UTF-8: byte 0xe9 at byte offset {raw.index(0xe9)}"
                                f" of the file (invalid continuation byte); speculators and vLLM read it as UTF-8: "
                                f"save it as UTF-8 (e.g. iconv -f latin1 -t utf-8) (nothing was started)"), str(e.value)
    from specops_host.serve.prompts import file_prompts

    f.write_bytes(b'{"prompt": "ok"}\n{"prompt": "\xff"}\n')
    with pytest.raises(Refused, match=r"^--prompts .*: line 2 is not UTF-8: byte 0xff at byte offset 29 of the file"):
        file_prompts(str(f), 8)


def test_empty_layer_ids_are_refused_on_the_host_too():
    with pytest.raises(Refused, match=r"--layers ',,,': no layer id in it"):
        inputs.parse_layers(",,,", 6)


def test_the_model_length_is_held_against_the_verifiers_positions(tmp_path):
    """defect 7: --seq-length 2048 on a verifier of 2048 positions made --max-model-len 2049, refused by
    vLLM 27 s later in its log; now one line before any server starts."""
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2,
                                                      "max_position_embeddings": 2048}))
    with pytest.raises(Refused) as e:
        datafmt.check_model_len(2049, str(tmp_path), "--seq-length 2048 + 1 (the token vLLM generates)")
    assert str(e.value) == (f"--seq-length 2048 + 1 (the token vLLM generates) makes the vLLM server's --max-model-len "
                            f"2049, but the verifier holds 2048 positions (max_position_embeddings of {tmp_path}/"
                            f"config.json): give --seq-length 2047 or less (nothing was started)")
    with pytest.raises(Refused, match="give --max-model-len 2048 or less"):
        datafmt.check_model_len(4096, str(tmp_path), "--max-model-len 4096")
    datafmt.check_model_len(2048, str(tmp_path), "--max-model-len 2048")
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 64}}))
    with pytest.raises(Refused, match=r"text_config\.max_position_embeddings of"):
        datafmt.check_model_len(65, str(tmp_path), "--max-model-len 65")


def test_every_vllm_server_holds_its_length_to_the_verifiers_positions(tmp_path):
    """A --max-model-len given through --vllm-arg or hosts.yaml vllm_args (read as vLLM 0.32 reads
    it: `=` or a space, `_`, k = 1000, K = 1024, the last one wins, auto / -1 the model's own) is
    held against the verifier's positions where every vLLM server's command is built
    (vllm_server.server_argv: data generation, regenerate, online training, evaluate, the serve
    preflight), before any server starts."""
    from specops_host.serve import vllm_server as vs

    assert vs.user_model_len([]) is None and vs.user_model_len(["--enforce-eager"]) is None
    assert vs.user_model_len(["--max-model-len", "4096"]) == 4096
    assert vs.user_model_len(["--max_model_len=2k"]) == 2000 and vs.user_model_len(["--max-model-len=2K"]) == 2048
    assert vs.user_model_len(["--max-model-len=1024", "--max-model-len", "3000"]) == 3000  # (the last wins)
    assert vs.user_model_len(["--max-model-len=auto"]) is None and vs.user_model_len(["--max-model-len", "-1"]) is None
    assert vs.user_model_len(["--max-model-len=1.5K"]) is None  # (vLLM refuses it itself: its own line)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2,
                                                      "max_position_embeddings": 2048}))
    argv = vs.server_argv(str(tmp_path), 8000, kind="cpu", max_model_len=2048, user_args=["--max-model-len=2K"])
    assert argv[argv.index("--max-model-len") + 1] == "2048"
    with pytest.raises(Refused) as e:
        vs.server_argv(str(tmp_path), 8000, kind="cpu", max_model_len=512, user_args=["--max_model_len", "4k"])
    assert str(e.value) == (f"--vllm-arg --max-model-len makes the vLLM server's --max-model-len 4000, but the "
                            f"verifier holds 2048 positions (max_position_embeddings of {tmp_path}/config.json): "
                            f"give --max-model-len 2048 or less (nothing was started)")
    with pytest.raises(Refused, match="--max-model-len 4096, but the verifier holds 2048"):
        vs.server_argv(str(tmp_path), 8000, kind="cpu", max_model_len=4096)


def test_config_loading_errors_are_specops_errors(tmp_path):
    from specops.config import load_config

    f = tmp_path / "c.yaml"
    f.write_text("train:\n  total-seq-len: 512\n  bogus-flag: 1\n")
    with pytest.raises(SpecopsError, match="'bogus-flag' is not a flag of speculators"):
        load_config(str(f), "cpu", {})


def test_a_dry_runs_progress_lines_say_dry_run(capsys):
    from specops import views
    from specops.host.transport import Note

    views.set_dry(True)
    try:
        views.note(Note("g", "info", "f is already on g as /w/uploads/f"))
        views.note(Note("g", "plan", "would start: x"))
    finally:
        views.set_dry(False)
    views.note(Note("g", "info", "uploaded f -> g:/w/uploads/f"))
    assert capsys.readouterr().out.splitlines() == ["DRY-RUN g: f is already on g as /w/uploads/f",
                                                    "DRY-RUN g: would start: x", "[specops] uploaded f -> g:/w/uploads/f"]


def test_payload_frames_never_reach_the_terminal():
    """defect 8: raw @@SPECOPS-PAYLOAD-BEGIN@@ frames printed (twice) with an evaluation's failure."""
    from specops import cli, terminal
    from specops.contract import BEGIN, END
    from specops.ops import jobs
    frame = f"\n{BEGIN}{{\"ok\": false, \"error\": \"x\"}}{END}\n"
    e = SpecopsError("evaluate r1 on g failed: x", detail=f"line one{frame}line two{frame}")
    assert cli.fail(e).message == "specops: evaluate r1 on g failed: x\nline one\nline two"
    chunks = [b"a\n" + BEGIN.encode()[:5], BEGIN.encode()[5:] + b'{"ok": tr', b"ue}" + END.encode() + b"\nb\n"]
    assert b"".join(terminal.unframed_chunk(c) for c in chunks) == b"a\nb\n"
    assert "BEGIN" not in jobs.unframed("x" + frame + "y") and jobs.unframed("x" + frame + "y") == "x\ny"


def test_an_input_that_vanished_while_a_script_ran_is_named(tmp_path):
    from specops_host import contract

    ck = tmp_path / "checkpoints" / "0"
    ck.mkdir(parents=True)
    contract.WATCHED.clear()
    try:
        contract.watch("checkpoint", str(ck))
        assert contract.failure(ValueError("boom"))["error"] == "ValueError: boom"
        ck.rmdir()
        res = contract.failure(SystemExit("the vLLM server exited (exit 1) during its start: HFValidationError: "
                                          "Repo id must be in the form 'repo_name'"))
        assert res["vanished"] == str(ck) and res["error"].startswith(
            f"the checkpoint {ck} vanished while this ran (removed or moved meanwhile): put it back and run again "
            f"(the error it caused: the vLLM server exited"), res
        assert "\n" not in res["error"]
        assert contract.failure(contract.Refused("bad flag"))["error"] == "bad flag"
    finally:
        contract.WATCHED.clear()


@pytest.mark.parametrize("text,want", [
    ("", "the file is empty: give one {\"prompt\": ...} per line"),
    ("\n  \n", "the file is empty"),
    ("{oops\n", "line 1 is not JSON"),
    ('{"prompt": "hi"}\n[1, 2]\n', "line 2 holds no \"prompt\""),
])
def test_a_prompts_file_is_read_in_specops_words(tmp_path, text, want):
    from specops_host.serve.evaluate import file_prompts

    f = tmp_path / "p.jsonl"
    f.write_text(text)
    with pytest.raises(Refused) as e:
        file_prompts(str(f), 10)
    assert str(e.value).startswith(f"--prompts {f}: ") and want in str(e.value), str(e.value)
    f.write_text('{"prompt": "hi"}\n{"text": "yo"}\n')
    assert file_prompts(str(f), 1) == ([{"prompt": "hi"}], {"source": str(f)})


def test_a_gpu_verifier_size_on_a_cpu_host_is_one_line_before_anything_runs():
    line = refused(inv("demo", "--size", "8b", "--dry-run"), code=1)
    assert line == ("specops: demo --size 8b: local is a cpu host (profile cpu), where the demo's verifier is the "
                    "tiny one: drop --size, or use a cuda host"), line


@pytest.mark.parametrize("extra,want", [
    (["--controls", "untrained,random"], "--controls 'untrained,random': random is not a control; give "
                                         "untrained,wrong-layers (either or both)"),
    (["--controls", ","], "--controls ',': no control named; give untrained,wrong-layers"),
    (["--controls", "untrained", "--checkpoints", "all"], "--controls are built from the run's best checkpoint"),
])
def test_evaluate_controls_are_checked_before_anything_connects(extra, want):
    """issue 46 item 5: `inv evaluate --controls` names checked first (an unknown host is never looked up)."""
    r = inv("evaluate", "--host", "no-such-host", "--run-id", "r1", *extra)
    line = refused(r, code=1 if "best checkpoint" in want else 2)
    assert want in line, line


def test_tasks_md_shows_one_line_of_every_input_format(tmp_path):
    """issue 46 item 7: docs/tasks.md's input formats, each line read by the check that reads the user's file."""
    import re
    from pathlib import Path

    from specops_host.serve.evaluate import file_prompts

    text = (Path(__file__).parent.parent / "docs" / "tasks.md").read_text()
    sec = text.split("## Input formats", 1)[1].split("\n## ", 1)[0]
    conv, rows, prompt = re.findall(r"^  `(\{.*\})`$", sec, re.M)
    for name, line in (("conv.jsonl", conv), ("rows.jsonl", rows)):
        (tmp_path / name).write_text(line + "\n")
        assert inputs.check_rows(str(tmp_path / name), str(tmp_path)) == 1
    assert inputs.rows_need_render(str(tmp_path / "conv.jsonl")) and not inputs.rows_need_render(
        str(tmp_path / "rows.jsonl"))
    (tmp_path / "p.jsonl").write_text(prompt + "\n")
    assert file_prompts(str(tmp_path / "p.jsonl"), 8)[0] == [json.loads(prompt)]
