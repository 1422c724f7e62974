"""The trainer's interrupt (`inv stop`'s SIGTERM) is never swallowed: speculators' handler raises
TrainingInterruptedError wherever the main process is, and train/hooked.py makes it a BaseException for every run
(online and offline), so no `except Exception` layer on the way keeps the run from saving checkpoints/interrupted."""

import shlex

from specops import inventory
from specops.host.connection import connect

SNIPPET = """
import os, signal, time
from specops_host.train import hooked
hooked.interrupt_passes()
from speculators.train.graceful_shutdown import GracefulShutdownHandler, TrainingInterruptedError
handler = GracefulShutdownHandler()
handler.install()
try:
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("not interrupted")
    except Exception:  # (a retry layer, a library's fallback)
        print("swallowed")
except TrainingInterruptedError:
    print("reached the trainer's handler")
finally:
    handler.restore()
"""


def test_the_trainers_interrupt_passes_every_except_exception_layer(cpu_box, hosts_file):
    h = inventory.load(str(hosts_file)).get("box")
    with connect(h) as t:
        t.ensure_pushed()
        r = t.run(f"cd {shlex.quote(t.workdir)} && {shlex.quote(t.expand(h.python))} -c {shlex.quote(SNIPPET)}")
    assert r.ok and r.stdout.strip().splitlines()[-1:] == ["reached the trainer's handler"], (r.stdout, r.stderr)
