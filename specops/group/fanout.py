"""Run one operation on several hosts in parallel (a thread pool over connections).

Each host gets its own connection, a connect timeout (the host's `connect_timeout`) and a
command timeout; one host failing never hides the others' results: a failing host is a value
(an Outcome with ok False), and the caller decides the exit code (all must succeed).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional

from specops.host.connection import connect as _connect
from specops.errors import SpecopsError
from specops.inventory import Host
from specops.host.transport import Transport


@dataclass
class Outcome:
    host: str
    ok: bool
    value: Any = None
    error: str = ""


def run_on(hosts: list[Host], fn: Callable[[Transport], Any], *, command_timeout: Optional[float] = None,
           dry_run: bool = False, connect: Callable[..., Transport] = _connect) -> list[Outcome]:
    def one(h: Host) -> Outcome:
        try:
            t = connect(h, dry_run=dry_run, default_timeout=command_timeout)
        except SpecopsError as e:
            return Outcome(h.name, False, error=str(e))
        try:
            return Outcome(h.name, True, fn(t))
        except SpecopsError as e:
            return Outcome(h.name, False, error=str(e) + (f"\n{e.detail}" if e.detail else ""))
        except Exception as e:  # noqa: BLE001 - one host's bug must not hide the others
            return Outcome(h.name, False, error=f"{type(e).__name__}: {e}")
        finally:
            t.close()

    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return list(pool.map(one, hosts))


def connect_all(hosts: list[Host], dry_run: bool = False, connect: Callable[..., Transport] = _connect
                ) -> list[Transport]:
    """One connection per host, opened in parallel; all or none (a host that cannot be reached
    closes the others and names every unreachable host)."""
    with ThreadPoolExecutor(len(hosts)) as pool:
        futs = [pool.submit(connect, h, dry_run=dry_run) for h in hosts]
    out, errs = [], []
    for h, f in zip(hosts, futs):
        try:
            out.append(f.result())
        except SpecopsError as e:
            errs.append(f"{h.name}: {e}")
    if errs:
        for t in out:
            t.close()
        raise SpecopsError(f"cannot reach every node: {'; '.join(errs)}")
    return out


def verdict(what: str, outcomes: list[Outcome]) -> None:
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise SpecopsError(f"{what}: {len(bad)} of {len(outcomes)} host(s) failed: "
                           + "; ".join(f"{o.host}: {o.error.splitlines()[0]}" for o in bad))
