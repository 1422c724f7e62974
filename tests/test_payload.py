"""The payload framing between remote scripts and the laptop."""

import io
import json
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

from specops.host import remote_exec

from specops_host import contract


def test_markers_agree():
    assert (contract.BEGIN, contract.END) == (remote_exec.BEGIN, remote_exec.END)


def test_stray_output_before_and_after():
    buf = io.StringIO()
    with redirect_stdout(buf):
        print("WARNING banner {not json}")
        contract.emit({"ok": True, "n": [1, 2]})
        print("atexit noise", end="")
    assert remote_exec.decode_payload(buf.getvalue()) == {"ok": True, "n": [1, 2]}


def test_last_payload_wins_and_missing_is_none():
    out = f"{contract.BEGIN}{json.dumps({'a': 1})}{contract.END}\n{contract.BEGIN}{json.dumps({'a': 2})}{contract.END}"
    assert remote_exec.decode_payload(out) == {"a": 2}
    assert remote_exec.decode_payload("nothing here") is None


def test_real_script_process():
    code = "from specops_host import contract; import sys; print('noise'); contract.emit({'ok': 1}); sys.stderr.write('err')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent.parent)
    assert remote_exec.decode_payload(p.stdout) == {"ok": 1}
