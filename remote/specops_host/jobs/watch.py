"""A job that looks after itself: the supervisor's loop for a training (jobs/job.py supervise runs it).

The policy is the job's contract.Supervision (restarts, back-off, stall, first step, notify): built
once on the laptop (`inv train`, specops/ops/watch.py), kept whole in job.json's `supervision`, read
once by jobs/job.py supervise (Supervision.of), which hands it to the loop; the notification target
comes from the job's 0600 env file (SPECOPS_NOTIFY: jobs/notify.py's Notifier, which the loop never
waits on). The loop:
- runs the command (the trainer); while it runs, reads its log: the fail-on check (job.py CHECKS),
  and progress: a training step logged (`train/loss=`, `global_step=N`) or a progress bar redrawn;
- **stall**: no progress for `stall_after` seconds (default: 20x the run's median step time, at
  least 300 s, once three steps have been timed), counted from the attempt's first step -> job.json `stall` (`inv
  status` shows `stalled`), a line in the log, the Python stacks of the job's processes in RUN/stacks/ (py-spy where
  installed, else faulthandler through SIGUSR2 (train/hooked.py registers it), else the kernel's
  view from /proc), a notification; with `restart_on_stall` the trainer is killed and restarted;
- **restart**: an abnormal end (a non-zero exit, a signal) restarts the command on the same run
  after a back-off (`backoff` seconds, doubling, at most 600), so speculators resumes from the last
  complete checkpoint (train/run.py sets incomplete ones aside) -- never after `inv stop` (its
  stopped_by_user mark, read during the back-off too), never more than `restarts` times, never
  when the same failure comes again at the same step (then it stops and says so). Each restart
  (time, cause, step) is appended to run.json's `restarts` and kept in job.json's `restart`;
- notifies end, failure, restart and stall.
"""

import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specops_host.contract import read_json
from specops_host.jobs.procs import kill_all
from specops_host.jobs.records import job_pids, update_json

#: the default stall limit: this many median step times, at least STALL_FLOOR_S, once STEPS_TIMED are timed
#: (before the first step: the Supervision's first_step_limit())
STALL_TIMES = 20
STALL_FLOOR_S = 300.0
STEPS_TIMED = 3
#: a training step in the log (speculators' metric record), its step number, and other signs of life
STEP = re.compile(rb"train/loss=")
GLOBAL_STEP = re.compile(rb"global_step=(\d+)")
BEAT = re.compile(rb"\r|Training epoch|Validation epoch|Saving checkpoint|Checkpoint saved")
POLL_S = 1.0
#: the restarted command's environment says which restart it is (train/run.py records it in run.json)
RESTART_VAR = "SPECOPS_RESTART"


def say(text):
    print(f"[specops] {time.strftime('%Y-%m-%d %H:%M:%S')} {text}", flush=True)


def cause_of(rc):
    """An abnormal end in words: 'exit 1', 'exit 137 (SIGKILL)', 'signal 9 (SIGKILL)'."""
    def name(n):
        try:
            return signal.Signals(n).name
        except ValueError:
            return None
    if rc < 0:
        return f"signal {-rc}" + (f" ({name(-rc)})" if name(-rc) else "")
    if rc > 128 and name(rc - 128):
        return f"exit {rc} ({name(rc - 128)})"
    return f"exit {rc}"


def at_step(step):
    return f"at step {step:,}" if step is not None else "before any step"


def decide(policy, done, key, last_key):
    """(restart?, why not). done: restarts so far; key: this failure (cause kind, step); last_key: the
    previous one's."""
    if policy.restarts <= 0:
        return False, "restarts are off (--restarts 0)"
    if done >= policy.restarts:
        return False, f"no restart left ({done} of {policy.restarts} used)"
    if last_key is not None and key == last_key:
        return False, f"the same failure twice ({key[0]} {at_step(key[1])})"
    return True, ""


class Progress:
    """A log read as it grows (from byte pos): steps, their times, the last sign of life."""

    def __init__(self, log, pos, now=None):
        self.log, self.pos = Path(log), pos
        self.steps, self.last_step, self.times = 0, None, []
        self.started = self.last_beat = now if now is not None else time.monotonic()
        self.last_step_at = None

    def read(self, now=None):
        """Read what the log gained; returns the number of new steps."""
        now = time.monotonic() if now is None else now
        try:
            with open(self.log, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return 0
        # (a match may straddle two reads: only whole lines are taken, the rest waits)
        cut = data.rfind(b"\n") + 1
        data = data[:cut]
        self.pos += cut
        return self.take(data, now)

    def take(self, data, now):
        n = len(STEP.findall(data))
        nums = GLOBAL_STEP.findall(data)
        if nums:
            self.last_step = int(nums[-1])
        if n:
            if self.last_step_at is not None:
                self.times += [(now - self.last_step_at) / n] * min(n, 50)
                self.times = self.times[-500:]
            self.last_step_at = now
            self.steps += n
        if n or BEAT.search(data):
            self.last_beat = now
        return n

    def median_step(self):
        return statistics.median(self.times) if len(self.times) >= STEPS_TIMED else None

    def limit(self, policy):
        """Seconds without progress that make a stall (None: not yet known). Before the attempt's
        first step the policy's first_step_after (a trainer's start, the verifier's config, the data,
        a compile, logs no steps and may be long; a start that hangs is found all the same)."""
        if not self.steps:
            return policy.first_step_limit()
        if policy.stall_after:
            return float(policy.stall_after)
        m = self.median_step()
        return None if m is None else max(STALL_FLOOR_S, STALL_TIMES * m)

    def quiet_for(self, now):
        return now - self.last_beat


def answers_sigusr2(d, pid):
    """pid registered faulthandler on SIGUSR2 (train/hooked.py opens stacks/faulthandler-PID.txt as it
    does): only such a process is sent SIGUSR2 (it would end any other, e.g. torchrun)."""
    return (Path(d) / "stacks" / f"faulthandler-{pid}.txt").exists()


def kernel_view(pid):
    """What the kernel says of pid: its state, where it waits (wchan), its kernel stack (where readable)."""
    out = []
    for name in ("status", "wchan", "stack"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text(errors="replace")
        except OSError as e:
            text = f"(unreadable: {e.strerror or e})"
        if name == "status":
            text = "".join(ln + "\n" for ln in text.splitlines() if ln.split(":")[0] in ("Name", "State", "Threads"))
        out.append(f"--- /proc/{pid}/{name}\n{text.rstrip()}\n")
    return "".join(out)


def dump_stacks(d, pids, wait_s=3.0):
    """Each process's stacks into RUN/stacks/: py-spy where installed, else faulthandler (SIGUSR2 to
    a process running train/hooked.py), else /proc. Returns [(pid, how)]."""
    out = Path(d) / "stacks"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    spy = shutil.which("py-spy") or next((str(p) for p in [Path(sys.executable).parent / "py-spy"] if p.exists()), None)
    done = []
    for pid in pids:
        f = out / f"{stamp}-{pid}.txt"
        if spy:
            try:
                p = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
                if p.returncode == 0 and p.stdout.strip():
                    f.write_text(p.stdout)
                    done.append((pid, "py-spy"))
                    continue
            except (OSError, subprocess.TimeoutExpired):
                pass
        how = "/proc"
        if answers_sigusr2(d, pid):
            fh = out / f"faulthandler-{pid}.txt"
            before = fh.stat().st_size if fh.exists() else 0
            try:
                os.kill(pid, signal.SIGUSR2)
            except OSError:
                pass
            t0 = time.monotonic()
            while time.monotonic() - t0 < wait_s and (fh.stat().st_size if fh.exists() else 0) <= before:
                time.sleep(0.1)
            if (fh.stat().st_size if fh.exists() else 0) > before:
                time.sleep(0.3)  # (the dump's last threads)
                how = "faulthandler"
        stacks = f"stacks/faulthandler-{pid}.txt"
        note = "" if how == "faulthandler" else (
            "(no Python stacks: py-spy is not installed" + (" and the process did not answer SIGUSR2 (stopped?); its "
                                                            f"faulthandler writes {stacks} if it goes on)"
                                                            if answers_sigusr2(d, pid) else ")") + "\n")
        f.write_text(note + kernel_view(pid)
                     + (f"--- Python stacks (faulthandler): {stacks}\n" if how == "faulthandler" else ""))
        done.append((pid, how))
    return done


class Supervisor:
    """The loop (see the module's doc). start(n) starts attempt n (0: the first) and returns
    (Popen, log position) or None; cleanup() ends what an attempt left; check: job.py's fail-on check,
    scan(log, pos, pattern) its reader and term(pid) what stops the command once the check matched
    (job.FailStop: a callable, called at every poll from then on)."""

    def __init__(self, d, rec, policy, start, cleanup, notifier=None, check=None, scan=None, term=None):
        self.d, self.rec, self.policy, self.notifier = Path(d), rec, policy, notifier
        self.start, self.cleanup, self.check, self.scan, self.term = start, cleanup, check, scan, term
        self.run_id = rec.get("run_id", self.d.name)

    # -- records and notifications --------------------------------------------------------------
    def note(self, **fields):
        try:
            update_json(self.d / "job.json", **fields)
        except (OSError, ValueError) as e:
            say(f"could not record {sorted(fields)} in job.json: {e}")

    def tell(self, event, text):
        if self.notifier:  # (a notify.Notifier: queued, delivered off this loop, each within its deadline)
            self.notifier.post(event, f"{self.rec.get('kind', 'job')} {self.run_id}", text, self.run_id, say)

    def stopped(self):
        rec = read_json(self.d / "job.json")
        return isinstance(rec, dict) and rec.get("stopped_by_user") is True

    def record_restart(self, entry):
        run = self.d / "run.json"
        try:
            have = read_json(run) if run.is_file() else {}
            have = have if isinstance(have, dict) else {}
            update_json(run, restarts=[*(have.get("restarts") or []), entry])
        except (OSError, ValueError) as e:
            say(f"could not record the restart in run.json: {e}")

    # -- one attempt ----------------------------------------------------------------------------
    def wait(self, child, pos, n, last_key):
        """Wait for the attempt's end. Returns (exit code, fail-on match or None, stall cause or None,
        the attempt's Progress)."""
        prog, found, scan_pos, stalled, stall_at = Progress(self.d / "output.log", pos), None, pos, None, None
        while True:
            try:
                return_code = child.wait(timeout=POLL_S)
                prog.read()
                return return_code, found, stalled, prog
            except subprocess.TimeoutExpired:
                pass
            except InterruptedError:
                continue
            now = time.monotonic()
            if self.check and found is None:
                found, scan_pos = self.scan(self.d / "output.log", scan_pos, self.check[0])
                if found:
                    say(f"{found} in the log: stopping the command (it learns nothing)")
                    end = self.term(child.pid)
            if found:
                end()
            if prog.read(now) and stall_at is not None:
                say(f"training steps again (step {prog.last_step}) after {now - stall_at:.0f}s without one")
                self.note(stall=None)
                stall_at = None
            limit = prog.limit(self.policy)
            if stall_at is None and stalled is None and limit is not None and prog.quiet_for(now) > limit:
                stall_at = prog.last_beat
                stalled = self.on_stall(child, prog, limit, now, n, last_key)

    def on_stall(self, child, prog, limit, now, n, last_key):
        """A stall: say it, record it, the stacks, notify; restart it if asked and allowed. Returns the
        cause when the trainer is killed for a restart, else None."""
        quiet = prog.quiet_for(now)
        med = prog.median_step()
        pids = [p for p in job_pids({**self.rec, "dir": str(self.d.resolve())}) if p != os.getpid()]
        why = (f"no training step for {quiet:.0f}s ({at_step(prog.last_step)}; limit {limit:.0f}s"
               + (f", median step {med:.2f}s" if med is not None else "") + ")")
        say(f"stalled: {why}: writing the stacks of {len(pids)} process(es) into {self.d / 'stacks'}")
        self.note(stall={"since": time.time() - quiet, "seconds": round(quiet), "step": prog.last_step,
                         "limit": round(limit)})
        hows = dump_stacks(self.d, pids)
        say("stacks: " + (", ".join(f"{p} ({h})" for p, h in hows) or "no process of the job left"))
        self.tell("stall", f"stalled: {why}; stacks in {self.d / 'stacks'}")
        if not self.policy.restart_on_stall:
            say("not restarted (--restart-on-stall restarts a stalled trainer); `inv stop` ends it")
            return None
        ok, why_not = decide(self.policy, n, ("stalled", prog.last_step), last_key)
        if not ok:
            say(f"stalled and not restarted: {why_not}")
            return None
        say("killing the stalled trainer (SIGKILL) to restart it")
        kill_all(pids, signal.SIGCONT)
        kill_all(pids, signal.SIGKILL)
        return f"stalled (no training step for {quiet:.0f}s)"

    # -- the loop -------------------------------------------------------------------------------
    def run(self):
        """Returns (exit code, fail-on match or None)."""
        n, last_key, restart = 0, None, None
        while True:
            started = self.start(n)
            if started is None:
                return 127, None
            child, pos = started
            rc, found, stalled, prog = self.wait(child, pos, n, last_key)
            step = prog.last_step
            if self.stopped():
                self.tell("end", f"stopped (`inv stop`), exit code {rc}")
                return rc, found
            if rc == 0 and not found and not stalled:
                self.tell("end", "succeeded" + (f" after {n} restart(s)" if n else ""))
                return rc, found
            cause = stalled or (f"non-finite loss ({found})" if found else cause_of(rc))
            key = ("stalled" if stalled else cause, step)
            ok, why = decide(self.policy, n, key, last_key) if not found else (False, "a non-finite loss is not "
                                                                                    "restarted (it comes again)")
            if not ok:
                if self.policy.restarts > 0:
                    say(f"restarts stopped: {why}")
                    self.note(gave_up=why)
                self.tell("failure", f"{cause} {at_step(step)}" + (f"; {why}" if self.policy.restarts > 0 else ""))
                return (rc if rc != 0 else 1), found
            n, last_key = n + 1, key
            delay = self.policy.delay(n)
            restart = {"n": n, "of": self.policy.restarts, "cause": cause, "step": step, "exit_code": rc,
                       "at": time.time(), "backoff_s": delay}
            say(f"restart {n} of {self.policy.restarts} in {delay:g}s: {cause} {at_step(step)}")
            self.note(restart=restart, backoff_until=time.time() + delay, stall=None)
            self.record_restart({"when": restart["at"], "n": n, "cause": cause, "step": step, "exit_code": rc})
            self.tell("restart", f"restart {n} of {self.policy.restarts} in {delay:g}s: {cause} {at_step(step)}")
            self.cleanup()
            t_end = time.monotonic() + delay
            while time.monotonic() < t_end:
                if self.stopped():
                    say("stopped during the back-off (`inv stop`): not restarted")
                    self.tell("end", f"stopped (`inv stop`) during the back-off before restart {n}")
                    return rc, found
                time.sleep(min(0.5, max(t_end - time.monotonic(), 0)))
            if self.stopped():
                return rc, found
            self.note(backoff_until=None)
