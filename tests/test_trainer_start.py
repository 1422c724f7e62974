"""A host program's fixed cost (remote/specops_host/lean.py: the trainer's and the preflight's; failures rows 265-267):
its imports loaded without cyclic garbage collection, then frozen; its end without the interpreter's teardown, but
with everything that teardown does that anyone sees. Run here in a real Python process (stdlib only: the heavy tests
train and check through the same code, and read what they wrote at their end: checkpoints, TensorBoard events,
payloads and exit codes)."""

import subprocess
import sys

from conftest import REPO

ENDING = r"""
import atexit, gc, logging, sys, threading, time
from pathlib import Path
from specops_host import lean

out = Path(sys.argv[1])
settled = lean.imports_untraced()
collecting = gc.isenabled()
import json, email.parser  # (modules loaded meanwhile)
settled()
print("collecting while importing:", collecting, "after:", gc.isenabled(), "frozen:", gc.get_freeze_count() > 0)


class Closing(logging.Handler):  # (speculators' TensorBoard handler: its writer closed by logging's atexit)
    def emit(self, record):
        pass

    def close(self):
        (out / "handler-closed").write_text("yes")
        super().close()


logging.getLogger("t").addHandler(Closing())
atexit.register(lambda: (out / "atexit").write_text("ran"))


def late():  # (a non-daemon thread still writing: the interpreter waits for it, so must this exit)
    time.sleep(0.5)
    (out / "thread").write_text("done")


threading.Thread(target=late).start()
sys.stdout.write("buffered, not flushed")
lean.exit_without_teardown(int(sys.argv[2]))
(out / "after").write_text("reached")
"""


def ending(tmp_path, code):
    env = {"PYTHONPATH": str(REPO / "remote"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-c", ENDING, str(tmp_path), str(code)], capture_output=True, text=True,
                          env=env, timeout=60)


def test_a_trainer_ends_as_the_interpreter_would_without_its_teardown(tmp_path):
    p = ending(tmp_path, 3)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stdout.splitlines() == ["collecting while importing: False after: True frozen: True",
                                     "buffered, not flushed"], p.stdout + p.stderr
    got = {f.name: f.read_text() for f in tmp_path.iterdir()}
    assert got == {"handler-closed": "yes", "atexit": "ran", "thread": "done"}, got
    assert p.stderr == ""


def test_a_trainer_ending_with_code_0(tmp_path):
    p = ending(tmp_path, 0)
    assert p.returncode == 0 and p.stderr == "" and (tmp_path / "thread").read_text() == "done", p.stderr
