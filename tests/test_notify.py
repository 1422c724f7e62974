"""Notifications, the fast layer (remote/specops_host/jobs/notify.py): a bad URL refused on the laptop
before anything is created, no secret in a line, one deadline for a whole delivery (a real loopback
webhook that drips its answer, a command that hangs), basic auth from the URL, the Notifier that
the supervisor never waits on. A real job over the real sshd: test_longruns.py."""

import base64
import time
from pathlib import Path

import pytest

from conftest import inv
from specops.errors import SpecopsError
from specops.ops import watch as ops_watch
from specops_host.jobs import notify
from webhooks import Webhook

REPO = Path(__file__).resolve().parent.parent

#: (URL, why) the laptop refuses; none of their secrets (PASSWORD, SECRET) may show
BAD = [("http://127.0.0.1:99999/hooks/SECRET", "port 99999 is out of range: give 1 to 65535"),
       ("http://ops:PASSWORD@127.0.0.1:abc/hooks/SECRET", "port 'abc' is not a number: give 1 to 65535"),
       ("http://[::1/hooks/SECRET?token=SECRET", "an unclosed [ in the URL's host: an IPv6 address is written in "
                                                 "brackets, e.g. http://[::1]:8080/..."),
       ("http:///hooks/SECRET", "a URL without a host"),
       ("https://hooks.example:0/SECRET", "port 0 is out of range: give 1 to 65535"),
       ("http://hooks.example/a SECRET", "a URL holding a space or a control character: percent-encode it (a space "
                                         "is %20)")]


def test_a_bad_url_is_refused_in_one_line_naming_no_secret():
    for url, why in BAD:
        assert notify.problem(url) == why, url
        with pytest.raises(SpecopsError) as e:
            ops_watch.check_flags(notify=url)
        assert e.value.code == 2 and str(e.value).endswith(why) and str(e.value).startswith("--notify 'http")
        assert "SECRET" not in str(e.value) and "PASSWORD" not in str(e.value), str(e.value)
    assert str(pytest.raises(SpecopsError, ops_watch.check_flags, notify="http:///hooks/SECRET").value) == (
        "--notify 'http:///...': a URL without a host")
    # credentials in the URL are basic auth: accepted, shown without them
    url = "https://ops:PASSWORD@hooks.example:8443/T0/SECRET?token=SECRET"
    assert notify.problem(url) is None and notify.shown(url) == "https://hooks.example:8443/..."
    assert notify.without_credentials(url) == ("https://hooks.example:8443/T0/SECRET?token=SECRET",
                                               "Basic " + base64.b64encode(b"ops:PASSWORD").decode())
    assert notify.scrub(f"InvalidURL: nonnumeric port: 'PASSWORD@hooks.example' in {url}", url) == (
        "InvalidURL: nonnumeric port: '...@hooks.example' in ...")
    # a command holding a URL is a command (its program shown, never its arguments)
    assert notify.problem("curl -s -d @- https://hooks.example/SECRET") is None
    assert notify.shown("curl -s -d @- https://hooks.example/SECRET") == "command 'curl'"


def cli(cwd, *args):
    return inv("-r", str(REPO), "train", "--run-id", "n-port", *args, cwd=cwd, timeout=300)


def test_inv_train_refuses_a_bad_url_before_anything_is_created_flag_or_hosts_yaml_dry_run_or_not(tmp_path):
    runs = []
    for i, (url, why) in enumerate(BAD[:4]):
        d = tmp_path / f"flag{i}"
        d.mkdir()
        runs.append((d, why, "--notify", cli(d, "--host", "local", "--notify", url, *["--dry-run"] * (i % 2))))
    for i, (url, why) in enumerate(BAD[:2]):
        d = tmp_path / f"yaml{i}"
        d.mkdir()
        (d / "hosts.yaml").write_text(f"hosts:\n  box:\n    transport: local\n    workdir: {d}/work\n"
                                      f"    notify: '{url}'\n")
        runs.append((d, why, "hosts.yaml", cli(d, "--host", "box", "--hosts", str(d / "hosts.yaml"),
                                               *["--dry-run"] * i)))
    for d, why, where, p in runs:
        out, err = p.stdout, p.stderr
        lines = err.strip().splitlines()
        said = f"{d}/hosts.yaml: host 'box', field 'notify': {why}" if where == "hosts.yaml" else why
        assert len(lines) == 1 and lines[0].startswith("specops: ") and lines[0].endswith(said), (where, err)
        # (hosts.yaml's exit code: as any field's)
        assert p.returncode == (2 if where == "--notify" else 1), (where, p.returncode, err)
        assert "SECRET" not in out + err and "PASSWORD" not in out + err, out + err
        assert sorted(x.name for x in d.iterdir()) == (["hosts.yaml"] if where == "hosts.yaml" else []), d


def test_a_webhook_that_drips_is_given_up_at_one_deadline_and_credentials_go_as_basic_auth():
    hook = Webhook(drip=1, every=1.0, drips=20)
    url = f"http://ops:PASSWORD@127.0.0.1:{hook.port}/hooks/SECRET?token=SECRET2"
    try:
        t0 = time.monotonic()
        why = notify.send(url, "end", "done", "r1", timeout=2)
        took = time.monotonic() - t0
        assert why == "no answer in 2s (given up)" and took < 2 + notify.KILL_AFTER_S + 1, (why, took)
        assert notify.send(url, "end", "done again", "r1", timeout=5) is None  # (answered at once: delivered)
        auth = "Basic " + base64.b64encode(b"ops:PASSWORD").decode()
        assert [(g["path"], g["auth"], g["text"]) for g in hook.got] == [
            ("/hooks/SECRET?token=SECRET2", auth, "done"), ("/hooks/SECRET?token=SECRET2", auth, "done again")]
    finally:
        hook.close()


def test_the_notifier_never_holds_its_caller_and_delivers_in_order_each_within_its_deadline():
    hook = Webhook(drip=1, every=1.0, drips=20)
    url = f"http://127.0.0.1:{hook.port}/hooks/SECRET"
    said = []
    try:
        n = notify.Notifier(url, "box", deadline=2)
        t0 = time.monotonic()
        n.post("restart", "train r1", "restart 1 of 1 in 1s: exit 3 before any step", "r1", said.append)
        n.post("end", "train r1", "succeeded after 1 restart(s)", "r1", said.append)
        assert time.monotonic() - t0 < 0.5  # (the caller goes on: the deliveries are the thread's)
        assert n.wait(20) and time.monotonic() - t0 < 2 * (2 + notify.KILL_AFTER_S) + 2
        assert said == [f"notify (restart): could not deliver to http://127.0.0.1:{hook.port}/...: no answer in 2s "
                        f"(given up)"], said
        assert [g["text"] for g in hook.got] == ["specops: train r1 on box: restart 1 of 1 in 1s: exit 3 before any "
                                                 "step", "specops: train r1 on box: succeeded after 1 restart(s)"]
    finally:
        hook.close()
    env = {notify.VAR: url, notify.HOST_VAR: "gpu1", "OTHER": "1"}
    n = notify.Notifier.of(env)
    assert (n.target, n.host, env) == (url, "gpu1", {"OTHER": "1"}) and notify.Notifier.of({}) is None


def test_a_hanging_notify_command_is_given_up_at_its_deadline_with_every_process_it_started(tmp_path):
    pid = tmp_path / "pid"
    t0 = time.monotonic()
    why = notify.send(f"echo $$ > {pid}; sleep 60; true", "end", "x", "r1", timeout=2)
    assert why == "no answer in 2s (given up)" and time.monotonic() - t0 < 2 + notify.KILL_AFTER_S + 1, why
    sh = int(pid.read_text())
    assert wait_for(lambda: not alive_in_group(sh), 5), alive_in_group(sh)  # (the shell and its sleep)


def alive_in_group(pgid: int) -> list[str]:
    """The processes of group pgid that still run (a zombie waits for its reaper: it runs nothing)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(stat.parent.name)
    return out


def wait_for(pred, timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.1)
    return False
