"""Detached jobs on this host: start, status, stop, wait. Job state lives on the host.

Launch (what specops sends, from the host workdir):
    <venv>/bin/python3 remote/job.py start --run-id R --kind train [--lock train] \
        [--env-file F] -- CMD ARGS...
    <venv>/bin/python3 remote/job.py status [--run-id R]
    <venv>/bin/python3 remote/job.py stop --run-id R [--grace 60]

`start` spawns a supervisor in a new session (setsid: its own process group, no controlling
terminal, stdin from /dev/null, output to runs/R/output.log) and returns at once; the job
survives the SSH connection. The supervisor runs CMD in that process group, writes
runs/R/exit_code when it ends and keeps runs/R/job.json up to date. `stop` signals the
process group (SIGTERM, grace, SIGKILL) and waits until no process of the group is left.
Other remote scripts import start_job / stop_job / job_state from here.
"""

import argparse
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from contract import JobState, check_name, emit, read_json, write_json
from errlines import first_error
from loglines import last_meaningful

RUNS = Path("runs")


def run_dir(run_id, root=None):
    """runs/<run id>: the one name rule (contract.check_name) keeps it inside runs/."""
    return Path(root or RUNS) / check_name("run id", run_id)


def update_json(path, **fields):
    """Merge fields into a JSON record under an exclusive lock: the starter, the supervisor and
    `stop` all write job.json, and none may lose what another wrote."""
    path = Path(path)
    with open(path.parent / ".specops-job.lock", "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        rec = read_json(path) or {}
        rec.update(fields)
        write_json(path, rec)
    return rec


def pid_alive(pid):
    """True if pid runs (a zombie, which kill -0 still reports, counts as gone)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def procs():
    """(pid, state, ppid, pgid) of every process, from /proc."""
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                f = (p / "stat").read_text().rsplit(")", 1)[1].split()
                yield int(p.name), f[0], int(f[1]), int(f[2])
            except (OSError, ValueError, IndexError):
                continue


#: Every process of a job carries SPECOPS_JOB=<its tag> in its environment (set by the supervisor):
#: that finds the job's processes outside its process group too. torchrun starts each rank in a
#: session of its own, and a rank whose torchrun died lives on, reparented, holding its GPU.
TAG_VAR = "SPECOPS_JOB"


def tagged(tag):
    """Live pids whose environment carries this job's tag."""
    if not tag:
        return []
    needle = b"\0" + f"{TAG_VAR}={tag}".encode() + b"\0"
    out = []
    for pid, st, _, _ in procs():
        if st == "Z":
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in b"\0" + env + (b"" if env.endswith(b"\0") else b"\0"):
            out.append(pid)
    return out


def job_pids(rec):
    """The job's live processes: its process group and every process carrying its tag."""
    pgid = rec.get("pgid")
    group = {p for p, st, _, pg in procs() if pgid and pg == pgid and st != "Z"}
    return sorted(group | set(tagged(rec.get("tag"))))


def kill_all(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def job_state(d):
    """The job record of run dir d, with 'state' brought up to date."""
    d = Path(d)
    rec = read_json(d / "job.json")
    if rec is None:
        return None
    code = (d / "exit_code").read_text().strip() if (d / "exit_code").is_file() else None
    rec["detail"] = ""
    if code is not None:
        rc = int(code)
        rec["exit_code"] = rc
        rec["ended"] = (d / "exit_code").stat().st_mtime  # (the supervisor writes it when the job ends)
        if rec.get("stopped_by_user"):
            rec["state"] = JobState.STOPPED.value
        elif rc == 0:
            rec["state"] = JobState.SUCCEEDED.value
        elif rc < 0 or rc == 137:
            rec["state"] = JobState.KILLED.value
            rec["detail"] = f"signal {-rc}" if rc < 0 else "137: SIGKILL, e.g. out of memory"
        else:
            rec["state"], rec["detail"] = JobState.FAILED.value, f"exit {rc}"
    elif pid_alive(rec.get("pid")) or pid_alive(rec.get("child_pid")) or job_pids(rec):
        rec["state"] = JobState.RUNNING.value
    else:
        rec["state"], rec["detail"] = JobState.LOST.value, "supervisor gone without an exit code"
    rec["age_s"] = round(time.time() - rec.get("started", time.time()), 1)
    log = d / "output.log"
    rec["log_bytes"] = log.stat().st_size if log.is_file() else 0
    rec["last_line"] = last_line(log, rec["log_bytes"])
    if rec["state"] in (JobState.FAILED.value, JobState.KILLED.value):
        rec["error"] = first_error(log_end(log, rec["log_bytes"]))
    return rec


def log_end(log, size, n=1 << 16):
    try:
        with open(log, "rb") as f:
            f.seek(max(size - n, 0))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def last_line(log, size):
    """What `inv status` shows: the log's last meaningful line (remote/loglines.py), <= 200 chars."""
    return last_meaningful(log_end(log, size, 16384))


def is_torchrun(pid):
    try:
        return b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def children(pid):
    return [p for p, _, ppid, _ in procs() if ppid == pid]


def gpu_memory_by_pid():
    """{pid: MiB} from nvidia-smi, or {} where there is no NVIDIA GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    res = {}
    for line in out.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            res[int(parts[0])] = res.get(int(parts[0]), 0) + int(parts[1])
    return res


def all_jobs(root=None):
    out = []
    base = Path(root or RUNS)
    if base.is_dir():
        for d in sorted(base.iterdir(), key=lambda p: p.stat().st_mtime):
            rec = job_state(d) if (d / "job.json").is_file() else None
            if rec:
                out.append(rec)
    return out


def start_job(run_id, argv, *, kind="job", lock=None, env_file=None, cwd=None, root=None, extra=None,
              term="group"):
    """Start argv detached; return its record. Refuses if `lock` is held by a running job.
    term: what `stop` sends SIGTERM to first: the whole process group, or only the command
    ("child": for torchrun and trainers that handle one SIGTERM and forward it themselves)."""
    d = run_dir(run_id, root)
    base = Path(root or RUNS)
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lf:
        fcntl.flock(lf, fcntl.LOCK_EX)
        if lock:
            for rec in all_jobs(root):
                if rec.get("lock") == lock and rec["state"] == JobState.RUNNING.value and rec["run_id"] != run_id:
                    return {"ok": False, "error": f"lock {lock!r} is held by run {rec['run_id']!r} "
                            f"(pid {rec['pid']}, running {rec['age_s']:.0f}s)", "holder": rec["run_id"]}
        prev = job_state(d) if (d / "job.json").is_file() else None
        if prev and prev["state"] == JobState.RUNNING.value:
            return {"ok": False, "error": f"run {run_id!r} is already running (pid {prev['pid']})"}
        d.mkdir(parents=True, exist_ok=True)
        (d / "exit_code").unlink(missing_ok=True)
        started = time.time()
        rec = {"run_id": run_id, "kind": kind, "lock": lock, "argv": list(argv), "term": term,
               "cwd": os.path.abspath(cwd or "."), "host": socket.gethostname(), "started": started,
               "tag": f"{run_id}.{int(started * 1000)}", "state": JobState.STARTING.value, **(extra or {})}
        write_json(d / "job.json", rec)
        log = open(d / "output.log", "ab")
        sup = [sys.executable, os.path.abspath(__file__), "supervise", "--dir", str(d.resolve())]
        if env_file:
            sup += ["--env-file", env_file]
        p = subprocess.Popen(sup, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=cwd, close_fds=True)
        log.close()
        rec.update(update_json(d / "job.json", pid=p.pid, pgid=p.pid, state=JobState.RUNNING.value))
    return {"ok": True, **rec}


def stop_job(d, grace=60.0):
    """SIGTERM the job's process group, wait up to grace, then SIGKILL every process of the job
    (its group and its tagged processes in other sessions); wait until they are gone."""
    d = Path(d)
    rec = job_state(d)
    if rec is None:
        return {"ok": False, "error": f"no job in {d}"}
    pgid = rec.get("pgid")
    if rec["state"] != JobState.RUNNING.value:
        return {"ok": True, "already": rec["state"], **rec}
    rec["stopped_by_user"] = True
    raw = update_json(d / "job.json", stopped_by_user=True)
    t0 = time.time()
    try:
        child = raw.get("child_pid")
        if raw.get("term") == "child" and child and pid_alive(child):
            # A launcher (torchrun) would SIGTERM its workers itself and kill their DataLoader
            # workers too early: signal the ranks (its children) once, let them save and exit.
            ranks = [p for p in children(child) if pid_alive(p)] if is_torchrun(child) else []
            for p in ranks or [child]:
                os.kill(p, signal.SIGTERM)
        else:
            os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    killed = False
    while left := job_pids(raw):
        if time.time() - t0 > grace and not killed:
            kill_all(left, signal.SIGKILL)  # (the group and the tagged processes)
            killed = True
        if time.time() - t0 > grace + 30:
            return {"ok": False, "error": f"processes {left} of the job (group {pgid}) still alive after SIGKILL"}
        time.sleep(0.2)
    # the supervisor writes exit_code as it ends; give it a moment if it was SIGKILLed
    if not (d / "exit_code").is_file():
        (d / "exit_code").write_text("-9\n" if killed else "-15\n")
    # jobs this job started (e.g. its vLLM server under RUN/server/) go too
    for sub in sorted(d.iterdir()):
        if (sub / "job.json").is_file() and (job_state(sub) or {}).get("state") == JobState.RUNNING.value:
            stop_job(sub, grace=min(grace, 30))
    return {"ok": True, "sigkill": killed, "seconds": round(time.time() - t0, 1), **job_state(d)}


def supervise(d, env_file=None):
    """Runs in the job's own session: start the command, record its end."""
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
    print(f"[specops] {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(rec['argv'])}", flush=True)
    try:
        child = subprocess.Popen(rec["argv"], stdin=subprocess.DEVNULL, env=env, cwd=rec.get("cwd"))
    except OSError as e:
        print(f"[specops] cannot start: {e}", flush=True)
        (d / "exit_code").write_text("127\n")
        return 127
    rec["child_pid"] = child.pid
    try:
        update_json(d / "job.json", child_pid=child.pid)
    except OSError as e:  # the supervisor's duty is the exit code: never die before recording it
        print(f"[specops] could not record the child's pid in job.json: {e}", flush=True)
    while True:
        try:
            rc = child.wait()
            break
        except InterruptedError:
            continue
    print(f"[specops] {time.strftime('%Y-%m-%d %H:%M:%S')} exit code {rc}", flush=True)
    # the jobs it started (a vLLM server under RUN/server/) end with it, even when it was killed before
    # stopping them (their supervisors carry this job's tag: end_orphans would only orphan their servers)
    for sub in sorted(d.iterdir()):
        if (sub / "job.json").is_file() and (job_state(sub) or {}).get("state") == JobState.RUNNING.value:
            stop_job(sub, grace=30)
    end_orphans(rec.get("tag"))
    end_group()
    (d / "exit_code").write_text(f"{rc}\n")
    return 0


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


def group_left(pgid):
    """A left() for reap: the live processes of process group pgid, other than this one."""
    me = os.getpid()
    return lambda: [p for p, st, _, g in procs() if g == pgid and p != me and st != "Z"]


def end_orphans(tag, grace=10.0):
    """The command has exited: end what it left running (e.g. ranks whose torchrun was killed,
    in sessions of their own)."""
    reap(lambda: [p for p in tagged(tag) if p != os.getpid()], "the command", " running", grace)


def end_group(grace=10.0):
    """The command has exited: end what is left of this supervisor's process group. vLLM's engine
    processes rename themselves (setproctitle), which overwrites the environment holding the
    job's tag: after a SIGKILLed API server only the group still finds them."""
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
    s.add_argument("argv", nargs=argparse.REMAINDER)
    st = sub.add_parser("status")
    st.add_argument("--run-id", default=None)
    sp = sub.add_parser("stop")
    sp.add_argument("--run-id", required=True)
    sp.add_argument("--grace", type=float, default=60.0)
    sv = sub.add_parser("supervise")
    sv.add_argument("--dir", required=True)
    sv.add_argument("--env-file", default=None)
    a = ap.parse_args()

    if a.cmd == "supervise":
        return supervise(a.dir, a.env_file)
    if a.cmd == "start":
        argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        if not argv:
            emit({"ok": False, "error": "no command given after --"})
            return 2
        res = start_job(a.run_id, argv, kind=a.kind, lock=a.lock, env_file=a.env_file, term=a.term)
        emit(res)
        return 0 if res["ok"] else 1
    if a.cmd == "status":
        if a.run_id is not None:
            rec = job_state(run_dir(a.run_id))
            emit({"ok": rec is not None, "jobs": [rec] if rec else [],
                  **({} if rec else {"error": f"unknown run id {a.run_id!r}"})})
        else:
            jobs = all_jobs()
            for rec in jobs:  # a run's own jobs (an online training's vLLM server, RUN/server/): under it
                d = RUNS / rec["run_id"]
                rec["subjobs"] = [s for s in (job_state(x) for x in sorted(d.iterdir()) if (x / "job.json").is_file())
                                  if s] if d.is_dir() else []
            gpu = gpu_memory_by_pid()
            if gpu:
                for rec in jobs:
                    for r in [rec, *rec["subjobs"]]:
                        if r["state"] == JobState.RUNNING.value:
                            r["gpu_mib"] = sum(gpu.get(p, 0) for p in job_pids(r))
            emit({"ok": True, "jobs": jobs})
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
    import contract

    contract.main(main)
