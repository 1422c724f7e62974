"""The sbatch script of a run, rendered from typed inputs (no connection, no I/O).

One task per node (`srun --ntasks-per-node=1`); each runs the host's setup lines, then the run's
node command (the host venv's interpreter, e.g. `remote/specops_host/train/run.py --spec ...`), which reads its
rank from Slurm's environment (SLURM_NNODES, SLURM_NODEID) and the rendezvous address from
SPECOPS_RDZV_ADDR: the first node of the allocation, as `scontrol show node` gives its address.
The batch shell records srun's exit code in RUN/exit_code. A hard cancel (`scancel JOBID`, the time
limit: Slurm's SIGTERM to the batch shell too, SIGKILL after KillWait) is recorded there at once as
-15 (signal 15: a trap; srun runs in the background so that `wait` lets it run at once, not when
srun has ended), then the shell waits for srun, which Slurm signals as well: once Slurm no longer
lists the job (MinJobAge), the run reads as killed, not lost.

A job array (BatchJob.array = N, `sbatch --array=0-N-1`): N tasks of the same script, each its
own allocation (its own GPUs); an argument holding ARRAY_TASK gets the task's index
($SLURM_ARRAY_TASK_ID) there, e.g. `--shard {array_task}/N`. Each task writes its own log,
RUN/output-<array job id>_<task>.log (sbatch's `%A_%a`), and exit code, RUN/exit_code-<task>.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Optional, Sequence

from specops.contract import Supervision
from specops.inventory import Slurm

#: the variable the batch shell sets to the first node's address (remote/specops_host/jobs/launch.py reads it)
RDZV_VAR = "SPECOPS_RDZV_ADDR"
#: in an argument of an array job's command: the task's index (the shell's $SLURM_ARRAY_TASK_ID)
ARRAY_TASK = "{array_task}"


#: the batch shell's SIGTERM trap (a hard cancel, the time limit): the end recorded first, then srun
#: (signalled by Slurm too) waited for; 143 = 128 + SIGTERM, as a shell reports it
CANCELLED = 'echo "[specops] the batch shell got SIGTERM (scancel or the time limit): ending"; echo -15 > {ex}; ' \
            'wait; exit 143'


def shell_arg(arg: str) -> str:
    """One argument, quoted for the shell, ARRAY_TASK left to the shell to expand."""
    pieces = str(arg).split(ARRAY_TASK)
    if len(pieces) == 1:
        return shlex.quote(str(arg))
    return '"$SLURM_ARRAY_TASK_ID"'.join(shlex.quote(p) if p else "" for p in pieces)


@dataclass(frozen=True)
class Request:
    """What one allocation asks Slurm for (sbatch's and srun's options alike)."""

    nodes: int = 1
    gpus_per_node: int = 0
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: Optional[str] = None
    constraint: Optional[str] = None

    @classmethod
    def of(cls, s: Slurm, *, nodes: Optional[int] = None, time: Optional[str] = None) -> "Request":
        return cls(nodes=nodes or s.nodes, gpus_per_node=s.gpus_per_node, partition=s.partition,
                   account=s.account, qos=s.qos, time=time or s.time, constraint=s.constraint)

    def options(self) -> list[str]:
        """`--partition=...` and the others: sbatch's header lines and srun's arguments."""
        out = [f"--nodes={self.nodes}", "--ntasks-per-node=1"]
        for k in ("partition", "account", "qos", "time", "constraint"):
            v = getattr(self, k)
            if v:
                out.append(f"--{k}={v}")
        if self.gpus_per_node:
            out.append(f"--gpus-per-node={self.gpus_per_node}")
        return out


@dataclass(frozen=True)
class BatchJob:
    """One run's job: what it asks for, where it runs and writes, and each node's command."""

    name: str
    workdir: str
    run_dir: str
    command: Sequence[str]
    request: Request
    setup: Sequence[str] = field(default_factory=tuple)
    env_file: Optional[str] = None
    #: tasks of a job array (0: a plain job)
    array: int = 0
    #: (label, argv) run in the batch shell before srun; a step that fails ends the job with its code
    before: Sequence[tuple] = field(default_factory=tuple)
    #: a training's Supervision (its requeue): None says nothing (Slurm's default), restarts 0
    #: `--no-requeue`, N `--requeue` and the batch shell of a requeued start (SLURM_RESTART_COUNT > 0)
    #: records it through remote/specops_host/jobs/requeued.py, which ends the job (exit 3) once past N
    supervision: Optional[Supervision] = None

    @property
    def output(self) -> str:
        return f"{self.run_dir}/output-%A_%a.log" if self.array else f"{self.run_dir}/output.log"

    @property
    def exit_file(self) -> str:
        return f"{self.run_dir}/exit_code-{ARRAY_TASK}" if self.array else f"{self.run_dir}/exit_code"

    def node_shell(self, command: Optional[Sequence[str]] = None) -> str:
        """What each node's task runs: the setup lines, the run's environment, then the command
        (default: the job's)."""
        lines = list(self.setup)
        if self.env_file:  # (KEY=VALUE lines, 0600; exported as they are, never evaluated)
            lines.append(f'while IFS= read -r kv; do export "$kv"; done < {shlex.quote(self.env_file)}')
        if self.array and command is None:
            lines.append('echo "[specops] array task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID on $(hostname), '
                         'GPUs ${CUDA_VISIBLE_DEVICES:-none}"')
        lines.append("exec " + " ".join(map(shell_arg, self.command if command is None else command)))
        return "\n".join(lines)


def render(job: BatchJob) -> str:
    """The sbatch script: the header from the request, srun starting one task per node."""
    head = [f"--job-name={job.name}", *job.request.options(), f"--chdir={job.workdir}", f"--output={job.output}",
            "--open-mode=append"] + ([f"--array=0-{job.array - 1}"] if job.array else [])
    restarts = job.supervision.restarts if job.supervision is not None else None
    if restarts is not None:
        head.append("--requeue" if restarts > 0 else "--no-requeue")
    q = shlex.quote
    ex = shell_arg(job.exit_file)
    steps = []
    if restarts:  # (a requeued start: recorded, or the job ended once past the restarts allowed)
        rec = shlex.join([job.command[0], "-m", "specops_host.jobs.requeued", "--run-dir", job.run_dir,
                          "--of", str(restarts)])
        steps += ['if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
                  f'  {rec} --count "$SLURM_RESTART_COUNT"; rc=$?',
                  f'  if [ "$rc" != 0 ]; then echo "$rc" > {ex}; exit "$rc"; fi',
                  '  export SPECOPS_RESTART="$SLURM_RESTART_COUNT"',  # (train/run.py: which restart, in run.json)
                  'fi']
    for label, argv in job.before:  # (one task on the allocation's first node, its setup lines first)
        steps += [f"echo {q(f'[specops] {label}')}",
                  f"srun --nodes=1 --ntasks=1 --kill-on-bad-exit=1 bash -c {q(job.node_shell(argv))} & wait $!",
                  f'rc=$?; if [ "$rc" != 0 ]; then echo "$rc" > {ex}; exit "$rc"; fi']
    return "\n".join([
        "#!/bin/bash",
        *(f"#SBATCH {shlex.quote(o)}" for o in head),
        f"# specops: {job.name}: " + (f"an array of {job.array} tasks, one allocation each" if job.array else
                                      "one task per node; the rendezvous on the allocation's first node"),
        f"rm -f {ex}",
        f"trap {q(CANCELLED.format(ex=ex))} TERM",
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f'{RDZV_VAR}=$(scontrol -o show node "$first" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")',
        f'export {RDZV_VAR}="${{{RDZV_VAR}:-$first}}"',
        *steps,
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {q(job.node_shell())} & wait $!",
        "rc=$?",
        f'echo "$rc" > {ex}',
        'exit "$rc"',
        "",
    ])


def srun_prefix(request: Request) -> str:
    """`srun OPTIONS` for one command on the allocation's nodes (e.g. the preflight on a compute node)."""
    return shlex.join(["srun", *request.options()])
