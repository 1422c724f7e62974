"""A job's record on this host: runs/R/job.json read and brought up to date (which processes are
the job's, its state, its log's last line), and every run listed. job.py starts, stops and
supervises jobs; this module reads their records (and merges fields into one, under a lock)."""

import fcntl
import json
import subprocess
import time
from pathlib import Path

from specops_host.contract import JobState, check_name, read_json, unframed, write_json
from specops_host.jobs.errlines import first_error
from specops_host.jobs.loglines import last_meaningful
from specops_host.jobs.procs import DIR_VAR, LOCK_VAR, TAG_VAR, environ, is_pid, procs, same_process, with_env


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
        rec = read_json(path)
        rec = rec if isinstance(rec, dict) else {}  # (a garbled record: what is written now is kept)
        rec.update(fields)
        write_json(path, rec)
    return rec


#: job.json's fields and the types they must have: a record of other types is a row of its own
#: ("? job.json unreadable: ..."), and nothing is signalled on its word
FIELDS = {"run_id": str, "kind": str, "lock": str, "tag": str, "term": str, "argv": list, "cwd": str,
          "pid": int, "pgid": int, "child_pid": int, "pid_start": int, "child_start": int,
          "started": (int, float), "stopped_by_user": bool, "fail_on": str, "fail_grace": (int, float),
          "failed_why": str,
          "supervision": dict, "restart": dict, "stall": dict, "backoff_until": (int, float), "gave_up": str,
          "uses": list}

def record_problem(rec, name):
    """Why a job record cannot be trusted (one phrase), or None."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not a record"
    for k, types in FIELDS.items():
        v = rec.get(k)
        if v is not None and (not isinstance(v, types) or (isinstance(v, bool) and types is not bool)):
            return f"{k} is {json.dumps(v)[:40]}, not {'a number' if types in (int, (int, float)) else types.__name__}"
    for k in ("pid", "pgid", "child_pid"):
        if rec.get(k) is not None and not is_pid(rec[k]):
            return f"{k} is {rec[k]}, not a pid"
    if rec.get("run_id") != name:
        return (f"its run_id {json.dumps(rec.get('run_id'))[:40]} is not this folder's ({name!r}): copied from "
                f"another run?")
    return None


def read_record(d):
    """(job.json as a trusted dict, None), or (None, why not: one phrase)."""
    try:
        text = (d / "job.json").read_text()
    except OSError as e:
        return None, e.strerror or str(e)
    try:
        rec = json.loads(text)
    except ValueError as e:
        return None, f"not JSON ({e})"
    problem = record_problem(rec, d.name)
    return (None, problem) if problem else (rec, None)


def folder(d):
    """The run folder's path as its processes' SPECOPS_JOB_DIR names it: runs/ resolved, the run
    folder itself not (a run id that is a symlink to another run is not that run)."""
    d = Path(d)
    return str(d.parent.resolve() / d.name)


def symlinked(d):
    """Why run folder d cannot be acted on under its own name (it is a symlink: one line naming
    the target), or None."""
    d = Path(d)
    if not d.is_symlink():
        return None
    target = d.resolve()
    hint = (f"; use --run-id {target.name}" if target.parent == d.parent.resolve() and (target / "job.json").is_file()
            else "")
    return f"run id {d.name!r} is a symlink to {target}, not a run of its own{hint}"


def unreadable(d, why):
    """The record of a run folder whose job.json cannot be trusted: found by its processes'
    SPECOPS_JOB_DIR alone (they keep the lock they were started with)."""
    where = folder(d)
    pids = with_env(DIR_VAR, where)
    lock = next((v for v in (environ(p).get(LOCK_VAR) for p in pids) if v), None)
    try:
        started = (d / "job.json").stat().st_mtime
    except OSError:
        started = time.time()
    return {"run_id": d.name, "kind": "?", "unreadable": why, "dir": where, "lock": lock,
            "pid": pids[0] if pids else None, "started": started}


def is_ours(rec, pid, start):
    """pid is still the job's recorded process (the job's tag, its start time where recorded) and
    carries this run folder's tag (SPECOPS_JOB_DIR): a process without both is never the job's,
    whatever a record names (a forged or copied record, a reused pid, an emptied environment)."""
    return (bool(rec.get("dir")) and same_process(pid, start, rec.get("tag"))
            and environ(pid).get(DIR_VAR) == rec.get("dir"))


def job_pids(rec):
    """The job's live processes: those whose environment carries its tag in its run folder
    (SPECOPS_JOB and SPECOPS_JOB_DIR; a record that cannot be trusted: the run folder's alone).
    Nothing else, whatever the record names: not a member of its process group without the tag
    (a leaderless group's `env -i` process, a stranger's that took the group id), not a process
    whose environment cannot be read (another user's). (vLLM's engines, which rename themselves,
    keep the tag readable: the job starts everything with SPT_NOENV, procs.NOENV.)"""
    where = rec.get("dir")
    if rec.get("unreadable"):
        return sorted(with_env(DIR_VAR, where))
    tag = rec.get("tag")
    if not (tag and where):
        return []
    return sorted(pid for pid, st, _, _, _ in procs()
                  if st != "Z" and (env := environ(pid)).get(TAG_VAR) == tag and env.get(DIR_VAR) == where)


def job_state(d):
    """The job record of run dir d, with 'state' brought up to date; None where there is no job.json.
    A record that cannot be trusted is a row of its own (kind '?', "job.json unreadable: ...")."""
    d = Path(d)
    if not (d / "job.json").exists() and not d.is_symlink():
        return None
    rec, why = (None, symlinked(d)) if d.is_symlink() else read_record(d)
    rec = unreadable(d, why) if rec is None else {**rec, "dir": folder(d)}
    if d.is_symlink():  # (what every task that acts on a run says of it: stop, fetch, logs, evaluate)
        rec["symlink"] = why
    for k in ("exit_code", "error", "gpu_mib", "subjobs", "age_s", "log_bytes", "last_line", "ended_at"):
        rec.pop(k, None)  # (what is worked out here, never taken from the file)
    try:  # (a symlinked run id reads nothing of its target's: no run of its own, it is lost)
        code = (d / "exit_code").read_text().strip() if (d / "exit_code").is_file() and not d.is_symlink() else None
    except OSError:
        code = None
    rc = int(code) if code is not None and code.lstrip("-").isdigit() else None
    notes = [f"? job.json unreadable: {why}"] if why else []
    if code is not None and rc is None:
        notes.append(f"? exit_code unreadable: {code[:40]!r}")
    rec["detail"] = ""
    if rc is not None:
        rec["exit_code"] = rc
        rec["ended_at"] = (d / "exit_code").stat().st_mtime  # (the supervisor writes it when the job ends)
        if rec.get("stopped_by_user"):
            rec["state"] = JobState.STOPPED.value
        elif rc == 0:
            rec["state"] = JobState.SUCCEEDED.value
        elif rc < 0 or rc == 137:
            rec["state"] = JobState.KILLED.value
            rec["detail"] = f"signal {-rc}" if rc < 0 else "137: SIGKILL, e.g. out of memory"
        else:
            rec["state"], rec["detail"] = JobState.FAILED.value, f"exit {rc}" + (
                f": {rec['failed_why']}" if rec.get("failed_why") else "")
    elif job_pids(rec):
        rec["state"] = JobState.RUNNING.value
    else:
        rec["state"] = JobState.LOST.value
        notes = notes or ["supervisor gone without an exit code"]
    notes += looked_after(rec)
    rec["detail"] = "; ".join([rec["detail"]] * bool(rec["detail"]) + notes)
    started = rec.get("started")
    rec["age_s"] = round(time.time() - (started if isinstance(started, (int, float)) else time.time()), 1)
    log = d / "output.log"
    try:
        rec["log_bytes"] = log.stat().st_size if log.is_file() else 0
    except OSError:
        rec["log_bytes"] = 0
    rec["last_line"] = last_line(log, rec["log_bytes"])
    if rec["state"] in (JobState.FAILED.value, JobState.KILLED.value):
        rec["error"] = first_error(log_end(log, rec["log_bytes"]))
    return rec


def looked_after(rec, now=None):
    """What the supervisor's own care adds to `inv status` (jobs/watch.py): 'restart 1 of 3: exit 137
    (SIGKILL) at step 1,210', the back-off left, a stall, why the restarts stopped."""
    now = time.time() if now is None else now
    out = []
    r = rec.get("restart")
    if isinstance(r, dict) and r.get("n"):
        step = r.get("step")
        wait = rec.get("backoff_until")
        left = f" in {wait - now:.0f}s" if rec["state"] == JobState.RUNNING.value and isinstance(
            wait, (int, float)) and wait > now else ""
        out.append(f"restart {r['n']} of {r.get('of', '?')}{left}: {r.get('cause', '?')} "
                   + (f"at step {step:,}" if isinstance(step, int) else "before any step"))
    s = rec.get("stall")
    if rec["state"] == JobState.RUNNING.value and isinstance(s, dict):
        step = s.get("step")
        since = s.get("since")
        quiet = now - since if isinstance(since, (int, float)) else s.get("seconds", 0)
        out.append(f"no training step for {quiet:.0f}s" + (f" (step {step:,})" if isinstance(step, int) else "")
                   + "; stacks in stacks/")
    if rec.get("gave_up") and rec["state"] != JobState.RUNNING.value:
        out.append(f"restarts stopped: {rec['gave_up']}")
    return out


def shown_state(rec):
    """The state `inv status` shows: a running job whose supervisor found it stalled is `stalled`
    (everything else on the host, locks and stop, keeps reading it as running)."""
    if rec.get("state") == JobState.RUNNING.value and isinstance(rec.get("stall"), dict):
        return {**rec, "state": JobState.STALLED.value}
    return rec


def mark_lost(d, rec):
    """`stop` of a lost run (no process carrying its tag is left; nothing was signalled): mark it
    ended, so that `clean` may remove it: the user stopped it (a record that cannot be trusted gets
    an exit code alone). Not a run whose start is not yet recorded. Returns whether it was marked."""
    if rec.get("state") != JobState.LOST.value or (rec.get("pid") is None and not rec.get("unreadable")):
        return False
    d = Path(d)
    if (d / "exit_code").exists() or job_pids(rec):
        return False
    if not rec.get("unreadable"):
        update_json(d / "job.json", stopped_by_user=True)
    (d / "exit_code").write_text("-15\n")
    return True


def log_end(log, size, n=1 << 16):
    try:
        with open(log, "rb") as f:
            f.seek(max(size - n, 0))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def last_line(log, size):
    """What `inv status` shows: the log's last meaningful line (loglines.py), <= 200 chars; a payload frame a
    script printed into its log is not one (contract.unframed)."""
    return last_meaningful(unframed(log_end(log, size, 16384)))


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


def mtime(p):
    try:
        return p.stat().st_mtime
    except OSError:  # (a folder removed while we list)
        return None


def file_size(p):
    try:
        return p.stat().st_size
    except OSError:
        return 0


def run_folders(base):
    """The run folders under base, oldest first; one removed meanwhile is left out."""
    try:
        found = [(m, p) for p in Path(base).iterdir() if (m := mtime(p)) is not None]
    except OSError:
        return []
    return [p for _, p in sorted(found)]


def safe_state(d):
    """job_state(d), never an exception: a folder that breaks it is a row saying why; one that
    vanished meanwhile is None."""
    try:
        return job_state(d)
    except Exception as e:  # noqa: BLE001  (one bad folder never hides the others)
        if not d.exists():
            return None
        return {**unreadable(d, f"{type(e).__name__}: {e}"), "state": JobState.LOST.value,
                "detail": f"? unreadable: {type(e).__name__}: {e}", "age_s": 0.0, "log_bytes": 0, "last_line": ""}


def all_jobs(root=None):
    return [rec for d in run_folders(root or RUNS) if (rec := safe_state(d))]


def holds(rec, lock, run_id):
    """rec is a running job, other than run_id, that holds lock (a job whose record is unreadable
    and whose processes carry no lock holds every lock: nothing is started beside an unknown job)."""
    return (rec["state"] == JobState.RUNNING.value and rec["run_id"] != run_id
            and (rec.get("lock") == lock or (rec.get("unreadable") and not rec.get("lock"))))
