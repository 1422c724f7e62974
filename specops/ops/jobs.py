"""Detached jobs on a host (remote/specops_host/jobs/job.py does the work there): start, status, stop, follow."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from typing import Callable, Optional, Sequence

from specops.args import USAGE, Refused, refusing
from specops.contract import JobState, Supervision, check_name, unframed
from specops.errors import NoRetry, SpecopsError
from specops.payloads import Job, Jobs, Started, Stopped
from specops.host.remote_exec import run_script
from specops.host.transport import Transport
from specops.slurm import cluster, script
from specops.ops.watch import checkpoint_split, skipped_note
from specops_host.jobs import notify as host_notify


def new_run_id(kind: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}"


def validate_run_id(run_id: str) -> str:
    return check_name("run id", run_id)


def run_path(t: Transport, run_id: str, *parts: str) -> str:
    """A run's folder (or a file in it) on the host. run_id: checked where the operation began
    (validate_run_id, needs_run_id), never again here."""
    return "/".join([t.workdir, "runs", run_id, *parts])


def put_env(t: Transport, run_id: str, env: dict) -> Optional[str]:
    """The job's environment as a 0600 file of KEY=VALUE lines beside its run dir (the values never
    appear in a command); its path, None when there is none."""
    if not env:
        return None
    remote_env = run_path(t, run_id) + ".env"
    t.check(f"mkdir -p {shlex.quote(os.path.dirname(remote_env))} && umask 077 && : > {shlex.quote(remote_env)}",
            "preparing the env file")
    t.put_text("".join(f"{k}={v}\n" for k, v in env.items()), remote_env, label="(env)", private=True)
    return remote_env


def start(t: Transport, run_id: str, argv: Sequence[str], *, kind: str, lock: Optional[str] = None,
          env: Optional[dict] = None, term: str = "group", fail_on: Optional[str] = None,
          nodes: Optional[int] = None, array: int = 0, before: Sequence[tuple] = (),
          supervision: Optional[Supervision] = None, uses: Sequence[str] = (), here: bool = False) -> Started:
    """Start argv detached on the host (survives the SSH session). Secrets
    go through `env`, which travels as a 0600 file, never on a command line. fail_on: a check of
    remote/specops_host/jobs/job.py's CHECKS ("nonfinite-loss": a NaN/Inf loss in the log stops and fails the job).
    A slurm host: argv is each node's command of a batch job (`nodes` of them; default: the host's
    slurm.nodes), or each task's of a job array (`array` tasks: script.BatchJob.array); `before`:
    (label, argv) steps of the batch shell before it (script.BatchJob.before).
    supervision: a training's (ops/watch.py supervision()): carried whole in job.json, the host's
    supervisor looks after the command (restarts, stalls, notifications); its notification target
    in the 0600 env file (a webhook URL is a secret); a Slurm host: Slurm's requeue. uses: the other
    runs the job reads or writes (an evaluation's training run): `clean` keeps them while it runs.
    here: on the host itself even on Slurm (a login node's job: a fetch's lease, ops/fetch.py lease())."""
    validate_run_id(run_id)
    env = {**t.host.env, **(env or {})}  # the host's own job environment (hosts.yaml `env:`)
    if supervision and supervision.notify:  # (and the host's name in hosts.yaml: what the notifications call it)
        env[host_notify.VAR], env[host_notify.HOST_VAR] = supervision.notify, t.host.name
    if t.host.is_slurm and not here:
        return submit(t, run_id, argv, kind=kind, env=env, nodes=nodes, lock=lock, array=array, before=before,
                      supervision=supervision)
    args = ["start", "--run-id", run_id, "--kind", kind, "--term", term]
    if lock:
        args += ["--lock", lock]
    if fail_on:
        args += ["--fail-on", fail_on]
    if supervision:
        args += ["--supervision", json.dumps(supervision.record())]
    for used in uses:
        args += ["--uses", validate_run_id(used)]
    remote_env = put_env(t, run_id, env)
    if remote_env:
        args += ["--env-file", remote_env]
    res = run_script(t, "jobs.job", [*args, "--", *argv], model=Started, what=f"the {kind} job {run_id}",
                     writes=[run_path(t, run_id)])
    if not res.ok:
        raise SpecopsError(f"cannot start {kind} on {t.host.name}: {res.error}")
    return res


#: the lock that guards one host's GPUs (one training at a time): Slurm gives each job its own
GPU_LOCK = "train"


def submit(t: Transport, run_id: str, argv: Sequence[str], *, kind: str, env: dict,
           nodes: Optional[int] = None, lock: Optional[str] = None, array: int = 0,
           before: Sequence[tuple] = (), supervision: Optional[Supervision] = None) -> Started:
    """A slurm host: argv as every node's command of one batch job, checked (the partition, the
    shared workdir, `sbatch --test-only`) before anything is written, then submitted. A lock
    other than the GPUs' (e.g. one writer per data dir) holds across the cluster's jobs.
    supervision: a training's, Slurm's requeue (script.BatchJob.supervision)."""
    s = t.host.slurm
    assert s is not None  # (a slurm host: inventory gives it its slurm: section)
    lock = None if lock == GPU_LOCK else lock
    for j in cluster.status(t) if lock else []:
        if getattr(j, "lock", None) == lock and not j.ended and j.run_id != run_id:
            raise SpecopsError(f"cannot start {kind} on {t.host.name}: lock {lock!r} is held by run {j.run_id!r} "
                               f"({j.detail}) (nothing was submitted)")
    job = script.BatchJob(name=f"specops-{run_id}", workdir=t.workdir, run_dir=run_path(t, run_id), command=list(argv),
                          request=script.Request.of(s, nodes=nodes), setup=tuple(s.setup),
                          env_file=run_path(t, run_id) + ".env" if env else None, array=array, before=tuple(before),
                          supervision=supervision)
    text = cluster.check_job(t, job, kind)
    put_env(t, run_id, env)
    return cluster.submit(t, job, text, run_id, kind, lock=lock)


def status(t: Transport, run_id: Optional[str] = None) -> list[Job]:
    """The host's jobs (one run's, or all); a slurm host's batch jobs from Slurm, with the login
    node's own jobs."""
    if t.host.is_slurm:
        mine = [j for j in cluster.status(t) if run_id is None or j.run_id == run_id]
        if run_id is not None and mine:
            return mine
        if run_id is None:
            return mine + _status(t, None)
    return _status(t, run_id)


def _status(t: Transport, run_id: Optional[str]) -> list[Job]:
    res = run_script(t, "jobs.job", ["status"] + (["--run-id", validate_run_id(run_id)] if run_id else []),
                     changes=False, model=Jobs)
    if not res.ok:
        raise SpecopsError(f"{res.error} on {t.host.name}: `{t.hint('status')}` lists the runs")
    return res.jobs


AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: what clean removes: runs that ended and left nothing running (a lost one may still have processes)
CLEANABLE = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED, JobState.STOPPED})


def parse_age(text: str) -> float:
    """'7d', '12h', '30m', '90s', '2w' -> seconds; anything else one line."""
    m = AGE.match(str(text).strip())
    if not m:
        raise SpecopsError(f"--older-than {text!r}: give an age such as 7d, 12h, 30m (s, m, h, d or w)")
    return float(m.group(1)) * SECONDS[m.group(2)]


def clean(t: Transport, older_than: float, *, checkpoints: bool = False) -> dict:
    """Remove the host's runs older than `older_than` seconds (their age as `status` shows it)
    that have ended: never a running, starting or lost one (nor one whose server still runs, nor
    one a running job uses: an evaluation of it); a run holding checkpoints only with
    checkpoints=True. Under --dry-run nothing is removed (each removal is a plan line). Returns
    {"removed": [run ids], "kept": [[run id, why], ...], "said": "removed" (under --dry-run "would
    remove")}."""
    from specops.host.transfer import remote_listing
    from specops_host.ckpt import POLICY

    removed, kept = [], []
    found = status(t)
    users = {used: j for j in found if not j.ended for used in j.uses}  # (a job of a live tagged process)
    for j in found:
        if j.age_s < older_than:
            continue
        if j.run_id in users:
            u = users[j.run_id]
            kept.append([j.run_id, f"in use by the {u.state.value} {u.kind} {u.run_id} (`inv stop --host "
                                   f"{t.host.name} --run-id {u.run_id}` ends it; then clean removes it)"])
            continue
        if j.state not in CLEANABLE or any(not sj.ended for sj in j.subjobs):
            why = (f"{j.detail.removeprefix('? job.json unreadable: ')} (`rm {run_path(t, j.run_id)}` removes "
                   "the link alone)" if "is a symlink to" in j.detail else
                   f"lost: no process carrying its tag is left (`inv stop --host {t.host.name} --run-id {j.run_id}` "
                   "marks it stopped; then clean removes it)" if j.state == JobState.LOST
                   else f"{j.state}: a running job is never removed")
            kept.append([j.run_id, why])
            continue
        path = run_path(t, j.run_id)
        # (only complete checkpoints keep a run whose saves carry markers: a save that did not finish is
        # nothing to keep; in a run from before them, anything under checkpoints/ does)
        listing = remote_listing(t, f"{path}/checkpoints", missing_ok=True)
        done, skipped = checkpoint_split(listing, under="")
        if (done or (listing and POLICY not in listing)) and not checkpoints:
            kept.append([j.run_id, "holds checkpoints (--checkpoints removes them too)"])
            continue
        if skipped and not done:
            skipped_note(t, j.run_id, skipped, "clean")
        r = t.change(f"rm -rf -- {shlex.quote(path)}")
        if not r.ok:
            raise SpecopsError(f"clean: removing {path} on {t.host.name} failed: {(r.stderr or r.stdout).strip()}")
        removed.append(j.run_id)
    return {"removed": removed, "kept": kept, "said": t.either("removed", "would remove")}


def get(t: Transport, run_id: Optional[str], kind: Optional[str] = None) -> Job:
    """One job: the given run id, else the newest (of `kind`)."""
    if run_id:
        return status(t, run_id)[0]
    jobs = [j for j in status(t) if kind is None or j.kind == kind]
    if not jobs:
        raise SpecopsError(f"no {kind or ''} runs on {t.host.name}: start one first".replace("  ", " "))
    return jobs[-1]


def own_run(t: Transport, j: Job, task: str) -> Job:
    """j, unless its run id is a symlink to another run: then the line `stop` gives too."""
    if j.symlink:
        raise SpecopsError(f"{task} {j.run_id} on {t.host.name}: {j.symlink}")
    return j


def needs_run_id(task: str):
    """The flags check of a task that acts on one run: --run-id given."""
    def check(run_id: Optional[str] = None, **_) -> None:
        if not run_id:
            raise Refused(f"{task} needs --run-id (`inv status` lists the runs)")
    return check


@refusing(needs_run_id("stop"))
def stop(t: Transport, run_id: str, grace: float = 60.0) -> Stopped:
    """SIGTERM, grace, SIGKILL. A slurm host's batch job: through Slurm."""
    validate_run_id(run_id)
    if t.host.is_slurm and cluster.record(t, run_id):
        return cluster.stop(t, run_id, grace)
    res = run_script(t, "jobs.job", ["stop", "--run-id", run_id, "--grace", str(grace)], model=Stopped,
                     what=f"the stop of {run_id}")
    if not res.ok:
        raise SpecopsError(f"stop {run_id} on {t.host.name}: {res.error}")
    return res


def follow(t: Transport, run_id: str, *, write: Optional[Callable[[bytes], None]] = None, offset: int = 0,
           poll: float = 0.5, until_end: bool = True, reconnect: bool = True,
           tries: int = 5, task: Optional[int] = None) -> tuple[int, Optional[int]]:
    """Hand the job's log (a Slurm array run's: task `task`'s) to `write` from byte `offset` as it
    grows, until the job ends (exit code)
    or forever if not until_end. A lost connection is re-opened in place with backoff, from the
    byte last written: no line is lost or repeated. Returns (offset, exit code or None)."""
    write = write or t.log
    where = None
    slurm_end = cluster.end_watcher(t, run_id) if t.host.is_slurm and cluster.record(t, run_id) else None
    failures = 0
    checked = time.monotonic()
    while True:
        try:
            if where is None:  # (needs the host's $HOME: inside the retry loop too)
                where = log_files(t, run_id, task)
            log, code_file = where
            code = t.read_bytes(code_file)
            from_file = code is not None
            if code is None and slurm_end is not None:  # (a cancelled job's batch shell writes none)
                end_code = slurm_end()
                code = None if end_code is None else str(end_code).encode()
            chunk = t.read_bytes(log, offset)
            ended = None
            if (code is None and not chunk and until_end and not t.host.is_slurm  # (Slurm: its own end watch above)
                    and time.monotonic() - checked > LOST_CHECK_S):
                checked = time.monotonic()
                code, ended = still_running(t, run_id)
            failures = 0
        except NoRetry:  # (a changed host key: no reconnect can mend it)
            raise
        except SpecopsError:
            if not reconnect or failures >= tries:
                raise
            failures += 1
            delay = min(2 ** failures, 30)
            t.note(f"connection to {t.host.name} lost; reconnecting in {delay}s ({failures}/{tries})", "warn")
            time.sleep(delay)
            try:
                t.reconnect()
            except NoRetry:
                raise
            except SpecopsError:
                if failures >= tries:
                    raise SpecopsError(f"gave up following {run_id} on {t.host.name} after {tries} "
                                       f"reconnects: the job keeps running; "
                                       f"`{t.hint(f'logs -f --run-id {run_id}')}` resumes") from None
            continue
        if ended:  # (lost, or its folder gone: nothing more will come)
            raise SpecopsError(ended)
        if chunk:
            write(chunk)
            offset += len(chunk)
        if code is not None and until_end:
            rest = t.read_bytes(log, offset) or b""
            if rest:
                write(rest)
                offset += len(rest)
            if slurm_end is not None and from_file:  # (the batch shell wrote its code: Slurm's own end follows)
                settled(slurm_end)
            return offset, int(code.decode().strip() or 0)
        if not chunk:
            time.sleep(poll)


#: a follower with nothing new for this long asks whether the job is still there
LOST_CHECK_S = 10.0
#: after a Slurm job's batch shell wrote its exit code, how long the follower waits for Slurm to end the job
#: (COMPLETING: its epilog, the step's accounting) so that what the caller reads next is the job's end state
SETTLE_S = 30.0


def settled(ended: Callable[[], Optional[int]], wait: float = SETTLE_S) -> bool:
    """Wait (at most `wait` s) until `ended()` answers: Slurm lists the job as ended, not COMPLETING."""
    give_up = time.monotonic() + wait
    while ended() is None:
        if time.monotonic() > give_up:
            return False
        time.sleep(0.5)
    return True


def still_running(t: Transport, run_id: str) -> tuple[Optional[bytes], Optional[str]]:
    """(None, None) while the job runs; (its exit code, as exit_code holds it, None) if it ended
    meanwhile; (None, one line) when no exit code will ever come: lost, or its run folder gone."""
    res = run_script(t, "jobs.job", ["status", "--run-id", validate_run_id(run_id)], changes=False, model=Jobs)
    if not res.ok:
        return None, (f"{run_id} on {t.host.name}: its run folder is gone (removed while followed): nothing more "
                      f"will come; `{t.hint('status')}` lists the runs")
    j = res.jobs[0]
    if j.state == JobState.LOST:
        return None, (f"{run_id} on {t.host.name} is lost ({j.detail}): no exit code will come, the follow ends; "
                      f"`{t.hint(f'status --run-id {run_id}')}` shows it")
    if j.ended:
        return str(j.exit_code if j.exit_code is not None else 1).encode(), None
    return None, None


def log_files(t: Transport, run_id: str, task: Optional[int] = None) -> tuple[str, str]:
    """(log, exit code file) of a run, or of task `task` of a Slurm job array run."""
    rec = cluster.record(t, run_id) if task is not None and t.host.is_slurm else None
    if task is None or not rec or not rec.get("array"):
        if task is not None:
            raise SpecopsError(f"run {run_id} on {t.host.name} is not a Slurm job array: drop --task")
        return run_path(t, run_id, "output.log"), run_path(t, run_id, "exit_code")
    if not 0 <= task < int(rec["array"]):
        raise SpecopsError(f"--task {task}: run {run_id} has tasks 0..{int(rec['array']) - 1}")
    return cluster.array_log(t, run_id, rec["job_ids"][-1], task), run_path(t, run_id, f"exit_code-{task}")


def tail(t: Transport, run_id: str, n: int = 25) -> str:
    data = t.read_bytes(run_path(t, run_id, "output.log"), 0) or b""
    return "\n".join(unframed(data.decode(errors="replace")).splitlines()[-n:])  # (payload frames are not for people)


def failure(t: Transport, run_id: str, what: str) -> SpecopsError:
    """The one-line error of a job that did not succeed: its state, the error it died of, its log tail."""
    j = status(t, run_id)[0]
    return SpecopsError(f"{what} {run_id} on {t.host.name} {j.describe}" + (f": {j.error}" if j.error else ""),
                        detail=tail(t, run_id, 15))


def wait_ended(t: Transport, run_id: str, timeout: float) -> Job:
    t0 = time.time()
    while True:
        j = status(t, run_id)[0]
        if j.ended or time.time() - t0 > timeout:
            return j
        time.sleep(1)


def run_following(t: Transport, run_id: str, task: Optional[int] = None,
                  write: Optional[Callable[[bytes], None]] = None, offset: int = 0) -> Optional[int]:
    """Follow a run's log (to `write`, else the connection's log sink) from byte `offset` until it ends (its exit
    code); Ctrl-C detaches (None), the run goes on."""
    try:
        return follow(t, run_id, task=task, write=write, offset=offset)[1]
    except KeyboardInterrupt:
        t.note(f"detached from {run_id}; it keeps running on {t.host.name} (`{t.hint(f'logs -f --run-id {run_id}')}` "
               f"re-attaches, `{t.hint(f'stop --run-id {run_id}')}` stops it)", "warn")
        return None


def was_stopped(t: Transport, run_id: str) -> bool:
    """An ended run's state is `stopped` (`inv stop`: its trainer may still exit 0), as `inv status` says."""
    found = [j for j in status(t, run_id) if j.run_id == run_id]
    return bool(found) and found[0].state == JobState.STOPPED


def run_attached(t: Transport, run_id: str, argv: Sequence[str], *, kind: str, lock: Optional[str] = None,
                 detach: bool = False, stop_on_interrupt: bool = True, term: str = "group",
                 write: Optional[Callable[[bytes], None]] = None, fail_on: Optional[str] = None,
                 nodes: Optional[int] = None, before: Sequence[tuple] = (),
                 supervision: Optional[Supervision] = None, uses: Sequence[str] = ()) -> Optional[int]:
    """Start a job and follow its log (to `write`, else the connection's log sink) until it ends.
    Ctrl-C stops it (stop_on_interrupt) or detaches. Returns the exit code; None if detached."""
    j = start(t, run_id, argv, kind=kind, lock=lock, term=term, fail_on=fail_on, nodes=nodes, before=before,
              supervision=supervision, uses=uses)
    how = f"submitted as Slurm job {j.slurm_job_id}" if t.host.is_slurm else f"pid {j.pid}"
    t.note(f"{kind} {'submitted' if t.host.is_slurm else 'started'} on {t.host.name}: run {run_id} ({how}); "
           f"`{t.hint(f'logs -f --run-id {run_id}')}` follows it")
    if detach:
        return None
    if not stop_on_interrupt:
        return run_following(t, run_id, offset=j.log_from)
    try:
        _, code = follow(t, run_id, write=write, offset=j.log_from)
    except KeyboardInterrupt:
        t.note(f"interrupted: stopping {run_id} (and the processes it started) ...", "warn")
        res = stop(t, run_id, grace=60)
        t.note(f"{run_id}: {res.state if res else '?'}", "warn")
        raise SpecopsError(f"{kind} {run_id} interrupted and stopped on {t.host.name}") from None
    return code


class Runs(list):
    """runs(): the host's jobs; `run_id` the one asked for (None: all)."""
    run_id: Optional[str] = None


#: the kinds of run specops starts (`inv status --kind`); a host may hold others (its own runs' kinds count too)
KINDS = ("prepare", "extract", "data", "plan-data", "train", "evaluate", "regenerate", "synthesize", "dist-check",
         "vllm-warm", "vllm-server", "fetch")


def runs(t: Transport, run_id: Optional[str] = None, kind: Optional[str] = None) -> Runs:
    """`inv status`: the host's runs (one run's, or all), only the kinds in `kind` (comma-separated) if given."""
    kinds = [k.strip() for k in (kind or "").split(",") if k.strip()]
    found = status(t, run_id)
    unknown = [k for k in kinds if k not in KINDS and not any(j.kind == k for j in found)]
    if unknown:
        have = sorted(set(KINDS) | {j.kind for j in found if j.kind and j.kind != "?"})
        raise Refused(f"--kind {unknown[0]!r}: no such kind of run (kinds: {', '.join(have)})", code=USAGE)
    out = Runs(j for j in found if not kinds or j.kind in kinds)
    out.run_id = run_id
    return out


class Cleaned(dict):
    """clean_older(): {"removed", "kept", "said"} (clean()'s)."""


def _clean_flags(older_than: Optional[str] = None, **_) -> None:
    if not older_than:
        raise Refused("clean needs --older-than AGE (e.g. 7d): which runs are old enough to remove")
    try:
        parse_age(older_than)
    except SpecopsError as e:
        raise Refused(str(e), code=USAGE) from None


@refusing(_clean_flags)
def clean_older(t: Transport, older_than: str, checkpoints: bool = False) -> Cleaned:
    """`inv clean --older-than AGE`: clean() of the runs older than AGE (7d, 12h, 30m, ...)."""
    return Cleaned(clean(t, parse_age(older_than), checkpoints=checkpoints))


class LogTail(bytes):
    """log_of(): the last MiB of a run's log."""


def log_of(t: Transport, run_id: Optional[str] = None, follow: bool = False,
           task: Optional[int] = None, write: Optional[Callable[[bytes], None]] = None) -> Optional[LogTail]:
    """`inv logs`: a run's log (the newest run's by default; a Slurm job array's: task `task`'s):
    its last MiB, or with follow, followed to `write` (else the connection's log sink) until the
    run ends (an error if it failed; None)."""
    j = own_run(t, get(t, run_id), "logs")
    if task is None and j.array:
        raise SpecopsError(f"run {j.run_id} is a Slurm job array of {j.array} tasks, each with its own log: "
                           f"give --task 0..{j.array - 1}")
    if follow:
        if run_following(t, j.run_id, task=task, write=write):
            raise SpecopsError(f"run {j.run_id} ended: {status(t, j.run_id)[0].describe}")
        return None
    log, _ = log_files(t, j.run_id, task)
    size = j.subjobs[task].log_bytes if task is not None else j.log_bytes
    return LogTail(t.read_bytes(log, max(size - (1 << 20), 0)) or b"")


__all__ = ["runs", "clean_older", "log_of", "needs_run_id", "clean", "parse_age", "run_attached", "run_following",
           "JobState", "Job", "new_run_id", "validate_run_id", "run_path", "start", "status", "get", "stop",
           "follow", "tail", "failure", "wait_ended"]
