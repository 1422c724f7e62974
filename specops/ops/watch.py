"""A training that looks after itself: the Supervision (remote/specops_host/contract.py) `inv train`
builds for its job, once, from its flags over the host's defaults; the host's supervisor
(remote/specops_host/jobs/watch.py) restarts after an abnormal end, finds a stall, notifies.

--restarts N (default: hosts.yaml `restarts`, else 3 on a cuda host, 0 on a cpu host),
--stall-after S (default: 20x the run's median step time, at least 300 s), --first-step-after S,
--restart-on-stall, --backoff S (the first wait before a restart, doubling, at most 600 s; default 30),
--notify URL|CMD (default: hosts.yaml `notify`): a webhook (a JSON {"text": ...} POSTed) or a
command run on the host; it travels in the job's 0600 env file, never on a command line. A Slurm
host's Supervision is Slurm's requeue (restarts alone).
And complete checkpoints as a listing shows them (checkpoint_split: fetch, evaluate, clean skip
the incomplete ones and say which).
"""

from __future__ import annotations

from typing import Optional

from specops.args import Refused
from specops.contract import Supervision, supervision as checked
from specops.host.transport import Transport
from specops_host.jobs import notify as host_notify
from specops_host import ckpt


def problem(target: Optional[str]) -> Optional[str]:
    """Why a notification target cannot be used (one phrase), or None."""
    return None if target is None else host_notify.problem(target)


def check_flags(restarts: Optional[int] = None, restart_on_stall: bool = False, notify: Optional[str] = None,
                **_) -> None:
    """`inv train`'s supervision flags, before anything connects (the numbers: specops/args.py): the
    target, and the Supervision's own rules where the flags alone decide them (--restarts given)."""
    why = problem(notify)
    if why:
        raise Refused(f"--notify {host_notify.named(notify)}: {why}", code=2)  # (never the URL's secrets)
    if restarts is not None:
        checked(restarts=restarts, restart_on_stall=restart_on_stall)


def group_flags(restarts=None, stall_after=None, restart_on_stall=False, backoff=None, notify=None,
                first_step_after=None, **_) -> None:
    """A group's training (one torchrun per host) is not restarted as one yet."""
    given = [f for f, v in (("--restarts", restarts), ("--stall-after", stall_after),
                            ("--first-step-after", first_step_after), ("--restart-on-stall", restart_on_stall),
                            ("--backoff", backoff), ("--notify", notify))
             if v not in (None, False, 0)]
    if given:
        raise Refused(f"{', '.join(given)}: a group's training (one torchrun per host) is not restarted or watched "
                      f"as one yet; train on one host to have it restarted, or drop them")


def supervision(t: Transport, *, restarts: Optional[int] = None, stall_after: Optional[float] = None,
                restart_on_stall: bool = False, backoff: Optional[float] = None, notify: Optional[str] = None,
                first_step_after: Optional[float] = None) -> Supervision:
    """The Supervision of a training on t's host: the flags over hosts.yaml's `restarts` and
    `notify`; on a Slurm host Slurm's requeue (restarts alone: the rest refused when asked for)."""
    h = t.host
    if h.is_slurm and h.notify and notify is None:
        t.note(f"{h.name}: hosts.yaml notify does not apply to a Slurm job yet (nobody is told)")
    try:
        return checked(restarts=restarts if restarts is not None else h.restarts_default, backoff=backoff,
                       stall_after=stall_after, first_step_after=first_step_after, restart_on_stall=restart_on_stall,
                       notify=notify if notify is not None or h.is_slurm else h.notify, requeue=h.is_slurm)
    except Refused as e:
        raise Refused(f"{e} ({h.name})", code=e.code) from None


def said(sup: Supervision) -> str:
    """One line: what the supervision will do."""
    n = sup.restarts
    if sup.requeue:
        return (f"restarts: up to {n}, by Slurm's requeue (a preemption, a node failure, `scontrol requeue`), "
                f"each resuming from the last complete checkpoint" if n else "restarts: off (#SBATCH --no-requeue)")
    parts = [f"restarts: up to {n} (back-off {sup.backoff:g}s, doubling)" if n else "restarts: off",
             "stall: " + (f"no step for {sup.stall_after:g}s" if sup.stall_after
                          else "no step for 20x the median step time (>= 300s)")
             + (f" (before the first step: {sup.first_step_after:g}s)" if sup.first_step_after else "")
             + (", then restarted" if sup.restart_on_stall else ", reported"),
             f"notify: {host_notify.shown(sup.notify)}" if sup.notify else "notify: none"]
    return "; ".join(parts)


def worth_saying(sup: Supervision) -> bool:
    """Whether the start says the supervision (anything beyond restarts off, a stall reported, nobody told)."""
    return bool(sup.restarts or sup.notify or sup.stall_after or sup.restart_on_stall)


# -- complete checkpoints, as a listing shows them (remote/specops_host/ckpt.py writes the markers) --
def checkpoint_split(listing: dict, under: str = "checkpoints/") -> tuple[list[str], list[str]]:
    """(complete checkpoints, incomplete ones: a save that did not finish, or set aside as incomplete-N-<time>)."""
    names = {rel[len(under):].split("/")[0] for rel, e in listing.items()
             if e.kind == "f" and rel.startswith(under) and rel[len(under):].count("/") == 1
             and rel.endswith("/config.json")}
    marked = f"{under}{ckpt.POLICY}" in listing
    done = {n for n in names
            if not n.startswith(ckpt.SET_ASIDE) and (not marked or f"{under}{n}/{ckpt.MARKER}" in listing)}
    order = lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)  # noqa: E731
    return sorted(done, key=order), sorted(names - done, key=order)


def skipped_note(t: Transport, run_id: str, skipped: list[str], what: str) -> None:
    if skipped:
        t.note(f"{what}: skipped the incomplete checkpoint(s) of {run_id}: {', '.join(skipped)} (a save that did not "
               f"finish: no {ckpt.MARKER})", "warn")
