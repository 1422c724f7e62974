"""A training that looks after itself: the settings `inv train` gives its supervisor on the host
(remote/specops_host/jobs/watch.py: restarts after an abnormal end, a stall found, notifications).

--restarts N (default: hosts.yaml `restarts`, else 3 on a cuda host, 0 on a cpu host),
--stall-after S (default: 20x the run's median step time, at least 300 s), --restart-on-stall,
--backoff S (the first wait before a restart, doubling, at most 600 s; default 30),
--notify URL|CMD (default: hosts.yaml `notify`): a webhook (a JSON {"text": ...} POSTed) or a
command run on the host; it travels in the job's 0600 env file, never on a command line.
And complete checkpoints as a listing shows them (checkpoint_split: fetch, evaluate, clean skip
the incomplete ones and say which).
"""

from __future__ import annotations

from typing import Optional

from specops.args import Refused
from specops.host.transport import Transport
from specops_host.jobs import notify as host_notify
from specops_host import ckpt


def problem(target: Optional[str]) -> Optional[str]:
    """Why a notification target cannot be used (one phrase), or None."""
    return None if target is None else host_notify.problem(target)


def check_flags(restarts=None, stall_after=None, restart_on_stall=False, backoff=None, notify=None,
                first_step_after=None, **_) -> None:
    """`inv train`'s settings of its supervisor, before anything connects (the numbers: specops/args.py)."""
    why = problem(notify)
    if why:
        raise Refused(f"--notify {host_notify.named(notify)}: {why}", code=2)  # (never the URL's secrets)
    if restart_on_stall and restarts == 0:
        raise Refused("--restart-on-stall restarts a stalled trainer, but --restarts 0 allows no restart: give "
                      "--restarts N (N >= 1) or drop --restart-on-stall", code=2)


def group_flags(restarts=None, stall_after=None, restart_on_stall=False, backoff=None, notify=None,
                first_step_after=None, **_) -> None:
    """A group's training (one torchrun per host) is not restarted as one yet."""
    given = [f for f, v in (("--restarts", restarts), ("--stall-after", stall_after), ("--first-step-after", first_step_after),
                            ("--restart-on-stall", restart_on_stall), ("--backoff", backoff), ("--notify", notify))
             if v not in (None, False, 0)]
    if given:
        raise Refused(f"{', '.join(given)}: a group's training (one torchrun per host) is not restarted or watched "
                      f"as one yet; train on one host to have it restarted, or drop them")


def settings(t: Transport, *, restarts: Optional[int] = None, stall_after: Optional[float] = None,
             restart_on_stall: bool = False, backoff: Optional[float] = None,
             notify: Optional[str] = None, first_step_after: Optional[float] = None) -> tuple[Optional[dict], Optional[str]]:
    """(the supervisor's `watch` settings, the notification target) for a training on t's host;
    (None, None) on a Slurm host (not supported there yet: said in a note, or refused when asked for)."""
    h = t.host
    target = notify if notify is not None else h.notify
    if h.is_slurm:  # (Slurm requeues the job: `#SBATCH --requeue`, the batch script resuming; specops watches nothing there)
        asked = [f for f, v in (("--restart-on-stall", restart_on_stall), ("--stall-after", stall_after),
                                ("--first-step-after", first_step_after),
                                ("--backoff", backoff), ("--notify", notify)) if v not in (None, False, 0)]
        if asked:
            raise Refused(f"{', '.join(asked)}: a Slurm job is restarted by Slurm's requeue (--restarts N), not "
                          f"watched by specops: stalls are not found and nobody is told there yet; drop them for {h.name}")
        if h.notify:
            t.note(f"{h.name}: hosts.yaml notify does not apply to a Slurm job yet (nobody is told)")
        return {"restarts": restarts if restarts is not None else h.restarts_default, "slurm": True}, None
    n = restarts if restarts is not None else h.restarts_default
    if restart_on_stall and n == 0:
        raise Refused(f"--restart-on-stall: {h.name} allows no restart (hosts.yaml restarts: 0, or a cpu host's "
                      f"default): give --restarts N")
    watch = {"restarts": n, "stall_after": stall_after, "restart_on_stall": bool(restart_on_stall),
             "first_step_after": first_step_after,
             "backoff": 30.0 if backoff is None else float(backoff)}
    return watch, target


def start_args(watch: Optional[dict]) -> list[str]:
    """specops_host/jobs/job.py start's arguments for them."""
    if not watch:
        return []
    out = ["--watch", "--restarts", str(watch["restarts"]), "--backoff", f"{watch['backoff']:g}"]
    if watch.get("stall_after"):
        out += ["--stall-after", f"{watch['stall_after']:g}"]
    if watch.get("first_step_after"):
        out += ["--first-step-after", f"{watch['first_step_after']:g}"]
    if watch.get("restart_on_stall"):
        out.append("--restart-on-stall")
    return out


def said(watch: Optional[dict], target: Optional[str]) -> str:
    """One line: what the supervisor will do ('' when nothing)."""
    if not watch:
        return ""
    n = watch["restarts"]
    if watch.get("slurm"):
        return (f"restarts: up to {n}, by Slurm's requeue (a preemption, a node failure, `scontrol requeue`), "
                f"each resuming from the last complete checkpoint" if n else "restarts: off (#SBATCH --no-requeue)")
    parts = [f"restarts: up to {n} (back-off {watch['backoff']:g}s, doubling)" if n else "restarts: off",
             "stall: " + (f"no step for {watch['stall_after']:g}s" if watch.get("stall_after")
                          else "no step for 20x the median step time (>= 300s)")
             + (f" (before the first step: {watch['first_step_after']:g}s)" if watch.get("first_step_after") else "")
             + (", then restarted" if watch.get("restart_on_stall") else ", reported"),
             f"notify: {host_notify.shown(target)}" if target else "notify: none"]
    return "; ".join(parts)


# -- complete checkpoints, as a listing shows them (remote/specops_host/ckpt.py writes the markers) --
def checkpoint_split(listing: dict, under: str = "checkpoints/") -> tuple[list[str], list[str]]:
    """(complete checkpoints, incomplete ones: a save that did not finish, or set aside as incomplete-N-<time>)."""
    names = {rel[len(under):].split("/")[0] for rel, e in listing.items()
             if e.kind == "f" and rel.startswith(under) and rel[len(under):].count("/") == 1
             and rel.endswith("/config.json")}
    marked = f"{under}{ckpt.POLICY}" in listing
    done = {n for n in names if not n.startswith(ckpt.SET_ASIDE) and (not marked or f"{under}{n}/{ckpt.MARKER}" in listing)}
    order = lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)  # noqa: E731
    return sorted(done, key=order), sorted(names - done, key=order)


def skipped_note(t: Transport, run_id: str, skipped: list[str], what: str) -> None:
    if skipped:
        t.note(f"{what}: skipped the incomplete checkpoint(s) of {run_id}: {', '.join(skipped)} (a save that did not "
               f"finish: no {ckpt.MARKER})", "warn")
