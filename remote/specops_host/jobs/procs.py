"""The host's processes, read from /proc (stdlib; used by jobs/): which one is whose.

A pid names a process only until it exits: pids are reused (pid_max is often 32768, and a busy
host goes round it), and so is a process group id once its last member is gone. A job's process
is therefore recognised by the job's tag in its environment (SPECOPS_JOB, set when the job starts,
inherited by what it starts), and where recorded its start time (/proc/<pid>/stat field 22, clock
ticks since boot). A process whose environment is empty, blanked or unreadable is never a job's.
SPT_NOENV rides along too: setproctitle (vLLM's engines rename themselves) then leaves
/proc/<pid>/environ, and the tag in it, as it was.
SPECOPS_JOB_DIR (the run folder) and SPECOPS_JOB_LOCK ride along, so a job whose job.json was
lost or garbled is still found, and still holds its lock.
"""

import os
import signal
import subprocess
from pathlib import Path

#: Every process of a job carries SPECOPS_JOB=<its tag> in its environment (set by job.py): that
#: finds the job's processes outside its process group too. torchrun starts each rank in a
#: session of its own, and a rank whose torchrun died lives on, reparented, holding its GPU.
TAG_VAR = "SPECOPS_JOB"
DIR_VAR = "SPECOPS_JOB_DIR"
LOCK_VAR = "SPECOPS_JOB_LOCK"
#: setproctitle's documented switch: without it a renamed process (vLLM's engines) overwrites its
#: environment's memory, and /proc/<pid>/environ (the tag with it) reads blank
NOENV = {"SPT_NOENV": "1"}


def is_pid(v):
    """A plausible pid: a positive int (a bool, a string, a float from a garbled record: no)."""
    return type(v) is int and v > 0


def stat_fields(pid):
    """/proc/<pid>/stat after the command name (fields 3 on: state, ppid, pgid, ...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid):
    """The process's start time (stat field 22, clock ticks since boot); None if it is gone or a
    zombie (a zombie, which kill -0 still reports, has ended)."""
    if not is_pid(pid):
        return None
    f = stat_fields(pid)
    if not f or f[0] in ("Z", "X"):
        return None
    try:
        return int(f[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid):
    """True if pid runs (a zombie counts as gone)."""
    return start_time(pid) is not None


def procs():
    """(pid, state, ppid, pgid, start time) of every process, from /proc."""
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            f = stat_fields(p.name)
            try:
                yield int(p.name), f[0], int(f[1]), int(f[2]), int(f[19])
            except (TypeError, ValueError, IndexError):
                continue


def environ(pid):
    """The process's environment as a dict ({} when it cannot be read: gone, another user's)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out.setdefault(k.decode(errors="replace"), v.decode(errors="replace"))
    return out


def with_env(var, value):
    """Live pids whose environment holds var=value."""
    if not value:
        return []
    return [pid for pid, st, _, _, _ in procs() if st != "Z" and environ(pid).get(var) == value]


def tagged(tag):
    """Live pids whose environment carries this job's tag."""
    return with_env(TAG_VAR, tag)


def same_process(pid, start, tag):
    """pid is still the process a job recorded: alive, carrying the job's tag, and its start time
    the recorded one (where one was). A process without the tag is never the job's, whatever start
    time a record names: one whose environment is empty (`env -i`), blanked or unreadable (another
    user's) included."""
    now = start_time(pid)
    if now is None or not tag or environ(pid).get(TAG_VAR) != tag:
        return False
    return start is None or now == start


def kill_all(pids, sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def children(pid):
    return [p for p, _, ppid, _, _ in procs() if ppid == pid]


def is_torchrun(pid):
    try:
        return b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def group_left(pgid):
    """A left() for job.reap: the live processes of process group pgid, other than this one
    (for the caller's own group, which cannot change hands while the caller lives)."""
    me = os.getpid()
    return lambda: [p for p, st, _, g, _ in procs() if g == pgid and p != me and st != "Z"]


#: prctl(2)'s option: the signal this process gets when its parent (the thread that forked it) dies
PR_SET_PDEATHSIG = 1


def tie(parent, child_of, grace=15.0):
    """The supervisor of a tied job: when `parent` (the process that started it) dies, for any
    reason, SIGKILL included, the kernel sends SIGUSR1 (Linux prctl PR_SET_PDEATHSIG, through
    ctypes); the command's group then gets SIGTERM, and the command SIGKILL after grace seconds
    (watch() returns, and end_group() ends what the group left). Returns False when the parent is
    gone already (the command is then not started)."""
    def gone(_signum, _frame):
        print(f"[specops] the process that started this job (pid {parent}) is gone: stopping the job", flush=True)
        signal.signal(signal.SIGALRM, lambda *a: child_of() and kill_all([child_of()], signal.SIGKILL))
        signal.alarm(int(grace))
        kill_all([-os.getpgid(0)], signal.SIGTERM)  # (the supervisor ignores SIGTERM: it records the end)

    signal.signal(signal.SIGUSR1, gone)
    pdeathsig(signal.SIGUSR1)  # (not Linux: the script's own `finally` is what stops the job)
    return os.getppid() == parent  # (after prctl: a parent that died before it is seen here)


def pdeathsig(sig):
    """This process gets sig when its parent (the thread that forked it) dies, SIGKILL included
    (Linux prctl PR_SET_PDEATHSIG, through ctypes); False where there is no prctl."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def ends_with(parent, sig=signal.SIGTERM):
    """A Popen preexec_fn: the child gets sig when `parent` (the starter's pid) dies, and does not
    start at all when it is gone already. What a process tracker that follows the process tree
    (Slurm's proctrack/linuxproc) or group (proctrack/pgid) loses once its parent is SIGKILLed
    (an online run's trainer and server inside a Slurm step) ends with it all the same."""
    def pre():
        pdeathsig(sig)
        if os.getppid() != parent:
            os._exit(129)
    return pre


def wait_trainer(p, grace):
    """The trainer's exit code; SIGKILL (with its ranks) after grace seconds."""
    try:
        return p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        print(f"[specops] the trainer did not exit {grace:.0f}s after SIGTERM: SIGKILL", flush=True)
        for c in children(p.pid):
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.kill()
        return p.wait()


__all__ = ["TAG_VAR", "DIR_VAR", "LOCK_VAR", "NOENV", "is_pid", "start_time", "pid_alive", "procs", "environ",
           "with_env", "tagged", "same_process", "kill_all", "children", "is_torchrun", "group_left", "tie",
           "pdeathsig", "ends_with", "wait_trainer"]
