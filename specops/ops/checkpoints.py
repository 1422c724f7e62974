"""Checkpoints named by one rule, the laptop's side: a checkpoint's spelling checked before anything
connects (spelling: a plain name, or a word such as best), then the host's resolve() asked
(remote/specops_host/ckpt.py run as a module: of()), whose verdict every task that takes a
checkpoint follows: `inv evaluate --checkpoint` (the host's --plan), `--checkpoints`, `inv fetch
--checkpoint`, a plain `inv fetch` (complete checkpoints only, unless --incomplete) and the demo's
wrong-layers control. Inside the run's checkpoints/, complete by the marker rule: `3/`, `./3`, a
path, another run's checkpoint or a half-written one is never served or fetched.
"""

from __future__ import annotations

from typing import Sequence

from specops.args import Refused
from specops.contract import name_problem
from specops.errors import SpecopsError
from specops.host.remote_exec import run_script
from specops.host.transport import Transport
from specops.ops.jobs import run_path
from specops.payloads import Checkpoints
from specops_host import ckpt

BEST = ckpt.BEST


class NoRun(SpecopsError):
    """The run folder is not on the host."""


def spelling(flag: str, which: str, run_id: str | None, words: Sequence[str] = (BEST,)) -> None:
    """A checkpoint named as the run's checkpoints/ names it (a plain name: letters, digits, '.', '_',
    '-'), or one of `words`; else Refused in one line, before anything connects."""
    if which in words:
        return
    why = name_problem(which)
    if why:
        raise Refused(f"{flag} {which!r}: no checkpoint {which!r} in run {run_id or '(the newest)'}: a checkpoint is "
                      f"named as its folder in the run's checkpoints/ ({why}), such as 2, or "
                      f"{' or '.join(words)} (nothing was started)")


def of(t: Transport, run_id: str, names: Sequence[str] = (), what: str = "checkpoints") -> Checkpoints:
    """The run's checkpoints by the host's rule (complete, incomplete with why, aliases) and each of
    `names` resolved (Checkpoints.resolved: name and path, or reason and why)."""
    args = ["--run-dir", run_path(t, run_id)]
    for n in names:
        args += ["--checkpoint", str(n)]
    res = run_script(t, "ckpt", args, changes=False, model=Checkpoints)
    if not res.ok:
        raise (NoRun if res.get("no_run") else SpecopsError)(f"{what}: run {run_id} on {t.host.name}: {res.error}")
    return res


def refusal(what: str, run_id: str, host: str, r: dict, complete: Sequence[str]) -> str:
    """The one line of a checkpoint the host would not resolve (r: one of Checkpoints.resolved)."""
    listed = ", ".join(complete) or "none"
    asked, reason = r.get("asked"), r.get("reason")
    if reason == "incomplete":
        return (f"{what}: checkpoint {asked!r} of run {run_id} on {host} is incomplete ({r.get('why')}); "
                f"complete ones: {listed}")
    if reason == "none":
        return f"{what}: run {run_id} on {host} has no complete checkpoint yet ({r.get('error')}): train it first"
    if reason == "spelling":
        return f"{what}: no checkpoint {asked!r} in run {run_id} on {host}: {r.get('error')}"
    return f"{what}: no checkpoint {asked!r} in run {run_id} on {host} (have: {listed})"


def resolved(t: Transport, run_id: str, names: Sequence[str], what: str) -> tuple[list[str], Checkpoints]:
    """Each name resolved by the host (its folder's name), with the run's checkpoints; the first that
    cannot be: SpecopsError, one line."""
    cp = of(t, run_id, names, what)
    bad = next((r for r in cp.resolved if r.get("reason")), None)
    if bad:
        raise SpecopsError(refusal(what, run_id, t.host.name, bad, cp.complete))
    return [r["name"] for r in cp.resolved], cp


def skipped_note(t: Transport, run_id: str, cp: Checkpoints, what: str) -> None:
    if cp.incomplete:
        t.note(f"{what}: skipped the incomplete checkpoint(s) of {run_id}: "
               + "; ".join(f"{n} ({why})" for n, why in cp.incomplete.items()), "warn")


def several(t: Transport, run_id: str, which: str, what: str = "evaluate --checkpoints") -> list[str]:
    """`all` (the run's complete checkpoints, the incomplete ones said in a note) or names such as
    0,2 (in the order given, once each), each resolved by the host."""
    if which.strip() == "all":
        cp = of(t, run_id, (), what)
        if not cp.complete:
            raise SpecopsError(f"evaluate: run {run_id} on {t.host.name} has no checkpoint yet (none complete under "
                               f"checkpoints/{'; incomplete: ' + ', '.join(cp.incomplete) if cp.incomplete else ''}): "
                               f"train it first")
        skipped_note(t, run_id, cp, what)
        return list(cp.complete)
    want = list(dict.fromkeys(x.strip() for x in which.split(",") if x.strip()))
    if not want:
        listed = ", ".join(of(t, run_id, (), what).complete) or "none"
        raise SpecopsError(f"{what} {which!r}: give all or names such as 0,2 (have: {listed})")
    return resolved(t, run_id, want, what)[0]
