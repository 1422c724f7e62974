"""Slurm's commands over a connection to the login node; every function returns data.

A run's Slurm record lives beside its files: RUN/slurm.json (the job ids it was submitted as, the
newest last; whether `inv stop` asked for its end), RUN/slurm-job.sh (the script). Status reads
`scontrol -o show job` (no sacct: finished jobs stay MinJobAge seconds; after that, RUN/exit_code,
which the batch shell writes: srun's exit code, or -15 when Slurm's SIGTERM ended the job: a hard
cancel, the time limit). The workdir must be on a filesystem the compute nodes share: `inv
check` proves it (a compute node reads a file the login node just wrote) and leaves the verdict in
<workdir>/.specops/slurm-shared.json, which a submission needs.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from typing import Any, Callable, Optional

from specops.contract import JobState
from specops.errors import SpecopsError
from specops.host.transport import Transport
from specops.payloads import Job, Started, Stopped
from specops.slurm import queue
from specops.slurm.script import BatchJob, Request, render, srun_prefix
from specops_host.jobs import errlines, loglines

RECORD, SCRIPT = "slurm.json", "slurm-job.sh"
#: a requeued training's last restart (remote/specops_host/jobs/requeued.py writes it)
RESTART = "slurm-restart.json"
VERDICT = ".specops/slurm-shared.json"
#: seconds between two looks at Slurm while `inv stop` waits for the job to end
POLL = 1.0


def _q(x: str) -> str:
    return shlex.quote(str(x))


def slurm(t: Transport, cmd: str, what: str, *, changes: bool = False):
    """Run a Slurm command on the login node; its absence is one line."""
    r = (t.change if changes else t.fact)(cmd)
    if r.exited == 127:
        raise SpecopsError(f"{what}: Slurm's commands are not on {t.host.name}'s PATH in an SSH session "
                           f"(`ssh {t.host.address} sinfo` must work: load them in the login environment)")
    return r


# -- the partition ------------------------------------------------------------------------
def partition(t: Transport, name: Optional[str], what: str = "slurm") -> queue.Partition:
    """The partition (default: the cluster's default one), its nodes' GPUs and states."""
    r = slurm(t, "scontrol -o show partition", "slurm partition")
    if not r.ok:
        raise SpecopsError(f"scontrol show partition failed on {t.host.name}: "
                           f"{(r.stderr or r.stdout).strip().splitlines()[-1:] or r.exited}")
    parts = {p["PartitionName"]: p for p in queue.records(r.stdout) if p.get("PartitionName")}
    if name is None:
        name = next((n for n, p in parts.items() if p.get("Default") == "YES"), None)
        if name is None:
            raise SpecopsError(f"{what} on {t.host.name}: the cluster has no default partition: set slurm.partition "
                               f"in hosts.yaml (its partitions: {', '.join(sorted(parts)) or 'none'})")
    if name not in parts:
        raise SpecopsError(f"{what} on {t.host.name}: unknown partition {name!r} (slurm.partition in hosts.yaml); "
                           f"the cluster's partitions: {', '.join(sorted(parts)) or 'none'} (nothing was submitted)")
    nodes = slurm(t, f"sinfo -h -N -p {_q(name)} -o '%N|%G|%T'", "sinfo").stdout
    return queue.Partition.of(parts[name], queue.sinfo_nodes(nodes))


def judge_request(t: Transport, request: Request, what: str) -> queue.Partition:
    """Refuse (one line, before anything is submitted) a request the partition cannot take."""
    p = partition(t, request.partition, what)
    bad = queue.judge(p, request)
    if bad:
        raise SpecopsError(f"{what} on {t.host.name}: {bad} (nothing was submitted)")
    return p


# -- the shared workdir -------------------------------------------------------------------
def probe_shared(t: Transport, request: Request) -> dict:
    """Write a token in the workdir on the login node; every node of an allocation of `request`
    reads it (srun). Records and returns {shared, workdir, nodes, error}."""
    wd = t.workdir
    probe = f"{wd}/.specops/slurm-probe"
    token = secrets.token_hex(8)
    t.check(f"mkdir -p {_q(wd)}/.specops && printf %s {token} > {_q(probe)}", "writing the shared-workdir probe")
    show = 'printf "%s %s\\n" "$(hostname)" "$(cat ' + _q(probe) + ' 2>/dev/null)"'
    r = slurm(t, f"cd {_q(wd)} && {srun_prefix(request)} bash -c {_q(show)}", "srun")
    seen = [ln.split() for ln in r.stdout.splitlines() if ln.strip()]
    res: dict[str, Any]
    if not r.ok:
        res = {"shared": None, "error": f"srun failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"}
    else:
        blind = [s[0] for s in seen if len(s) < 2 or s[1] != token]
        res = {"shared": not blind and len(seen) == request.nodes,
               "error": f"compute node(s) {', '.join(blind)} do not see {probe}" if blind else
               None if len(seen) == request.nodes else f"{len(seen)} of {request.nodes} node(s) answered srun"}
    res.update(workdir=wd, nodes=request.nodes, checked=time.time())
    if res["shared"] is not None:
        t.put_text(json.dumps(res), f"{wd}/{VERDICT}", label="(shared-workdir verdict)", whole=True)
    return res


def refuse_unshared(t: Transport, what: str) -> None:
    """A submission needs `inv check`'s proof that the compute nodes see the workdir."""
    raw = t.read_bytes(f"{t.workdir}/{VERDICT}")
    v = json.loads(raw) if raw else None
    if v and v.get("workdir") == t.workdir and v.get("shared"):
        return
    if v and v.get("workdir") == t.workdir:
        raise SpecopsError(f"{what} on {t.host.name}: workdir {t.workdir} is not shared with the compute nodes "
                           f"({v.get('error')}): put `workdir:` and `venv:` on the cluster's shared filesystem "
                           f"(nothing was submitted)")
    raise SpecopsError(f"{what} on {t.host.name}: workdir {t.workdir} is not known to be shared with the compute "
                       f"nodes: run `{t.hint('check')}` first (a compute node reads a file the login node wrote "
                       f"there) (nothing was submitted)")


# -- a run's record -----------------------------------------------------------------------
def run_dir(t: Transport, run_id: str) -> str:
    return f"{t.workdir}/runs/{run_id}"


def record(t: Transport, run_id: str) -> Optional[dict]:
    raw = t.read_bytes(f"{run_dir(t, run_id)}/{RECORD}")
    return json.loads(raw) if raw else None


def _write_record(t: Transport, run_id: str, rec: dict) -> None:
    t.put_text(json.dumps(rec), f"{run_dir(t, run_id)}/{RECORD}", label="(slurm record)", whole=True)


def check_job(t: Transport, job: BatchJob, kind: str) -> str:
    """Judge the request against the partition, need the shared workdir, and have Slurm check the
    script (`sbatch --test-only`: account, qos, constraint); writes nothing. Returns the script."""
    judge_request(t, job.request, kind)
    refuse_unshared(t, kind)
    text = render(job)
    end = "SPECOPS_" + secrets.token_hex(6).upper()
    test = slurm(t, f"cd {_q(job.workdir)} && sbatch --test-only <<'{end}'\n{text}{end}\n", "sbatch --test-only")
    if not test.ok:
        err = (test.stderr or test.stdout).strip().splitlines()
        raise SpecopsError(f"{kind} on {t.host.name}: Slurm refuses the job: {err[-1] if err else test.exited} "
                           f"(nothing was submitted)")
    return text


def submit(t: Transport, job: BatchJob, text: str, run_id: str, kind: str, lock: Optional[str] = None) -> Started:
    """Write the script (from check_job), submit it (`sbatch --parsable`) and record the job id
    (Started with slurm_job_id). Under --dry-run: the script and the command said."""
    path = f"{job.run_dir}/{SCRIPT}"
    cmd = f"cd {_q(job.workdir)} && sbatch --parsable {_q(path)}"
    t.would(f"write {path}:\n{text}")
    stand = t.planned_change(cmd, f"the Slurm job of run {run_id}", writes=(job.run_dir,))
    if stand is not None:
        return stand
    old = f"{_q(job.run_dir)}/exit_code-*" if job.array else _q(job.exit_file)
    t.check(f"mkdir -p {_q(job.run_dir)} && rm -f {old}", "mkdir run dir")
    t.put_text(text, path, label="(sbatch script)", whole=True)
    r = slurm(t, cmd, "sbatch", changes=True)
    if not r.ok or not r.stdout.strip():
        err = (r.stderr or r.stdout).strip().splitlines()
        raise SpecopsError(f"{kind} on {t.host.name}: sbatch failed: {err[-1] if err else r.exited}")
    job_id = r.stdout.strip().splitlines()[-1].split(";")[0]
    rec = record(t, run_id) or {"run_id": run_id, "kind": kind, "job_ids": []}
    rec["job_ids"].append(job_id)
    rec.update(submitted=time.time(), stopped=False, nodes=job.request.nodes, partition=job.request.partition,
               lock=lock, array=job.array)
    _write_record(t, run_id, rec)
    return Started(ok=True, run_id=run_id, slurm_job_id=job_id)


# -- state --------------------------------------------------------------------------------
def slurm_jobs(t: Transport, ids: list[str]) -> dict[str, queue.SlurmJob]:
    """The jobs Slurm still knows of (`scontrol -o show job ID`, each)."""
    if not ids:
        return {}
    cmd = "; ".join(f"scontrol -o show job {_q(i)} 2>/dev/null" for i in ids) + "; true"
    return queue.jobs(slurm(t, cmd, "scontrol show job").stdout)


def _list_runs(t: Transport) -> list[tuple[dict, int, Optional[int]]]:
    """(record, log bytes, exit code file) of every run with a Slurm record."""
    cmd = (f"cd {_q(t.workdir)}/runs 2>/dev/null || exit 0; for d in */; do d=${{d%/}}; "
           f"[ -f \"$d/{RECORD}\" ] || continue; printf '%s\\t%s\\t%s\\t%s\\n' \"$(cat \"$d/{RECORD}\")\" "
           f"\"$(stat -c %s \"$d/output.log\" 2>/dev/null || echo 0)\" \"$(cat \"$d/exit_code\" 2>/dev/null)\" "
           f"\"$(cat \"$d/{RESTART}\" 2>/dev/null | tr -d '\\n\\t')\"; done")
    out = []
    for line in t.fact(cmd).stdout.splitlines():
        bits = line.split("\t")
        if len(bits) == 4:
            try:
                rec = json.loads(bits[0])
            except json.JSONDecodeError:
                continue
            try:
                restart = json.loads(bits[3]) if bits[3].strip() else None
            except json.JSONDecodeError:
                restart = None
            if isinstance(restart, dict):
                rec["restart"] = restart
            code = bits[2].strip()
            out.append((rec, int(bits[1] or 0), int(code) if code.lstrip("-").isdigit() else None))
    return sorted(out, key=lambda x: x[0].get("submitted", 0))


def _state(jid: str, code: Optional[int], sj: Optional[queue.SlurmJob], stopped: bool):
    """(state, detail, exit code) from Slurm's record (else the exit code the batch shell wrote)."""
    if sj is not None:
        state, detail = sj.job_state, sj.describe()
        exit_code = sj.code if state.terminal else None
        if state == JobState.SUCCEEDED and code not in (None, 0):  # (srun's code, as the batch shell wrote it)
            state, exit_code = JobState.FAILED, code
    elif code is not None and code < 0:  # (the batch shell's trap: a hard cancel or the time limit)
        state, exit_code = JobState.KILLED, code
        detail = f"Slurm job {jid} ended by signal {-code} (scancel or its time limit)"
    elif code is not None:
        state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
        detail, exit_code = f"Slurm job {jid} ended, exit {code}", code
    else:
        state, detail, exit_code = JobState.LOST, f"Slurm no longer lists job {jid} and it left no exit code", None
    if stopped and state.terminal:
        state = JobState.STOPPED
    return state, detail, exit_code


def _tail(t: Transport, log: str, size: int) -> str:
    return (t.read_bytes(log, max(size - 16384, 0)) or b"").decode(errors="replace") if size else ""


def _job(t: Transport, rec: dict, size: int, code: Optional[int], sj: Optional[queue.SlurmJob]) -> Job:
    jid = rec["job_ids"][-1]
    state, detail, exit_code = _state(jid, code, sj, bool(rec.get("stopped")))
    r = rec.get("restart")
    if isinstance(r, dict) and r.get("n"):  # (Slurm requeued it: restart n of N, or why they stopped)
        step = r.get("step")
        detail += "; " + (f"restarts stopped: {r['gave_up']}" if r.get("gave_up") else
                          f"restart {r['n']} of {r.get('of', '?')}: {r.get('cause', 'requeued')} "
                          + (f"at step {step:,}" if isinstance(step, int) else "before any step"))
    tail = _tail(t, f"{run_dir(t, rec['run_id'])}/output.log", size)
    err = None
    if state in (JobState.FAILED, JobState.KILLED):
        err = errlines.first_error(tail)
    return Job(run_id=rec["run_id"], kind=rec.get("kind", ""), state=state, detail=detail,
               age_s=round(time.time() - rec.get("submitted", time.time()), 1), log_bytes=size,
               last_line=loglines.last_meaningful(tail), exit_code=exit_code, error=err,
               slurm_job_id=jid, slurm_state=sj.state if sj else None, nodes=sj.nodes if sj else "",
               reason=sj.reason if sj else "", lock=rec.get("lock"))


def array_log(t: Transport, run_id: str, array_id: str, task: int) -> str:
    """An array task's log (sbatch's --output=RUN/output-%A_%a.log)."""
    return f"{run_dir(t, run_id)}/output-{array_id}_{task}.log"


def _array_job(t: Transport, rec: dict, known: dict[str, queue.SlurmJob]) -> Job:
    """A job array's run: one subjob per task (`task<i>`: its Slurm record, log and exit code),
    the run's state theirs together (running while any runs; succeeded when all did; else the
    first failed task's exit code and error)."""
    jid, n, rid = rec["job_ids"][-1], int(rec["array"]), rec["run_id"]
    by_task = {i: j for j in known.values() if j.array_job_id == jid for i in j.array_tasks}
    rd = run_dir(t, rid)
    probe = "; ".join(f'printf "%s %s\\n" "$(stat -c %s {_q(array_log(t, rid, jid, i))} 2>/dev/null || echo 0)" '
                      f'"$(cat {_q(rd)}/exit_code-{i} 2>/dev/null || echo -)"' for i in range(n))
    seen = [ln.split() for ln in t.fact(probe).stdout.splitlines()]
    tasks = []
    for i in range(n):
        size, code = (seen[i] + ["0", "-"])[:2] if i < len(seen) else ("0", "-")
        c = int(code) if code.lstrip("-").isdigit() else None
        sj = by_task.get(i)
        state, detail, exit_code = _state(f"{jid}_{i}", c, sj, bool(rec.get("stopped")))
        tail = _tail(t, array_log(t, rid, jid, i), int(size))
        err = errlines.first_error(tail) if state in (JobState.FAILED, JobState.KILLED) else None
        tasks.append(Job(run_id=f"task{i}", kind=rec.get("kind", ""), state=state,
                         detail=detail.replace(f"Slurm job {sj.job_id} ", f"Slurm job {jid}_{i} ") if sj else detail,
                         log_bytes=int(size), exit_code=exit_code, error=err, slurm_job_id=f"{jid}_{i}",
                         last_line=loglines.last_meaningful(tail),
                         nodes=sj.nodes if sj else "", reason=sj.reason if sj else ""))
    states = [j.state for j in tasks]
    bad = next((j for j in tasks if j.state in (JobState.FAILED, JobState.KILLED, JobState.LOST)), None)
    if not all(s.terminal for s in states):
        state = JobState.PENDING if all(s == JobState.PENDING for s in states) else JobState.RUNNING
        exit_code = None
    elif bad is None:
        state, exit_code = (JobState.STOPPED if rec.get("stopped") and any(s == JobState.STOPPED for s in states)
                            else JobState.SUCCEEDED), 0
    else:
        state, exit_code = bad.state, bad.exit_code if bad.exit_code is not None else 1
    if rec.get("stopped") and state.terminal:
        state = JobState.STOPPED
    counts: dict[str, int] = {}
    for s in states:
        counts[s.value] = counts.get(s.value, 0) + 1
    detail = f"Slurm job array {jid}: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + f" of {n} task(s)"
    if bad is not None and state.terminal:
        detail += f"; {bad.run_id} {bad.detail}"
    return Job(run_id=rid, kind=rec.get("kind", ""), state=state, detail=detail,
               age_s=round(time.time() - rec.get("submitted", time.time()), 1),
               log_bytes=sum(j.log_bytes for j in tasks),
               last_line=next((j.last_line for j in tasks if j.last_line), ""),
               exit_code=exit_code, error=bad.error if bad is not None else None, slurm_job_id=jid,
               nodes=",".join(j.nodes for j in tasks if j.nodes), lock=rec.get("lock"), subjobs=tasks, array=n)


def status(t: Transport, run_id: Optional[str] = None) -> list[Job]:
    """The runs with a Slurm record (one, or all), state from Slurm, as `inv status` shows jobs."""
    runs = [r for r in _list_runs(t) if run_id is None or r[0].get("run_id") == run_id]
    if run_id is not None and not runs:
        raise SpecopsError(f"unknown run id {run_id!r} on {t.host.name}: `{t.hint('status')}` lists the runs")
    known = slurm_jobs(t, [r[0]["job_ids"][-1] for r in runs])
    return [_array_job(t, rec, known) if rec.get("array") else _job(t, rec, size, code, known.get(rec["job_ids"][-1]))
            for rec, size, code in runs]


def end_watcher(t: Transport, run_id: str) -> Callable[[], Optional[int]]:
    """For `logs -f`: a function that answers the run's exit code once its job has ended, else
    None (it asks Slurm at most every 2 s)."""
    seen = {"at": 0.0}

    def ended() -> Optional[int]:
        if time.time() - seen["at"] < 2:
            return None
        seen["at"] = time.time()
        j = status(t, run_id)[0]
        return (j.exit_code if j.exit_code is not None else 1) if j.ended else None

    return ended


def stop(t: Transport, run_id: str, grace: float = 60.0) -> Stopped:
    """SIGTERM to the job's tasks through Slurm (`scancel --signal=TERM`: the trainer saves its
    interrupted checkpoint; the batch shell records the exit code), then, if it has not ended
    after `grace` seconds, `scancel` (Slurm's SIGTERM, KillWait, SIGKILL). A pending job is
    cancelled at once. Under --dry-run: the commands said."""
    j = status(t, run_id)[0]
    jid = j.slurm_job_id or ""  # (every job of a slurm host has its Slurm id)
    if j.ended:
        return Stopped(ok=True, run_id=run_id, state=j.state, detail=j.detail, already=j.state.value)
    pending = j.state == JobState.PENDING
    term = f"scancel {_q(jid)}" if pending else f"scancel --signal=TERM {_q(jid)}"
    if not pending and any(s.state == JobState.PENDING for s in j.subjobs):  # (an array's tasks not started yet)
        term = f"scancel --state=PENDING {_q(jid)} && {term}"
    stand = t.planned_change(term, f"the stop of {run_id}")
    if stand is not None:
        if not pending:
            t.would(f"wait up to {grace:.0f}s for job {jid} to end, then run: scancel {_q(jid)}")
        return stand
    rec = record(t, run_id)
    assert rec is not None  # (status() above found it)
    rec["stopped"] = True
    _write_record(t, run_id, rec)
    t0 = time.time()
    r = slurm(t, term, "scancel", changes=True)
    if not r.ok:
        raise SpecopsError(f"stop {run_id} on {t.host.name}: {term} failed: {(r.stderr or r.stdout).strip()}")
    cancelled = pending
    while True:
        j = status(t, run_id)[0]
        if j.ended:
            break
        if time.time() - t0 > grace and not cancelled:
            slurm(t, f"scancel {_q(jid)}", "scancel", changes=True)
            cancelled = True
        if time.time() - t0 > grace + 120:
            raise SpecopsError(f"stop {run_id} on {t.host.name}: Slurm job {jid} has not ended {grace + 120:.0f}s "
                               f"after SIGTERM and scancel ({j.detail})")
        time.sleep(POLL)
    return Stopped(ok=True, run_id=run_id, state=j.state, detail=j.detail, sigkill=cancelled and not pending,
                   seconds=round(time.time() - t0, 1))
