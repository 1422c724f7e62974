"""The first ten minutes, the quick parts: a connection's stage clock (the demo's stage table),
the table as a pipe shows it, `make setup`'s stamp, `make test`'s slowest tests, and a script's
progress lines handed to the laptop as they come (real local connection, real subprocesses)."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from specops import inventory
from specops.host.connection import connect
from specops.host.remote_exec import progress_args

REPO = Path(__file__).resolve().parent.parent


def local(tmp_path, **kw):
    hf = tmp_path / "hosts.yaml"
    hf.write_text(f"hosts:\n  local:\n    workdir: {tmp_path / 'work'}\n    venv: {Path(sys.prefix)}\n")
    return connect(inventory.load(str(hf)).get("local"), **kw)


def test_stages_time_the_outermost_parts_in_order(tmp_path):
    with local(tmp_path) as t:
        with t.step("first"):
            time.sleep(0.3)
            with t.stage("inside"):  # (a stage inside another is part of it: no row of its own)
                time.sleep(0.1)
        with t.stage("second"):
            time.sleep(0.2)
        with pytest.raises(RuntimeError):
            with t.stage("failed"):
                raise RuntimeError("x")
        assert [w for w, _ in t.timings] == ["first", "second"]
        assert t.timings[0][1] >= 0.4 and 0.2 <= t.timings[1][1] < 5
        assert [n.text for n in t.notes if n.kind == "done"][0].startswith("✓ first (")
    with local(tmp_path, dry_run=True) as t:  # a dry run did nothing: nothing timed
        with t.stage("planned"):
            pass
        assert t.timings == []


def test_stage_table_written_and_shown(tmp_path, capsys, monkeypatch):
    from specops import views
    from specops.ops import pipeline

    monkeypatch.setenv("SPECOPS_PLAIN", "1")
    stamp = tmp_path / ".specops-setup"
    stamp.write_text("seconds=42\n")
    monkeypatch.setattr(pipeline, "SETUP_STAMP", stamp)
    with local(tmp_path) as t:
        with t.stage("bootstrap"):
            time.sleep(0.2)
        with t.stage("train the draft"):
            time.sleep(0.3)
        st = pipeline.stage_table(t, 1.5, os.getloadavg(), tmp_path / "runs" / "R" / "demo-stages.json")
    assert [r["stage"] for r in st["stages"]][:2] == ["bootstrap", "train the draft"]
    assert st["stages"][-1]["stage"].startswith("the rest") and st["setup_seconds"] == 42.0
    assert sum(r["seconds"] for r in st["stages"]) == pytest.approx(1.5, abs=0.15)
    assert json.loads((tmp_path / "runs/R/demo-stages.json").read_text())["stages"] == st["stages"]
    views.demo_stages(st)
    out = capsys.readouterr().out
    assert "# time each stage took" in out and "stage\tseconds\tshare" in out
    rows = [ln.split("\t") for ln in out.splitlines() if ln.count("\t") == 2][1:]
    assert rows[0][0].startswith("make setup") and rows[0][1] == "42.0" and rows[1][0] == "bootstrap"
    assert re.search(r"^demo: 0m43s in all \(0m42s make setup, 0m01s inv demo\) on \d+ cores, load", out, re.M)
    os.utime(stamp, (time.time() - 3600, time.time() - 3600))  # an old setup is not this demo's
    assert pipeline.setup_seconds() is None


def test_make_test_prints_its_slowest_tests_and_setup_keeps_its_seconds():
    r = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, env={
        **os.environ, "MAKEFLAGS": ""})
    assert r.returncode == 0, r.stderr
    assert re.search(r"pytest .*--durations=\d+", r.stdout), r.stdout
    r = subprocess.run(["make", "-n", "-B", ".venv/.specops-setup"], cwd=REPO, capture_output=True, text=True)
    assert 'echo "seconds=' in r.stdout and "uv pip install -q --python .venv/bin/python -e" in r.stdout, r.stdout
    assert "else .venv/bin/pip install" in r.stdout  # (pip when uv fails)


def test_make_demo_installs_only_the_demos_system_packages(tmp_path):
    """`make demo` runs .ci/system-deps demo (python3-venv, rsync: no sshd, Slurm or munge);
    `make test` the test rig's set too; `make test-fast` only checks the demo's (--check: installs
    nothing); another set is refused in one line, exit 2."""
    env = {**os.environ, "MAKEFLAGS": ""}
    demo = subprocess.run(["make", "-n", "-B", "demo"], cwd=REPO, capture_output=True, text=True, env=env)
    assert "bash .ci/system-deps demo" in demo.stdout and "system-deps test" not in demo.stdout, demo.stdout
    test = subprocess.run(["make", "-n", "test"], cwd=REPO, capture_output=True, text=True, env=env)
    assert "bash .ci/system-deps test" in test.stdout, test.stdout
    fast = subprocess.run(["make", "-n", "-B", "test-fast"], cwd=REPO, capture_output=True, text=True, env=env)
    deps = [ln for ln in fast.stdout.splitlines() if "system-deps" in ln]
    assert deps == ["bash .ci/system-deps --check demo"], fast.stdout
    text = (REPO / ".ci/system-deps").read_text()
    demo_part = "\n".join(ln for ln in text.split('if [ "$what" = test ]')[0].splitlines() if not ln.startswith("#"))
    assert "slurm-wlm" not in demo_part and "munge" not in demo_part and "openssh-server" not in demo_part
    assert "python3-venv" in demo_part and "rsync" in demo_part
    for argv in (["foo"], ["--check", "foo"]):
        bad, calls = system_deps(tmp_path, *argv)
        assert bad.returncode == 2 and bad.stderr.strip() == "system-deps: unknown set 'foo': choose demo or test"
        assert calls == []


def system_deps(tmp_path, *argv: str, have: tuple = ()) -> tuple:
    """.ci/system-deps run with a PATH of stand-ins only: the commands in `have` (each a script that
    does nothing), apt-get and sudo recording their arguments (so nothing is ever installed), id;
    returns (the result, the apt-get/sudo calls recorded)."""
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    bin_, calls = root / "bin", root / "calls"
    bin_.mkdir()
    for name in have:
        (bin_ / name).write_text("#!/bin/sh\n")
    for name in ("apt-get", "sudo"):
        (bin_ / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    (bin_ / "id").symlink_to(shutil.which("id"))
    r = subprocess.run(["/bin/bash", str(REPO / ".ci/system-deps"), *argv], capture_output=True, text=True,
                       env={"PATH": str(bin_)})
    return r, calls.read_text().splitlines() if calls.exists() else []


def test_system_deps_check_names_what_is_missing_and_installs_nothing(tmp_path):
    """`--check` (make test-fast's): what is missing in one line on stderr, exit 1, no apt-get;
    all there: silent, exit 0. Without it, apt-get installs exactly what is missing (here a stand-in
    that records it: the real install is what `make test` and `make demo` run)."""
    r, calls = system_deps(tmp_path, "--check", "demo")  # (no rsync on this PATH)
    assert r.returncode == 1 and r.stdout == "" and calls == [], (r, calls)
    line, = r.stderr.splitlines()
    assert line.startswith("system-deps: missing for 'demo': rsync") and "bash .ci/system-deps demo" in line, line
    r, calls = system_deps(tmp_path, "--check", "test")
    line, = r.stderr.splitlines()
    assert r.returncode == 1 and calls == [] and "openssh-client" in line and "rsync" in line, (line, calls)
    assert set(line.split(": ")[2].split()) <= {"rsync", "python3-venv", "openssh-server", "openssh-client",
                                                "slurm-wlm", "munge"}, line
    everything = ("rsync", "sshd", "ssh-keygen", "slurmctld", "munged")
    for what in ("demo", "test"):
        r, calls = system_deps(tmp_path, "--check", what, have=everything)
        assert (r.returncode, r.stdout, r.stderr, calls) == (0, "", "", []), (what, r)
    r, calls = system_deps(tmp_path, "demo")
    assert r.returncode == 0 and r.stdout == "installing: rsync\n", r
    sudo = "" if os.getuid() == 0 else "sudo "
    assert calls[-1] == f"{sudo}apt-get install -y -qq --no-install-recommends rsync", calls


def test_a_scripts_progress_lines_arrive_as_they_come(tmp_path, monkeypatch):
    """run_script(progress=True): each `[specops] ...` line of the script's stdout is a note the
    moment it is printed (the payload still decoded), other lines are not."""
    from specops.host.remote_exec import run_script

    with local(tmp_path) as t:
        t.ensure_pushed()  # (the probe beside the pushed scripts, on the host only)
        Path(t.workdir, "specops_host", "progress_probe.py").write_text(
            "import time\nfrom specops_host.contract import emit, progress\nprint('pip noise', flush=True)\n"
            "progress('one')\ntime.sleep(1.5)\nprogress('two')\nemit({'ok': True})\n")
        seen = []
        t.on_note = lambda n: seen.append((n.text, time.time()))
        t0 = time.time()
        res = run_script(t, "progress_probe", progress=True)
        end = time.time()
    assert res["ok"] is True
    texts = [s for s, _ in seen]
    assert "one" in texts and "two" in texts and "pip noise" not in texts
    at = dict(seen)
    assert at["one"] - t0 < end - t0 - 1.0, (at, t0, end)  # (shown before the script ended)
    monkeypatch.setenv("SPECOPS_PROGRESS_EVERY", "2")
    assert progress_args() == ["--progress-every", "2"]
    monkeypatch.delenv("SPECOPS_PROGRESS_EVERY")
    assert progress_args() == []


LIVE_PROBE = """
import time
from specops import views
from specops.host.transport import Note
for i in range(3):
    views.note(Note("local", "progress", f"vLLM server starting: {i * 15}s"))
    time.sleep(0.4)
views.note(Note("local", "done", "✓ serve (3.1 s)"))
"""


def test_progress_notes_are_a_live_line_on_a_terminal_and_lines_in_a_pipe(tmp_path):
    """A script's progress lines (notes of kind "progress"): in a pipe one line each, as before;
    on a terminal (a real pty) one live line (rich) rewritten in place, ended before the next
    finished step's line, which stays."""
    import pty

    env = {k: v for k, v in os.environ.items() if k != "SPECOPS_PLAIN"}
    piped = subprocess.run([sys.executable, "-c", LIVE_PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.splitlines() == [f"[specops] vLLM server starting: {s}s" for s in (0, 15, 30)] + \
        ["✓ serve (3.1 s)"], piped.stdout
    out = bytearray()

    def read(fd):
        data = os.read(fd, 65536)
        out.extend(data)
        return data

    env.update(TERM="xterm-256color", COLUMNS="120")
    env.pop("NO_COLOR", None)
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        status = pty.spawn([sys.executable, "-c", LIVE_PROBE], read)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert os.waitstatus_to_exitcode(status) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    assert "vLLM server starting: 30s" in text, text
    before, _, after = text.partition("✓ serve (3.1 s)")
    assert after, text  # (the finished step's line is printed)
    # the three progress lines drawn over one another in one line (carriage return + erase), never
    # scrolled: one line break at most before the step's line (where the live line ended)
    assert "\r\x1b[2K" in before and before.count("\n") <= 1, text
    assert before.index("starting: 0s") < before.index("starting: 15s") < before.index("starting: 30s"), text


def test_a_scripts_progress_lines_are_progress_notes(tmp_path):
    """run_script(progress=True)'s notes from a script's progress lines are of kind "progress"."""
    from specops.host.remote_exec import run_script

    with local(tmp_path) as t:
        t.ensure_pushed()
        Path(t.workdir, "specops_host", "progress_probe.py").write_text(
            "from specops_host.contract import emit, progress\nprogress('one')\nemit({'ok': True})\n")
        seen = []
        t.on_note = seen.append
        assert run_script(t, "progress_probe", progress=True)["ok"] is True
    assert [(n.kind, n.text) for n in seen if n.text == "one"] == [("progress", "one")]
