"""Detached jobs on this host: start, status, stop, wait. Job state lives on the host.

Launch (what specops sends, from the host workdir):
    <venv>/bin/python3 -m specops_host.jobs.job start --run-id R --kind train [--lock train] \
        [--env-file F] [--supervision JSON] -- CMD ARGS...
    <venv>/bin/python3 -m specops_host.jobs.job status [--run-id R]
    <venv>/bin/python3 -m specops_host.jobs.job stop --run-id R [--grace 60]

`start` spawns a supervisor in a new session (setsid: its own process group, no controlling
terminal, stdin from /dev/null, output to runs/R/output.log) and returns at once; the job
survives the SSH connection. The supervisor runs CMD in that process group, writes
runs/R/exit_code when it ends and keeps runs/R/job.json up to date; with --supervision (a training's
contract.Supervision, kept whole in job.json) it restarts the command after an abnormal end, finds a
stall and notifies (jobs/watch.py). `stop` signals the job's processes (SIGTERM, grace, SIGKILL) and
waits until none is left.
A process is the job's only while its environment carries the job's SPECOPS_JOB tag in this run
folder (and its start time is the recorded one, where recorded: procs.py); a job none of whose
processes is left is `lost` and nothing is signalled. A job.json that cannot be trusted is a row
of its own, its processes found by their SPECOPS_JOB_DIR.
Other host scripts import start_job / stop_job from here (job_state, job_pids: records.py).
"""

import argparse
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from specops_host.contract import JobState, Supervision, check_name, emit, read_json, write_json
from specops_host.jobs import notify, watch
from specops_host.jobs.procs import (DIR_VAR, LOCK_VAR, NOENV, TAG_VAR, children, environ, group_left, is_torchrun,
                                     kill_all, pid_alive, start_time, tagged, tie)
from specops_host.jobs.records import (RUNS, all_jobs, file_size, gpu_memory_by_pid, holds, is_ours, job_pids,
                                       mark_lost, record_problem, run_dir, run_folders, safe_state, shown_state,
                                       symlinked, update_json)

#: `start --fail-on NAME`: a log line matching the pattern fails the job (the supervisor stops the
#: command at once: a training whose loss is NaN learns nothing, however long it runs)
CHECKS = {
    "nonfinite-loss": (re.compile(rb"\b((?:train|val)/loss(?:_\d+)?=-?(?:nan|inf))\b", re.I),
                       "NonFiniteLossError: {0} in the log, the run learned nothing; check the data "
                       "with inspect-data (`inv inspect-data --sample 1000` loads more files), or lower lr"),
}


START_VISIBLE = 5.0  # seconds start_job waits at most for its supervisor's tag to show in /proc
START_COMMAND = 30.0  # ... and then for the supervisor to start the command (a loaded host: imports take seconds)


def command_started(d):
    """The supervisor has started the job's command (its pid in job.json) or has already ended."""
    rec = read_json(d / "job.json")
    return (isinstance(rec, dict) and bool(rec.get("child_pid"))) or (d / "exit_code").is_file()


def start_job(run_id, argv, *, kind="job", lock=None, env_file=None, cwd=None, root=None, extra=None,
              term="group", fail_on=None, tied=False, fail_grace=None, uses=()):
    """Start argv detached; return its record. Refuses if `lock` is held by a running job.
    term: what `stop` sends SIGTERM to first: the whole process group, or only the command
    ("child": for torchrun and trainers that handle one SIGTERM and forward it themselves).
    tied: the job does not outlive the process that starts it (a synchronous script's own vLLM
    server: even when that script is SIGKILLed, its supervisor stops the job; see tie()).
    The supervisor and everything it starts carry the job's tag, run folder and lock in their
    environment; its start time is recorded: that, not the pid alone, says a process is the job's.
    uses: the other runs it reads or writes (an evaluation's training run): `clean` keeps them."""
    d = run_dir(run_id, root)
    if symlinked(d):
        return {"ok": False, "error": symlinked(d)}
    base = Path(root or RUNS)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        if lock:
            for rec in all_jobs(root):
                if holds(rec, lock, run_id):
                    why = f"; its job.json unreadable: {rec['unreadable']}" if rec.get("unreadable") else ""
                    return {"ok": False, "error": f"lock {lock!r} is held by run {rec['run_id']!r} "
                            f"(pid {rec['pid']}, running {rec['age_s']:.0f}s{why})", "holder": rec["run_id"]}
        prev = safe_state(d)
        if prev and prev["state"] == JobState.RUNNING.value:
            return {"ok": False, "error": f"run {run_id!r} is already running (pid {prev['pid']})"}
        d.mkdir(parents=True, exist_ok=True)
        (d / "exit_code").unlink(missing_ok=True)
        started = time.time()
        tag = f"{run_id}.{int(started * 1000)}.{os.urandom(4).hex()}"  # (unique across workdirs)
        rec = {"run_id": run_id, "kind": kind, "lock": lock, "argv": list(argv), "term": term,
               "cwd": os.path.abspath(cwd or "."), "host": socket.gethostname(), "started": started,
               "tag": tag, "state": JobState.STARTING.value, **({"fail_on": fail_on} if fail_on else {}),
               **({"fail_grace": fail_grace} if fail_grace else {}), **({"uses": list(uses)} if uses else {}),
               **(extra or {})}
        write_json(d / "job.json", rec)
        log_from = file_size(d / "output.log")  # (a re-run appends: its follower starts here, not at an earlier start)
        log = open(d / "output.log", "ab")
        sup = [sys.executable, "-m", "specops_host.jobs.job", "supervise", "--dir", str(d.resolve())]
        if env_file:
            sup += ["--env-file", env_file]
        if tied:
            sup += ["--tied-to", str(os.getpid())]
        env = {**os.environ, TAG_VAR: tag, DIR_VAR: str(d.resolve()), LOCK_VAR: lock or "", **NOENV}
        p = subprocess.Popen(sup, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=cwd, close_fds=True, env=env)
        log.close()
        # (exec closes the pipe Popen waits on before the new program's environment is in place;
        # until it is, /proc shows the supervisor with no tag and the job reads `lost`: a server's
        # start was once failed so, 0 s after its launch, and the server outlived its task)
        until = time.time() + START_VISIBLE
        while environ(p.pid).get(TAG_VAR) != tag and start_time(p.pid) is not None and time.time() < until:
            time.sleep(0.005)
        # ... and until it has started the command (its signal handlers set, the command's pid recorded): a stop
        # that came at once found a supervisor still importing, which SIGTERM killed before it could record the
        # end or notify (CI, 2026-12-06: a stop's notification never sent)
        until = time.time() + START_COMMAND
        while p.poll() is None and time.time() < until and not command_started(d):
            time.sleep(0.01)
        # (p is this process's unreaped child: its pid cannot have changed hands yet)
        rec.update(update_json(d / "job.json", pid=p.pid, pgid=p.pid, pid_start=start_time(p.pid),
                               state=JobState.RUNNING.value))
    return {"ok": True, **rec, "log_from": log_from}


def stop_job(d, grace=60.0):
    """SIGTERM the job (its processes: those carrying its tag, records.job_pids), wait up to grace,
    then SIGKILL every one still there; wait until they are gone. A job none of whose processes is
    still there is `lost`: nothing is signalled (its recorded pid may be another process's by now)."""
    d = Path(d)
    if symlinked(d):
        return {"ok": False, "error": symlinked(d)}
    rec = safe_state(d)
    if rec is None:
        return {"ok": False, "error": f"no job in {d}"}
    if rec["state"] != JobState.RUNNING.value:
        return {"ok": True, "already": rec["state"], "marked": mark_lost(d, rec), **rec}
    raw = rec
    if not rec.get("unreadable"):
        try:
            raw = {**update_json(d / "job.json", stopped_by_user=True), "dir": rec["dir"]}
        except (OSError, ValueError) as e:
            return {"ok": False, "error": f"cannot record the stop in {d}/job.json: {e}"}
        if record_problem(raw, d.name):  # (garbled meanwhile)
            raw = rec
    t0 = time.time()
    child = raw.get("child_pid")
    if raw.get("term") == "child" and is_ours(raw, child, raw.get("child_start")):
        term_command(child)
    else:  # (its tagged processes: never its group as such, whose id a record may name falsely)
        kill_all(job_pids(raw), signal.SIGTERM)
    kill_all(job_pids(raw), signal.SIGCONT)  # (a frozen process, e.g. a stalled trainer: its SIGTERM waits for this)
    killed = False
    while left := job_pids(raw):
        if left == [raw.get("pid")] and (d / "exit_code").is_file():
            break  # (its supervisor, done, sending its last notification: jobs/notify.py; it ends by itself)
        if time.time() - t0 > grace and not killed:
            kill_all(left, signal.SIGKILL)  # (its tagged processes, in any session)
            killed = True
        if time.time() - t0 > grace + 30:
            return {"ok": False, "error": f"processes {left} of the job (group {raw.get('pgid')}) still alive "
                                          f"after SIGKILL"}
        time.sleep(0.2)
    # the supervisor writes exit_code as it ends; give it a moment if it was SIGKILLed
    if not (d / "exit_code").is_file():
        (d / "exit_code").write_text("-9\n" if killed else "-15\n")
    stop_subjobs(d, min(grace, 30))  # jobs this job started (e.g. its vLLM server under RUN/server/) go too
    return {"ok": True, "sigkill": killed, "seconds": round(time.time() - t0, 1), **(safe_state(d) or rec)}


def term_command(child):
    """SIGTERM the command. A launcher (torchrun) would SIGTERM its workers itself and kill their
    DataLoader workers too early: signal the ranks (its children) once, let them save and exit."""
    ranks = [p for p in children(child) if pid_alive(p)] if is_torchrun(child) else []
    kill_all(ranks or [child], signal.SIGTERM)


FAIL_GRACE_S = 60.0  # after a fail-on match's SIGTERM, the seconds before the next signal


class FailStop:
    """Ends a command whose log matched its fail-on check: SIGTERM (term_command) at the first
    call; still running `grace` seconds later, SIGTERM again (speculators saves a checkpoint on the
    first and exits at once on the second); `grace` seconds after that, SIGKILL. Call it at every
    poll once the match is found. (speculators raises its interruption from the signal handler: one
    that lands inside a log line's printing is swallowed by logging's handleError; a NaN run in the
    suite trained all its 200 epochs, 7.6 minutes, after its SIGTERM: failures row 150.)"""

    def __init__(self, pid, grace=FAIL_GRACE_S):
        self.pid, self.grace, self.sent, self.at = pid, grace, 0, 0.0

    def __call__(self, now=None):
        now = time.monotonic() if now is None else now
        if self.sent >= 3 or (self.sent and now - self.at < self.grace):
            return
        if self.sent == 1:
            print(f"[specops] the command still runs {self.grace:g}s after its SIGTERM: SIGTERM again (a trainer's "
                  "sign to exit at once)", flush=True)
        if self.sent < 2:
            term_command(self.pid)
        else:
            print(f"[specops] the command still runs {self.grace:g}s after a second SIGTERM: SIGKILL", flush=True)
            kill_all([*children(self.pid), self.pid], signal.SIGKILL)
        self.sent, self.at = self.sent + 1, now


def scan(log, pos, pattern, overlap=256):
    """(the first match of pattern in log from byte pos, the position to scan from next)."""
    try:
        with open(log, "rb") as f:
            f.seek(pos)
            data = f.read()
    except OSError:
        return None, pos
    m = pattern.search(data)
    return (m.group(1).decode(errors="replace") if m else None), max(pos, pos + len(data) - overlap)


def stop_subjobs(d, grace):
    for sub in run_folders(d):
        if (sub / "job.json").is_file() and (safe_state(sub) or {}).get("state") == JobState.RUNNING.value:
            stop_job(sub, grace=grace)


def supervise(d, env_file=None, tied_to=None):
    """Runs in the job's own session: start the command, record its end. tied_to: the pid of the
    process that started the job; the job ends when it does (tie())."""
    d = Path(d)
    rec = read_json(d / "job.json")
    env = dict(os.environ)
    if rec.get("tag"):
        env[TAG_VAR] = rec["tag"]
    if env_file:  # secrets travel in a 0600 file, never on a command line
        for line in Path(env_file).read_text().splitlines():
            k, sep, v = line.partition("=")
            if sep:
                env[k] = v
        Path(env_file).unlink(missing_ok=True)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # SIGTERM reaches the whole group; the supervisor outlives the child to record its code.
    signal.signal(signal.SIGTERM, lambda *a: None)
    signal.signal(signal.SIGINT, lambda *a: None)
    started = {}
    if tied_to and not tie(tied_to, lambda: started.get("pid")):
        print(f"[specops] the process that started this job (pid {tied_to}) is gone: not started", flush=True)
        (d / "exit_code").write_text("129\n")
        return 0
    check = CHECKS.get(rec.get("fail_on"))
    grace = float(rec.get("fail_grace") or FAIL_GRACE_S)
    policy = Supervision.of(rec.get("supervision"))  # (a training's, read once: jobs/watch.py looks after it)

    def start(n):
        """Attempt n (0: the first): the command started, its pid recorded; (Popen, log position) or None."""
        if n:
            env[watch.RESTART_VAR] = str(n)
        print(f"[specops] {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(rec['argv'])}", flush=True)
        pos = file_size(d / "output.log")  # (where this start's output begins)
        try:  # (a tied job whose starter died meanwhile: its SIGKILL comes with tie()'s alarm)
            child = subprocess.Popen(rec["argv"], stdin=subprocess.DEVNULL, env=env, cwd=rec.get("cwd"))
        except OSError as e:
            print(f"[specops] cannot start: {e}", flush=True)
            (d / "exit_code").write_text("127\n")
            return None
        rec["child_pid"] = started["pid"] = child.pid
        try:  # (child is this process's unreaped child: its start time is surely its own)
            update_json(d / "job.json", child_pid=child.pid, child_start=start_time(child.pid))
        except (OSError, ValueError) as e:  # the supervisor's duty is the exit code: never die before recording it
            print(f"[specops] could not record the child's pid in job.json: {e}", flush=True)
        return child, pos

    def cleanup():
        stop_subjobs(d, 30)
        with notify.SPAWNING:  # (a notification's delivery process, forked but not yet exec'd, is not the command's)
            end_orphans(rec.get("tag"))
            end_group()

    if policy is None:
        first = start(0)
        if first is None:
            return 127
        rc, found = watch_command(d, first[0], check, first[1], every=min(5.0, grace), grace=grace)
    else:
        rc, found = watch.Supervisor(d, rec, policy, start, cleanup, notifier=notify.Notifier.of(env), check=check,
                                     scan=scan,
                                     term=lambda pid: FailStop(pid, grace)).run()
        if rc == 127 and (d / "exit_code").is_file():
            return 127
    print(f"[specops] {time.strftime('%Y-%m-%d %H:%M:%S')} exit code {rc}", flush=True)
    if found:  # (the last error line of the log: what `inv status` and the laptop show)
        print(check[1].format(found), flush=True)
        rc = 1
        try:
            update_json(d / "job.json", failed_why=f"non-finite loss ({found})")
        except (OSError, ValueError):
            pass
    # the jobs it started (a vLLM server under RUN/server/) end with it, even when it was killed before
    # stopping them (each carries its own tag: end_orphans does not see them)
    cleanup()
    (d / "exit_code").write_text(f"{rc}\n")
    return 0


def watch_command(d, child, check, pos, every=5.0, grace=FAIL_GRACE_S):
    """Wait for the command; with a check, scan its log (from byte pos: this start's) as it grows:
    the first match stops the command (FailStop: SIGTERM, again after grace, then SIGKILL). Returns
    (exit code, the match or None)."""
    log, found = d / "output.log", None
    while True:
        try:
            rc = child.wait(timeout=every if check else None)
            break
        except subprocess.TimeoutExpired:
            pass
        except InterruptedError:
            continue
        if found is None:
            found, pos = scan(log, pos, check[0])
            if found:
                print(f"[specops] {found} in the log: stopping the command (it learns nothing)", flush=True)
                end = FailStop(child.pid, grace)
        if found:
            end()
    if check and found is None:
        found, _ = scan(log, pos, check[0])
    return rc, found


def reap(left, what, where="", grace=10.0):
    """End the processes left() finds (this process never among them): one line ("WHAT left N
    process(es)WHERE (pids ...)"), SIGTERM, SIGKILL to those still there after grace seconds.
    Returns the pids found first."""
    found = left()
    if not found:
        return []
    print(f"[specops] {what} left {len(found)} process(es){where} (pids {' '.join(map(str, found))}): ending them",
          flush=True)
    kill_all(found, signal.SIGTERM)
    t0 = time.time()
    while left() and time.time() - t0 < grace:
        time.sleep(0.2)
    kill_all(left(), signal.SIGKILL)
    return found


def end_orphans(tag, grace=10.0):
    """The command has exited: end what it left running (e.g. ranks whose torchrun was killed,
    in sessions of their own): its tag, in this run folder (never a job of another workdir)."""
    me, where = os.getpid(), os.environ.get(DIR_VAR)
    reap(lambda: [p for p in tagged(tag) if p != me and environ(p).get(DIR_VAR, where) == where],
         "the command", " running", grace)


def end_group(grace=10.0):
    """The command has exited: end what is left of this supervisor's own process group (one that
    cleared its environment, e.g. a renamed process that ignores SPT_NOENV, carries no tag)."""
    reap(group_left(os.getpgid(0)), "the command", " in its group", grace)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--run-id", required=True)
    s.add_argument("--kind", default="job")
    s.add_argument("--lock", default=None)
    s.add_argument("--env-file", default=None)
    s.add_argument("--term", choices=["group", "child"], default="group")
    s.add_argument("--fail-on", choices=sorted(CHECKS), default=None)
    s.add_argument("--fail-grace", type=float, default=None,
                   help=f"after a --fail-on match's SIGTERM: seconds to a second SIGTERM, then to SIGKILL "
                        f"(default {FAIL_GRACE_S:g})")
    s.add_argument("--supervision", type=Supervision.of_json, default=None,
                   help="a training's contract.Supervision as JSON (its record()): the supervisor looks after the "
                        "command (jobs/watch.py)")
    s.add_argument("--uses", action="append", default=[], type=lambda v: check_name("run id", v),
                   help="another run this job reads or writes (repeatable): `clean` keeps it while the job runs")
    s.add_argument("argv", nargs=argparse.REMAINDER)
    st = sub.add_parser("status")
    st.add_argument("--run-id", default=None)
    sp = sub.add_parser("stop")
    sp.add_argument("--run-id", required=True)
    sp.add_argument("--grace", type=float, default=60.0)
    sv = sub.add_parser("supervise")
    sv.add_argument("--dir", required=True)
    sv.add_argument("--env-file", default=None)
    sv.add_argument("--tied-to", type=int, default=None, help="the pid whose death ends the job")
    a = ap.parse_args()

    if a.cmd == "supervise":
        return supervise(a.dir, a.env_file, a.tied_to)
    if a.cmd == "start":
        argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        if not argv:
            emit({"ok": False, "error": "no command given after --"})
            return 2
        res = start_job(a.run_id, argv, kind=a.kind, lock=a.lock, env_file=a.env_file, term=a.term,
                        fail_on=a.fail_on, fail_grace=a.fail_grace, uses=a.uses,
                        extra={"supervision": a.supervision.record()} if a.supervision else None)
        emit(res)
        return 0 if res["ok"] else 1
    if a.cmd == "status":
        if a.run_id is not None:
            rec = safe_state(run_dir(a.run_id))
            rec = rec and shown_state(rec)
            emit({"ok": rec is not None, "jobs": [rec] if rec else [],
                  **({} if rec else {"error": f"unknown run id {a.run_id!r}"})})
        else:
            jobs = all_jobs()
            for rec in jobs:  # a run's own jobs (an online training's vLLM server, RUN/server/): under it
                d = RUNS / rec["run_id"]
                rec["subjobs"] = [s for s in (safe_state(x) for x in run_folders(d) if (x / "job.json").is_file()) if s]
            gpu = gpu_memory_by_pid()
            if gpu:
                for rec in jobs:
                    for r in [rec, *rec["subjobs"]]:
                        if r["state"] == JobState.RUNNING.value:
                            r["gpu_mib"] = sum(gpu.get(p, 0) for p in job_pids(r))
            emit({"ok": True, "jobs": [shown_state(r) for r in jobs]})
        return 0
    if a.cmd == "stop":
        d = run_dir(a.run_id)
        if not (d / "job.json").is_file():
            emit({"ok": False, "error": f"unknown run id {a.run_id!r}"})
            return 1
        res = stop_job(d, a.grace)
        emit(res)
        return 0 if res["ok"] else 1


if __name__ == "__main__":
    from specops_host import contract

    contract.main(main)
