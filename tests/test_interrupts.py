"""An interrupted command leaves nothing it started (issue 34, item 2): the runs a plan, a pipeline
or the demo start for themselves are theirs, stopped on Ctrl-C or SIGTERM with a line saying so;
`inv train --follow` keeps detaching from the user's own run."""

import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, wait_for
from specops.host.connection import connect
from specops.ops import controls, jobs, plan, train


class Called(Exception):
    pass


def test_plans_and_pipelines_own_their_trainings(monkeypatch):
    """measure_train (a plan's sample run) and the pipeline's trainings ask train() for own=True:
    Ctrl-C stops them (run_attached's stop_on_interrupt) where `inv train --follow` detaches."""
    import inspect

    assert inspect.signature(train.train).parameters["own"].default is False  # (inv train: the user's run)
    seen = []

    def fake_train(t, **kw):
        seen.append(kw.get("own"))
        raise Called()

    monkeypatch.setattr(train, "train", fake_train)
    with pytest.raises(Called):
        plan.measure_train(None, "offline", dataset="d", verifier="v", config=None, steps=2, layers=None,
                           vllm_arg=[], tokens=1, train_ratio=1.0, tmp=None)

    class T:
        workdir = "/w"

        def check(self, *a, **k):
            return None

    with pytest.raises(Called):
        controls.untrained_draft(T(), "r1", dataset="d", verifier="v")
    assert seen == [True, True], seen


DRIVER = """
import sys
from specops import inventory
from specops.host.connection import connect
from specops.ops import jobs
from specops.cli import term_as_interrupt
term_as_interrupt()
h = inventory.load(sys.argv[1]).get("light")
with connect(h, on_note=lambda n: print(n.text, flush=True)) as t:
    try:
        jobs.run_attached(t, sys.argv[2], ["sh", "-c", "echo started; sleep 300"], kind="train",
                          stop_on_interrupt=sys.argv[3] == "own")
    except Exception as e:
        print("ERROR", e, flush=True)
        sys.exit(1)
    print("RETURNED", flush=True)
"""


@pytest.mark.parametrize("sig,how", [(signal.SIGINT, "own"), (signal.SIGTERM, "own"), (signal.SIGINT, "user")])
def test_an_interrupt_stops_the_commands_own_run_and_detaches_from_the_users(light_host, sig, how):
    from test_identity import hosts_file

    rid = jobs.new_run_id("t") + f"-int-{how}"
    p = subprocess.Popen([sys.executable, "-c", DRIVER, hosts_file(light_host), rid, how], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with connect(light_host) as t:
            wait_for(lambda: jobs.status(t, rid)[0].state == "running" if t.exists(jobs.run_path(t, rid, "job.json"))
                     else False, 60, "the run started")
            time.sleep(1)
            p.send_signal(sig)
            out, _ = p.communicate(timeout=90)
            state = jobs.status(t, rid)[0].state
            if how == "own":
                assert p.returncode == 1 and f"interrupted: stopping {rid}" in out, out
                assert f"ERROR train {rid} interrupted and stopped on light" in out, out
                assert state == "stopped", state
                left = t.run(f"grep -l {rid} /proc/[0-9]*/environ 2>/dev/null").stdout.split()
                assert left == [], left
            else:
                assert p.returncode == 0 and f"detached from {rid}; it keeps running on light" in out, out
                assert state == "running"
                assert jobs.stop(t, rid, grace=2).state == "stopped"
    finally:
        if p.poll() is None:
            p.kill()
