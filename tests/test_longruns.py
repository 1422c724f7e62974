"""Long runs that look after themselves, for real: the CPU trainer (speculators) over the real sshd,
its supervisor on the host (remote/specops_host/jobs/watch.py), checkpoint markers (ckpt.py,
train/hooked.py), notifications to a local webhook (the rig's sshd is on loopback: the host is this
machine). One training is killed, frozen and damaged in turn; the cheap cases (the same failure
twice, `inv stop` in the back-off, a bad webhook, a webhook that drips its answer) run a tiny command
on the stdlib-only host."""

import base64
import http.server
import json
import re
import threading
import time

from conftest import cpu_train_config, inv, wait_for
from specops import inventory
from specops.contract import Supervision
from specops.host.connection import connect
from specops.ops import jobs
from specops_host import ckpt
from specops_host.jobs import notify
from webhooks import Webhook

CFG = cpu_train_config(2)


class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.server.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["text"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def webhook():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    srv.got = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def record(t, rid, name="job.json"):
    return json.loads(t.read_bytes(jobs.run_path(t, rid, name)) or b"{}")


def steps(t, rid, since=0):
    return (t.read_bytes(jobs.run_path(t, rid, "output.log")) or b"")[since:].count(b"train/loss=")


def log_size(t, rid):
    return len(t.read_bytes(jobs.run_path(t, rid, "output.log")) or b"")


def global_step(t, rid, name):
    return record(t, rid, f"checkpoints/{name}/training_state.json")["global_step"]


def complete(t, rid, name):
    """The marker of checkpoint `name` lists every file with the size the host has now."""
    marker = record(t, rid, f"checkpoints/{name}/{ckpt.MARKER}")
    sizes = {rel: int(t.run(f"stat -c %s {jobs.run_path(t, rid, 'checkpoints', name, rel)}").stdout)
             for rel in marker.get("files", {})}
    return bool(marker.get("files")) and sizes == marker["files"]


def test_a_killed_then_frozen_training_restarts_itself_and_resume_skips_a_damaged_checkpoint(
        pipeline_run, hosts_file, tmp_path):
    cfg = tmp_path / "two.yaml"
    cfg.write_text(CFG)
    h = inventory.load(str(hosts_file)).get("box")
    rid = jobs.new_run_id("t-longrun")
    hook = webhook()
    base = ["--host", "box", "--hosts", str(hosts_file), "--config", str(cfg), "--dataset", "pipe", "--run-id", rid,
            "--no-serve-check"]
    try:
        r = inv("train", *base, "--restarts", "3", "--backoff", "1", "--stall-after", "12", "--restart-on-stall",
                "--notify", f"http://127.0.0.1:{hook.server_port}/hooks/T0/SECRET")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert f"looked after on box: restarts: up to 3 (back-off 1s, doubling); stall: no step for 12s, then " \
               f"restarted; notify: http://127.0.0.1:{hook.server_port}/..." in r.stdout, r.stdout
        with connect(h) as t:
            assert "SECRET" not in t.run(f"cat {jobs.run_path(t, rid, 'job.json')}; ps -eo args").stdout
            # 1. the trainer SIGKILLed mid-epoch (as the OOM killer would), once epoch 0's checkpoint is complete
            wait_for(lambda: t.exists(jobs.run_path(t, rid, "checkpoints", "0", ckpt.MARKER), "-f"), 300,
                     "checkpoint 0 marked complete")
            per_epoch = global_step(t, rid, "0")
            n = steps(t, rid)
            wait_for(lambda: steps(t, rid) > n, 120, "a step of epoch 1")
            t.check(f"kill -KILL {record(t, rid)['child_pid']}", "the SIGKILL")
            wait_for(lambda: "restart 1 of 3" in jobs.status(t, rid)[0].describe, 30, "restart 1 in status")
            j = jobs.status(t, rid)[0]
            assert j.state == "running" and re.search(r"restart 1 of 3( in \d+s)?: signal 9 \(SIGKILL\) at step \d+",
                                                      j.describe), j.describe
            # 2. the restarted trainer frozen (SIGSTOP, as a hung collective): stalled, stacks, restarted
            since = log_size(t, rid)
            wait_for(lambda: steps(t, rid, since) >= 1, 300, "a step after the restart")
            t.check(f"kill -STOP {record(t, rid)['child_pid']}", "the SIGSTOP")
            wait_for(lambda: jobs.status(t, rid)[0].state == "stalled", 60, "the stalled state")
            wait_for(lambda: "restart 2 of 3" in jobs.status(t, rid)[0].describe, 60, "restart 2 in status")
            # 3. it ends by itself as an uninterrupted run would: every step, a final complete checkpoint
            wait_for(lambda: t.exists(jobs.run_path(t, rid, "exit_code"), "-f"), 400, "the run's end")
            j = jobs.status(t, rid)[0]
            assert j.state == "succeeded", j.describe + jobs.tail(t, rid, 30)
            assert complete(t, rid, "1") and global_step(t, rid, "0") == per_epoch
            runrec = record(t, rid, "run.json")
            causes = [x["cause"] for x in runrec["restarts"]]
            assert causes[0] == "signal 9 (SIGKILL)" and causes[1].startswith("stalled (no training step for "), causes
            assert [s.get("restart") for s in runrec["starts"]] == [None, 1, 2]
            stacks = t.run(f"cat {jobs.run_path(t, rid, 'stacks')}/2*.txt").stdout
            assert "State:\tT (stopped)" in stacks, stacks
            log = t.read_bytes(jobs.run_path(t, rid, "output.log")).decode()
            assert re.search(r"stalled: no training step for \d+s \(at step \d+; limit 12s", log)
            assert "resuming from checkpoint 0" in log
        # (the end's notification goes after the exit code, off the supervisor's loop: jobs/notify.py)
        wait_for(lambda: any(x.endswith(": succeeded after 2 restart(s)") for x in hook.got), 30, "the end's notice")
        said = " | ".join(hook.got)
        assert "restart 1 of 3 in 1s: signal 9 (SIGKILL)" in said and "stalled: no training step" in said
        assert hook.got[-1].startswith(f"specops: train {rid} on ") and hook.got[-1].endswith(
            ": succeeded after 2 restart(s)"), hook.got

        # ... as the same training uninterrupted: the same steps (epochs differ in length: the sampler's
        # batches), the same checkpoints
        ref = rid + "-ref"
        r = inv("train", "--host", "box", "--hosts", str(hosts_file), "--config", str(cfg), "--dataset", "pipe",
                "--run-id", ref, "--no-serve-check", "--follow")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        with connect(h) as t:
            assert [global_step(t, rid, n) for n in "01"] == [global_step(t, ref, n) for n in "01"]
            mine, theirs = (record(t, x, f"checkpoints/1/{ckpt.MARKER}")["files"] for x in (rid, ref))
            assert sorted(mine) == sorted(theirs) and mine["model.safetensors"] == theirs["model.safetensors"]
            final = global_step(t, rid, "1")

        # 4. a save cut short (its model file truncated, as a kill mid-write leaves it): resume skips it
        with connect(h) as t:
            model = jobs.run_path(t, rid, "checkpoints", "1", "model.safetensors")
            t.check(f"truncate -s 100 {model}", "truncate")
        r = inv("train", *base, "--epochs", "3", "--follow", "--restarts", "0")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        with connect(h) as t:
            log = t.read_bytes(jobs.run_path(t, rid, "output.log")).decode()
            m = re.search(r"checkpoint 1 is incomplete \(model\.safetensors is 100 bytes, \d+ when saved\): set aside "
                          r"as checkpoints/(incomplete-1-\d{8}-\d{6})", log)
            assert m and log.rindex("resuming from checkpoint 0") > m.start(), log[-3000:]
            assert global_step(t, rid, "1") == final and global_step(t, rid, "2") > final and complete(t, rid, "2")
        r = inv("fetch", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--checkpoint", m.group(1),
                "--dest", str(tmp_path / "runs"))
        assert r.returncode != 0 and f"checkpoint '{m.group(1)}' of run {rid} on box is incomplete" in r.stderr, r.stderr
        r = inv("fetch", "--host", "box", "--hosts", str(hosts_file), "--run-id", rid, "--checkpoint", "2",
                "--dest", str(tmp_path / "runs"))
        assert r.returncode == 0 and f"skipped the incomplete checkpoint(s) of {rid}: {m.group(1)}" in " ".join(
            (r.stdout + r.stderr).split()), r.stdout + r.stderr
    finally:
        hook.shutdown()


def test_the_same_failure_twice_stops_and_stop_in_the_back_off_ends_it_and_a_bad_webhook_is_one_line(
        rig, light_host):
    hf = str(rig.root / "hosts-light.yaml")
    with connect(light_host) as t:
        py = t.expand(light_host.python)
        fail = [py, "-c", "print('train/loss=1.0, global_step=7', flush=True); raise SystemExit(3)"]
        rid = jobs.new_run_id("t-same")
        jobs.start(t, rid, fail, kind="train", supervision=Supervision(restarts=3, backoff=0.2))
        wait_for(lambda: jobs.status(t, rid)[0].ended, 60, "the end")
        j = jobs.status(t, rid)[0]
        assert j.state == "failed" and j.describe == ("failed (exit 3; restart 1 of 3: exit 3 at step 7; restarts "
                                                      "stopped: the same failure twice (exit 3 at step 7))"), j.describe
        assert jobs.tail(t, rid, 40).count("start: ") == 2

        rid = jobs.new_run_id("t-backoff")
        jobs.start(t, rid, [py, "-c", "raise SystemExit(5)"], kind="train",
                   supervision=Supervision(restarts=2, backoff=60, notify="http://127.0.0.1:9/hooks/x"))
        wait_for(lambda: "restart 1 of 2 in" in jobs.status(t, rid)[0].describe, 60, "the back-off")
        t0 = time.time()
        r = inv("stop", "--host", "light", "--hosts", hf, "--run-id", rid)
        assert r.returncode == 0 and time.time() - t0 < 30, r.stdout + r.stderr
        j = jobs.status(t, rid)[0]
        assert j.state == "stopped", j.describe
        log = jobs.tail(t, rid, 40)
        assert log.count("start: ") == 1 and "stopped during the back-off (`inv stop`): not restarted" in log
        log = wait_for(lambda: next((x for x in [jobs.tail(t, rid, 40)] if "notify (end)" in x), None), 30,
                       "the end's notification given up")  # (sent after the exit code: jobs/notify.py)
        bad = [ln for ln in log.splitlines() if "notify (" in ln]
        assert len(bad) == 2 and all(re.search(r"notify \((restart|end)\): could not deliver to http://127\.0\.0\.1:9/"
                                               r"\.\.\.: .*refused", ln) for ln in bad), bad


def test_a_dripping_webhook_holds_neither_a_restart_nor_the_runs_end_and_names_the_host_as_hosts_yaml_does(
        rig, light_host):
    """The webhook answers `200 OK`, then a byte every 5 s (a per-read timeout never ends that): the
    restart and the run's end (its exit code) do not wait; the restart's notification is given up at
    its deadline, the end's is then delivered; basic auth from the URL; no secret on the host."""
    hook = Webhook(drip=1, every=5.0, drips=12)
    url = f"http://ops:PASSWORD@127.0.0.1:{hook.port}/hooks/SECRET?token=SECRET2"
    try:
        with connect(light_host) as t:
            py = t.expand(light_host.python)
            code = ("import os, time; n = os.environ.get('SPECOPS_RESTART'); "
                    "print('attempt', n or 0, 'ends at', time.time(), flush=True); raise SystemExit(0 if n else 3)")
            rid = jobs.new_run_id("t-drip")
            jobs.start(t, rid, [py, "-c", code], kind="train",
                       supervision=Supervision(restarts=1, backoff=0.2, notify=url))
            wait_for(lambda: t.exists(jobs.run_path(t, rid, "exit_code"), "-f"), 60, "the run's end")
            ended = float(t.run(f"{py} -c 'import os, sys; print(os.stat(sys.argv[1]).st_mtime)' "
                                f"{jobs.run_path(t, rid, 'exit_code')}").stdout)
            seen = t.run(f"cat {jobs.run_path(t, rid, 'job.json')} {jobs.run_path(t, rid, 'output.log')}; "
                         f"ps -eo args").stdout  # (the restart's delivery still dripping: its process too)
            assert hook.got and hook.got[0]["closed"] is None, hook.got  # (still dripping at the run's end)
            log = jobs.tail(t, rid, 40)
            ends = [float(x) for x in re.findall(r"attempt \d ends at ([\d.]+)", log)]
            assert len(ends) == 2 and ends[1] - ends[0] < 5 and ended - ends[1] < 5, (ends, ended, log)
            assert jobs.status(t, rid)[0].state == "succeeded"
            # the restart's notification given up at its deadline; then the end's delivered
            wait_for(lambda: len(hook.got) == 2 and hook.got[1]["closed"], 3 * notify.DEADLINE_S,
                     "the end's notification")
            log = wait_for(lambda: next((x for x in [jobs.tail(t, rid, 40)] if "notify (restart)" in x), None), 10,
                           "the give-up")
            m = re.search(r"\[specops\] (\S+ \S+) notify \(restart\): could not deliver to "
                          rf"http://127\.0\.0\.1:{hook.port}/\.\.\.: no answer in 15s \(given up\)", log)
            assert m, log
            gave_up = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
            assert notify.DEADLINE_S - 1 <= gave_up - hook.got[0]["at"] <= notify.DEADLINE_S + notify.KILL_AFTER_S, (
                gave_up, hook.got[0]["at"])
            assert log.count("notify (") == 1, log  # (the end's delivered)
            pid = record(t, rid)["pid"]
            wait_for(lambda: t.run(f"ps -o stat= -p {pid}").stdout.strip()[:1] in ("", "Z"), 10,
                     "the supervisor's exit, its last notification done")
            # `inv stop` while the end's notification drips: the stop does not wait for it either
            hook.drip = 3
            rid2 = jobs.new_run_id("t-drip-stop")
            jobs.start(t, rid2, [py, "-c", "import time; time.sleep(120)"], kind="train",
                       supervision=Supervision(restarts=0, backoff=1, notify=url))
            t0 = time.time()
            stopped = jobs.stop(t, rid2, grace=30)
            assert stopped.ok and time.time() - t0 < 8 and jobs.status(t, rid2)[0].state == "stopped", (
                time.time() - t0, stopped)
            wait_for(lambda: len(hook.got) == 3, 10, "the stop's notification")
            assert hook.got[2]["text"].startswith(f"specops: train {rid2} on light: stopped (`inv stop`)")
            assert hook.got[2]["closed"] is None  # (still dripping when the stop returned)
        auth = "Basic " + base64.b64encode(b"ops:PASSWORD").decode()
        assert [(g["auth"], g["path"]) for g in hook.got[:2]] == [(auth, "/hooks/SECRET?token=SECRET2")] * 2
        assert hook.got[0]["text"] == f"specops: train {rid} on light: restart 1 of 1 in 0.2s: exit 3 before any step"
        assert hook.got[1]["text"] == f"specops: train {rid} on light: succeeded after 1 restart(s)"
        assert "SECRET" not in seen + log and "PASSWORD" not in seen + log, seen + log
    finally:
        hook.close()
