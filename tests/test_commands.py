"""The exact commands specops builds, through a recording connection (tests/fakes.py): quoting,
the interpreter rule, secrets never on a command line, dry-run plans changes and still reads.
Beside the real-sshd tests (which prove the same commands work on a host), never instead."""

import json
import re
import shlex

import pytest

from fakes import RecordingTransport
from specops import inventory
from specops.contract import BEGIN, END
from specops.errors import SpecopsError
from specops.host.remote_exec import NO_VENV, run_script, script_command
from specops.host.transport import NotDone
from specops.ops import jobs
from specops.ops.train import put_spec

ODD = "/srv/my work/it's $(here)"


def host(**over):
    return inventory.Host(name="h", transport="local", profile="cpu", venv="/opt/ml env", workdir=ODD, **over)


def framed(payload: dict) -> str:
    return f"noise before\n{BEGIN}{json.dumps(payload)}{END}\n"


def test_script_command_is_the_venv_interpreter_in_the_workdir_every_argument_quoted():
    t = RecordingTransport(host())
    cmd = script_command(t, "check.preflight", ["--data", "a b", "$(rm -rf ~)", "x'y"])
    py, wd = shlex.quote("/opt/ml env/bin/python3"), shlex.quote(ODD)
    assert cmd == (f"cd {wd} 2>/dev/null || exit 98; test -x {py} || exit 97; test -f specops_host/check/preflight.py || exit 98; "
                   f"exec {py} -m specops_host.check.preflight --data 'a b' '$(rm -rf ~)' 'x'\"'\"'y'")
    assert shlex.split(cmd.split("exec ", 1)[1]) == ["/opt/ml env/bin/python3", "-m", "specops_host.check.preflight", "--data", "a b",
                                                     "$(rm -rf ~)", "x'y"]


def test_run_script_decodes_the_framed_payload_and_names_bootstrap_when_the_venv_is_missing():
    t = RecordingTransport(host(), answers=[(r"specops_host\.check\.preflight", 0, framed({"ok": True, "rows": 3}))])
    assert run_script(t, "check.preflight", ["--json"]) == {"ok": True, "rows": 3, "exit": 0}
    assert t.commands == [script_command(t, "check.preflight", ["--json"])]
    gone = RecordingTransport(host(), answers=[(r"specops_host\.check\.preflight", NO_VENV, "")])
    with pytest.raises(SpecopsError, match=r"venv /opt/ml env is missing on h .*run `inv bootstrap --host h`"):
        run_script(gone, "check.preflight", [])
    broken = RecordingTransport(host(),
                                answers=[(r"specops_host\.check\.preflight", 1, "Traceback ...\nKeyError: 'x'\n")])
    with pytest.raises(SpecopsError, match=r"specops_host/check/preflight\.py on h exited 1 without a result"):
        run_script(broken, "check.preflight", [])


def test_a_job_secret_travels_as_a_0600_file_never_on_a_command_line():
    t = RecordingTransport(host(env={"HF_TOKEN": "s3cr3t-token"}),
                           answers=[(r"specops_host\.jobs\.job start", 0, framed({"ok": True, "run_id": "r1", "pid": 42}))])
    res = jobs.start(t, "r1", ["python3", "-m", "specops_host.train.run", "--spec", "s.json"], kind="train",
                     lock="train")
    assert res.pid == 42
    env_file = f"{ODD}/runs/r1.env"
    assert all("s3cr3t" not in c for c in t.commands)
    assert t.commands[0] == (f"mkdir -p {shlex.quote(ODD + '/runs')} && umask 077 && : > {shlex.quote(env_file)}")
    puts = [op for op in t.ops if op[0] == "put"]
    assert [(p[1], p[2]) for p in puts] == [(env_file, b"HF_TOKEN=s3cr3t-token\n")]
    job = t.commands[-1]
    assert job == script_command(t, "jobs.job", ["start", "--run-id", "r1", "--kind", "train", "--term", "group",
                                            "--lock", "train", "--env-file", env_file, "--",
                                            "python3", "-m", "specops_host.train.run", "--spec", "s.json"])


def test_a_bad_run_id_is_refused_before_any_command():
    t = RecordingTransport(host())
    with pytest.raises(SpecopsError):
        jobs.stop(t, "../other")
    assert t.ops == []


def test_stop_asks_the_host_job_script_with_the_grace():
    t = RecordingTransport(host(), answers=[(r"specops_host\.jobs\.job stop", 0,
                                             framed({"ok": True, "run_id": "r1", "state": "stopped"}))])
    assert jobs.stop(t, "r1", grace=12.5).state == "stopped"
    assert t.commands == [script_command(t, "jobs.job", ["stop", "--run-id", "r1", "--grace", "12.5"])]


def test_the_train_spec_is_written_whole_where_the_run_lives():
    t = RecordingTransport(host())
    spec = {"run_dir": f"{ODD}/runs/r1", "kind": "cpu", "flags": {"epochs": 2}}
    path = put_spec(t, spec)
    assert path == f"{ODD}/runs/r1/train-spec.json"
    assert t.commands == [f"mkdir -p {shlex.quote(ODD + '/runs/r1')}"]
    (_, where, body), = [op for op in t.ops if op[0] == "put"]
    assert where == path and json.loads(body) == spec


def test_dry_run_plans_what_changes_and_still_reads():
    t = RecordingTransport(host(), dry_run=True, answers=[(r"^ls ", 0, "a\n")])
    assert t.run("ls /x", changes=False).stdout == "a\n"
    assert t.run("rm -rf -- /x").ok
    t.put_text("secret", "/w/f", label="(env)")
    assert t.commands == ["ls /x"] and not [op for op in t.ops if op[0] == "put"]
    assert t.planned == ["run: rm -rf -- /x", "put: '(env)' -> h:/w/f"]
    stand = run_script(t, "jobs.job", ["stop", "--run-id", "r1"])  # (a change: planned, not run: a stand-in reply)
    assert stand.ok
    with pytest.raises(NotDone, match=r"^stops here: what follows reads specops_host/jobs/job\.py's reply \(state\)"):
        stand.state  # noqa: B018  (what only a real run's reply holds: the dry run stops there)
    assert t.commands == ["ls /x"] and t.planned[-1] == "run: " + script_command(t, "jobs.job", ["stop", "--run-id", "r1"])


def test_a_running_job_is_not_ended_and_an_ended_one_keeps_its_end_time():
    running = {"run_id": "r1", "kind": "data", "state": "running", "pid": 7, "started": 100.0}
    done = {"run_id": "r2", "kind": "train", "state": "succeeded", "exit_code": 0, "started": 100.0,
            "ended_at": 160.0}
    t = RecordingTransport(host(),
                           answers=[(r"specops_host\.jobs\.job status", 0, framed({"ok": True, "jobs": [running, done]}))])
    r1, r2 = jobs.status(t)
    assert r1.ended is False and r1.ended_at is None
    assert r2.ended is True and r2.ended_at - r2.started == 60.0


def test_datagen_arguments_are_one_value_rendered_to_argv_at_the_edge():
    from specops.ops.data import Datagen, datagen_args, run_datagen

    t = RecordingTransport(host(), dry_run=True, answers=[
        (r"specops_host\.data\.datagen", 0, framed({"ok": True, "commands": [["vllm", "serve", "/v"]]}))])
    kw = dict(data=f"{ODD}/data/d", verifier="/v", extract=True, layers="1,2,3", shard="0/2")
    dg = Datagen.of(t, **kw)
    assert dg.argv() == ["--data-dir", f"{ODD}/data/d", "--verifier", "/v", "--kind", "cpu", "--extract",
                         "--backend", "vllm", "--concurrency", "32", "--layers", "1,2,3", "--shard", "0/2",
                         *t.host.vllm_flags([])]
    assert datagen_args(t, **kw) == dg.argv() and dg.argv("--plan")[-1] == "--plan"
    with pytest.raises(NotDone, match=r"the extract job \S+ \(pid\)"):  # (--dry-run: the plan is read, the job
        run_datagen(t, dg, kind="extract")  # is planned, and what follows it reads the job: the dry run stops)
    p = t.plan_of()
    assert "would start: vllm serve /v" in p.steps
    assert t.commands[0] == script_command(t, "data.datagen", dg.argv("--plan"))
    assert "would start: vllm serve /v" in t.planned


def test_reads_and_changes_are_separate_verbs_and_the_dry_run_is_a_plan():
    from specops import views

    t = RecordingTransport(host(), dry_run=True, answers=[(r"^ls ", 0, "a\n")])
    assert t.fact("ls /x").stdout == "a\n"  # (a read runs under --dry-run)
    assert t.change("rm -rf -- /x").ok and t.commands == ["ls /x"]  # (a change is planned)
    t.put_text("k=v", "/w/env", label="(env)")
    t.sync_up("/l/d", "/w/d")
    assert run_script(t, "jobs.job", ["start"]).ok
    t.would("would start the job")
    p = t.plan_of()
    assert p.commands == ["rm -rf -- /x", script_command(t, "jobs.job", ["start"])]
    assert p.files == ["/w/env"] and len(p.transfers) == 2 and p.steps == ["would start the job"]
    assert t.planned[0] == "run: rm -rf -- /x" and len(t.planned) == 5  # (each also said as it came)
    assert views.plan_summary(p) == "would: 2 command(s), 2 transfer(s) (1 host file(s)), 1 other step(s)"
    p.commands.clear()
    assert len(t.plan_of().commands) == 2  # (a copy)
    real = RecordingTransport(host())
    real.change("rm -rf -- /x")
    assert real.commands == ["rm -rf -- /x"] and not real.plan_of()


def test_the_library_names_every_host_command_a_read_or_a_change():
    """No library module calls the connection's bare run(): a read is `fact`, a change `change`
    (a read that forgot `changes=False` was planned under --dry-run with an empty result)."""

    from specops import paths

    bare = [f"{p.relative_to(paths.REPO)}:{i}" for p in sorted((paths.REPO / "specops").rglob("*.py"))
            if p.name != "transport.py"
            for i, ln in enumerate(p.read_text().splitlines(), 1) if re.search(r"\b(t|self|self\.t|ts\[\d\])\.run\(", ln)]
    assert bare == []


def test_under_dry_run_the_library_returns_its_own_types_and_the_connection_keeps_the_plan():
    """Each call that would change the host returns its own type under --dry-run (a stand-in
    reply), the connection keeps the commands, transfers and host files a real run would make
    (views renders it), and what reads a change the dry run did not make stops it in one line."""
    from specops import views
    from specops.ops import data

    t = RecordingTransport(host(env={"HF_TOKEN": "x"}), dry_run=True)
    s = jobs.start(t, "r1", ["python3", "-m", "specops_host.train.run"], kind="train", lock="train")
    p = t.plan_of()
    assert s.ok and p.host == "h" and p.files == [f"{ODD}/runs/r1.env"]
    assert p.commands[-1] == script_command(t, "jobs.job", ["start", "--run-id", "r1", "--kind", "train", "--term", "group",
                                                            "--lock", "train", "--env-file", f"{ODD}/runs/r1.env", "--",
                                                            "python3", "-m", "specops_host.train.run"])
    with pytest.raises(NotDone, match=r"^stops here: what follows reads the train job r1 \(pid\), which only a real"):
        s.pid  # noqa: B018  (reading it is the test)
    assert jobs.stop(t, "r1", grace=5).ok and data.convert(t, "/old", "/new").ok
    with pytest.raises(NotDone, match=r"the data job r2 \(pid\)") as stop:
        jobs.run_attached(t, "r2", ["python3", "x.py"], kind="data")
    assert stop.value.host == "h"
    assert views.plan_summary(t.plan_of()) == "would: 6 command(s), 2 transfer(s) (2 host file(s))"
    with pytest.raises(NotDone, match=re.escape(f"reads {ODD}/runs/r1/output.log, which only a real run writes")):
        t.read_bytes(jobs.run_path(t, "r1", "output.log"))  # (the run folder the job would have made)
    with pytest.raises(NotDone, match="looks for /new"):
        t.exists("/new/rows.json")  # (what the conversion would have written)
    assert t.read_bytes(f"{ODD}/runs/r0/output.log") is None  # (anything else is read as it is)
    real = RecordingTransport(host(), answers=[(r"specops_host\.jobs\.job stop", 0, framed({"ok": True, "run_id": "r1",
                                                                                    "state": "stopped"}))])
    assert jobs.stop(real, "r1", grace=5).state == "stopped" and not real.plan_of()
