"""An online run's stop is the operator's, whatever its server does meanwhile (seventh SmolLM2 GPU run, 2026-12-07):
`inv stop` signalled the trainer, which saved checkpoints/interrupted; vLLM's hidden-states connector then died on
the requests the stop cancelled (KeyError on the request id), and train/online.py (1) took that as a server dying
mid-training: a second SIGTERM to a trainer still saving (speculators takes a second one as "exit now": the
checkpoint lost where the save is slower), and (2) ended the stopped run with `VLLMServerError` and exit 1.

Here the trainer is a real process with real signals (it counts them, and takes a second to "save"); only the
server side is stood in, so the race is certain rather than timed: the server "dies" the moment the trainer starts
saving. The real stop over a real vLLM server: test_online.py's test_online_stop_then_resume_then_a_dying_server_...
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

TRAINER = """
import pathlib, signal, sys, time
d = pathlib.Path(sys.argv[1])
def on_term(signum, frame):
    if (d / "saving").exists():
        (d / "second").write_text("a second SIGTERM while saving")
        sys.exit(3)
    (d / "saving").write_text("saving")
    time.sleep(1.5)
    (d / "saved").write_text("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
(d / "ready").write_text("ready")
while True:
    time.sleep(0.05)
"""

DRIVER = """
import json, pathlib, sys, time
from specops_host.serve import vllm_server
from specops_host.train import online
d, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
vllm_server.start = lambda *a, **k: None
vllm_server.stop = lambda *a, **k: None
online.server_argv = lambda *a, **k: []
def watch(p, server_dir, url, hang, during, poll=1.0):
    # the server ends as the trainer starts saving (mode stop), or on its own while it trains (mode die)
    marker = d / ("saving" if mode == "stop" else "ready")
    while p.poll() is None and not marker.exists():
        time.sleep(0.02)
    if p.poll() is not None:
        return None
    return vllm_server.ServerDied(f"the vLLM server exited (succeeded) during {during}: KeyError 'cmpl-1'"
                                  f" (log: {server_dir}/output.log)")
vllm_server.watch = watch
spec = {"run_dir": str(d / "runs" / "t-stop"), "kind": "cpu", "verifier": "v",
        "online": {"layer_ids": [2], "tensor_parallel": 1}, "online_timing": {"trainer_grace": 20}}
pathlib.Path(spec["run_dir"]).mkdir(parents=True)
sys.exit(online.run(spec, lambda url: [sys.executable, str(d / "trainer.py"), str(d)]))
"""


def drive(tmp_path, mode):
    (tmp_path / "trainer.py").write_text(textwrap.dedent(TRAINER))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "remote")}
    p = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), mode], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0 = time.time()
    while not (tmp_path / "ready").exists():
        assert p.poll() is None and time.time() - t0 < 30, p.communicate()[0]
        time.sleep(0.02)
    if mode == "stop":
        p.send_signal(signal.SIGTERM)  # (`inv stop`'s signal to the online run)
    out, _ = p.communicate(timeout=60)
    return p.returncode, out


@pytest.mark.parametrize("mode", ["stop", "die"])
def test_a_server_ending_under_a_stop_is_not_the_runs_error_nor_a_second_signal(tmp_path, mode):
    code, out = drive(tmp_path, mode)
    assert (tmp_path / "saved").exists(), out  # (the checkpoint's save ran to its end)
    assert not (tmp_path / "second").exists(), out  # (one SIGTERM, never a second while it saves)
    if mode == "stop":
        assert code == 0, out  # (the trainer's own exit after its save)
        assert "VLLMServerError" not in out, out
        assert ("[specops] the vLLM server ended while the trainer stopped on signal 15: the vLLM server exited "
                "(succeeded) during training: KeyError 'cmpl-1'") in out, out
        assert "its vLLM server is gone" not in out, out
    else:  # (no stop asked: the server's end is the run's error, one line, and the trainer is stopped once)
        assert code == 1, out
        assert "[specops] stopping the trainer: its vLLM server is gone" in out, out
        assert out.strip().splitlines()[-1].startswith(
            "VLLMServerError: the vLLM server exited (succeeded) during training: KeyError 'cmpl-1'"), out
