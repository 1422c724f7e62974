"""Slurm's output as typed data: `scontrol -o show job|partition` records, `sinfo` node lines, and
the judgement of a request against a partition (one line saying what is wrong). No I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

from specops.contract import JobState
from specops.inventory import slurm_seconds
from specops.slurm.script import Request

#: `Key=` at the start of a field of `scontrol -o` (values may hold spaces: Command=, Comment=)
FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
#: Slurm's job states -> specops' (CANCELLED is `stopped` when `inv stop` asked for it)
STATES = {
    "PENDING": JobState.PENDING, "CONFIGURING": JobState.PENDING, "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING, "REQUEUE_FED": JobState.PENDING, "RESV_DEL_HOLD": JobState.PENDING,
    "SUSPENDED": JobState.PENDING, "STOPPED": JobState.PENDING,
    "RUNNING": JobState.RUNNING, "COMPLETING": JobState.RUNNING, "RESIZING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING, "STAGE_OUT": JobState.RUNNING,
    "COMPLETED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED, "BOOT_FAIL": JobState.FAILED, "NODE_FAIL": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.KILLED, "TIMEOUT": JobState.KILLED, "DEADLINE": JobState.KILLED,
    "PREEMPTED": JobState.KILLED, "CANCELLED": JobState.KILLED, "REVOKED": JobState.KILLED,
}


def records(text: str) -> list[dict[str, str]]:
    """`scontrol -o show ...`: one record per line, `Key=value` fields."""
    out = []
    for line in text.splitlines():
        marks = list(FIELD.finditer(line))
        if not marks:
            continue
        rec = {}
        for m, nxt in zip(marks, marks[1:] + [None]):
            rec[m.group(1)] = line[m.end():nxt.start() if nxt else len(line)].strip()
        out.append(rec)
    return out


def _null(v: Optional[str]) -> str:
    return "" if v in (None, "(null)", "None", "N/A") else v


@dataclass(frozen=True)
class SlurmJob:
    """One job as `scontrol show job` reports it."""

    job_id: str
    name: str
    state: str  # Slurm's own: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str
    nodes: str  # NodeList (a hostlist expression: node[1-2]); empty while pending
    exit_code: int
    signal: int
    run_time: str
    stdout: str
    #: a job array's: its id (the one sbatch answered) and this record's task indices (a pending
    #: remainder is one record for several: `0-3`, `1,3`, `2-7%2`); empty for a plain job
    array_job_id: str = ""
    array_tasks: tuple = ()

    @classmethod
    def of(cls, rec: dict) -> "SlurmJob":
        code, _, sig = rec.get("ExitCode", "0:0").partition(":")
        return cls(job_id=rec.get("JobId", ""), name=rec.get("JobName", ""),
                   state=rec.get("JobState", "UNKNOWN").split()[0], reason=_null(rec.get("Reason")),
                   nodes=_null(rec.get("NodeList")), exit_code=int(code or 0) if code.isdigit() else 0,
                   signal=int(sig) if sig.isdigit() else 0, run_time=rec.get("RunTime", ""),
                   stdout=_null(rec.get("StdOut")), array_job_id=_null(rec.get("ArrayJobId")),
                   array_tasks=task_ids(_null(rec.get("ArrayTaskId"))))

    @property
    def job_state(self) -> JobState:
        return STATES.get(self.state, JobState.LOST)

    @property
    def code(self) -> int:
        """The job's end as a shell sees it: a signal is negative."""
        return -self.signal if self.signal else self.exit_code

    def describe(self) -> str:
        """`Slurm PENDING (Resources)`, `Slurm RUNNING on node[1-2]`, `Slurm FAILED, exit 3`."""
        s = self.job_state
        if s == JobState.PENDING:
            return f"Slurm job {self.job_id} {self.state}" + (f" ({self.reason})" if self.reason else "")
        if s == JobState.RUNNING:
            return f"Slurm job {self.job_id} {self.state} on {self.nodes} for {self.run_time}"
        end = f"signal {self.signal}" if self.signal else f"exit {self.exit_code}"
        return f"Slurm job {self.job_id} {self.state}, {end}" + (
            f" ({self.reason})" if self.reason and self.state != "COMPLETED" else "")


def task_ids(text: str) -> tuple:
    """Slurm's ArrayTaskId (`3`, `0-3`, `1,3,5`, `0-7:2`, `2-7%2`) -> the indices."""
    out: list[int] = []
    for part in text.split("%")[0].split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part.strip())
        if m:
            a, b, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
            out += range(a, b + 1, step)
    return tuple(out)


def jobs(text: str) -> dict[str, SlurmJob]:
    return {j.job_id: j for j in map(SlurmJob.of, records(text)) if j.job_id}


def gres_gpus(gres: str) -> int:
    """GPUs in a node's Gres (`gpu:2`, `gpu:a100:4(S:0-1)`, `gpu:a100:4,nic:1`); 0 for none."""
    n = 0
    for part in _null(gres).split(","):
        bits = re.sub(r"\(.*?\)", "", part).split(":")
        if bits[0] == "gpu" and len(bits) >= 2 and bits[-1].isdigit():
            n += int(bits[-1])
    return n


@dataclass(frozen=True)
class Partition:
    """A partition as `scontrol show partition` and `sinfo -N` report it."""

    name: str
    state: str  # UP, DOWN, DRAIN, INACTIVE
    default: bool
    total_nodes: int
    max_nodes: Optional[int]  # per job; None: unlimited
    max_time: str
    max_time_s: Optional[int]  # None: unlimited
    node_gpus: tuple  # ((node, gpus, state), ...)

    @classmethod
    def of(cls, rec: dict, nodes: Sequence[tuple[str, int, str]] = ()) -> "Partition":
        mt = rec.get("MaxTime", "UNLIMITED")
        mn = rec.get("MaxNodes", "UNLIMITED")
        return cls(name=rec.get("PartitionName", ""), state=rec.get("State", "UNKNOWN"),
                   default=rec.get("Default") == "YES", total_nodes=int(rec.get("TotalNodes", "0") or 0),
                   max_nodes=int(mn) if mn.isdigit() else None, max_time=mt, max_time_s=slurm_seconds(mt),
                   node_gpus=tuple(nodes))

    @property
    def gpus_per_node(self) -> int:
        """The most GPUs any one node of the partition has."""
        return max((g for _, g, _ in self.node_gpus), default=0)

    def describe(self) -> str:
        """`debug: UP, 2 nodes (2 idle), 2 GPUs per node, max time 00:30:00`."""
        states: dict[str, int] = {}
        for _, _, st in self.node_gpus:
            states[st] = states.get(st, 0) + 1
        counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        return (f"{self.name}: {self.state}, {self.total_nodes} node(s)" + (f" ({counts})" if counts else "")
                + f", {self.gpus_per_node} GPU(s) per node, max time {self.max_time}")


def sinfo_nodes(text: str) -> list[tuple[str, int, str]]:
    """`sinfo -h -N -o '%N|%G|%T'` lines -> (node, GPUs, state)."""
    out = []
    for line in text.splitlines():
        bits = line.strip().split("|")
        if len(bits) == 3:
            out.append((bits[0], gres_gpus(bits[1]), bits[2]))
    return out


def judge(p: Partition, r: Request) -> Optional[str]:
    """What is wrong with asking partition p for r (one line), or None."""
    if p.state != "UP":
        return f"partition {p.name} is {p.state}: it takes no jobs now (`sinfo -p {p.name}` says why)"
    limit = min(p.total_nodes, p.max_nodes or p.total_nodes)
    if r.nodes > limit:
        return (f"{r.nodes} nodes asked; partition {p.name} has {p.total_nodes}"
                + (f" and takes at most {p.max_nodes} per job" if p.max_nodes and p.max_nodes < p.total_nodes else "")
                + f": ask for at most {limit} (--nodes or slurm.nodes)")
    if r.gpus_per_node > p.gpus_per_node:
        return (f"{r.gpus_per_node} GPUs per node asked; partition {p.name}'s nodes have at most "
                f"{p.gpus_per_node}: lower slurm.gpus_per_node, or pick another partition")
    asked = slurm_seconds(r.time) if r.time else None
    if asked is not None and p.max_time_s is not None and asked > p.max_time_s:
        return (f"time limit {r.time} asked; partition {p.name} allows at most {p.max_time}: lower slurm.time "
                f"(or --time), or pick another partition")
    return None
