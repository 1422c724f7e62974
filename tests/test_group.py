"""One Group (specops/group/fanout.py): open every host's connection in parallel, run a function
on each in parallel, collect one outcome per host (a failing host is a value), close them all.
Recording connections (tests/fakes.py); the real several-host tasks (group train, extract,
dist-check) run through the same Group against the real sshd in test_scaleout."""

import threading

import pytest

from fakes import RecordingTransport
from specops import inventory
from specops.errors import SpecopsError
from specops.group.fanout import Group, run_on, verdict


def hosts(*names):
    return [inventory.Host(name=n, transport="local", profile="cpu", venv="/v", workdir=f"/w/{n}") for n in names]


class Opened:
    """A connect() that records every connection it opens and closes; `down` cannot be reached."""

    def __init__(self, down=(), dry=False):
        self.down, self.open, self.closed, self.lock = set(down), [], [], threading.Lock()
        self.dry = dry  # (the connections' --dry-run: connect decides it, as cli.open_host does)

    def __call__(self, h, **kw):
        if h.name in self.down:
            raise SpecopsError(f"cannot connect to {h.name}: refused")
        t = RecordingTransport(h, dry_run=self.dry)
        t.close = lambda name=h.name: self.closed.append(name)
        with self.lock:
            self.open.append(h.name)
        return t


def test_a_group_runs_on_every_host_in_parallel_and_a_failing_host_is_a_value():
    conn = Opened()
    barrier = threading.Barrier(3, timeout=10)  # (all three at once, or the barrier breaks)

    def fn(t):
        barrier.wait()
        if t.host.name == "b":
            raise SpecopsError("b: disk full", detail="tail")
        return t.host.name.upper()

    with Group.open(hosts("a", "b", "c"), connect=conn) as g:
        assert [t.host.name for t in g.transports] == ["a", "b", "c"]
        outs = g.run(fn)
    assert [(o.host, o.ok, o.value) for o in outs] == [("a", True, "A"), ("b", False, None), ("c", True, "C")]
    assert outs[1].error == "b: disk full\ntail"
    assert sorted(conn.closed) == ["a", "b", "c"]
    with pytest.raises(SpecopsError, match=r"run: 1 of 3 host\(s\) failed: b: b: disk full$"):
        verdict("run", outs)


def test_all_or_none_closes_the_others_and_names_every_unreachable_host():
    conn = Opened(down={"b", "c"})
    with pytest.raises(SpecopsError, match=r"cannot reach every node: b: cannot connect to b: refused; c: "):
        Group.open(hosts("a", "b", "c"), connect=conn)
    assert conn.open == ["a"] and conn.closed == ["a"]


def test_run_on_keeps_an_unreachable_host_as_a_failed_outcome_and_goes_on():
    conn = Opened(down={"b"}, dry=True)
    outs = run_on(hosts("a", "b"), lambda t: t.run("hostname", changes=False).ok, connect=conn)
    assert [(o.host, o.ok, o.value, o.error) for o in outs] == [
        ("a", True, True, ""), ("b", False, None, "cannot connect to b: refused")]
    assert conn.closed == ["a"]


def test_a_bug_on_one_host_is_its_outcome_not_the_groups():
    outs = run_on(hosts("a", "b"), lambda t: 1 // (t.host.name == "a"), connect=Opened())
    assert [(o.host, o.ok) for o in outs] == [("a", True), ("b", False)]
    assert outs[1].error.startswith("ZeroDivisionError")


def test_a_dry_run_that_stops_on_a_host_is_its_plan_not_a_failure():
    """Under --dry-run a host whose operation reads what a planned change would have written stops
    there (NotDone): its outcome is ok, its value the host's Plan, `stopped` the line it stopped with."""
    def fn(t):
        t.put_text("x", "/w/f", label="(f)")
        return t.read_bytes("/w/f")  # (the dry run did not write it)

    outs = run_on(hosts("a", "b"), fn, connect=Opened(dry=True))
    assert [(o.host, o.ok, o.value.files) for o in outs] == [("a", True, ["/w/f"]), ("b", True, ["/w/f"])]
    assert all(o.stopped == "stops here: what follows reads /w/f, which only a real run writes" for o in outs)
    real = run_on(hosts("a"), fn, connect=Opened())
    assert real[0].ok and real[0].value is None and not real[0].stopped
