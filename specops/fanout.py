"""Run one operation on several hosts in parallel (a thread pool over SSH connections).

Each host gets its own connection, a connect timeout (the host's `connect_timeout`) and a
command timeout; one host failing never hides the others' results; the caller gets one row
per host and decides the exit code (all must succeed).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional

from rich.table import Table

from .errors import SpecopsError
from .inventory import Host
from .transport import Transport, connect


@dataclass
class Outcome:
    host: str
    ok: bool
    value: Any = None
    error: str = ""


def run_on(hosts: list[Host], fn: Callable[[Transport], Any], *, command_timeout: Optional[float] = None,
           dry_run: bool = False) -> list[Outcome]:
    def one(h: Host) -> Outcome:
        try:
            t = connect(h)
        except SpecopsError as e:
            return Outcome(h.name, False, error=str(e))
        t.dry_run = dry_run
        t.default_timeout = command_timeout
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


def table(title: str, outcomes: list[Outcome], describe: Callable[[Any], str] = str) -> Table:
    tab = Table(title=title)
    for col in ("host", "", "result"):
        tab.add_column(col, overflow="fold")
    for o in outcomes:
        tab.add_row(o.host, "[green]✓[/]" if o.ok else "[red]✗[/]",
                    describe(o.value) if o.ok else o.error.splitlines()[0])
    return tab


def verdict(what: str, outcomes: list[Outcome]) -> None:
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise SpecopsError(f"{what}: {len(bad)} of {len(outcomes)} host(s) failed: "
                           + "; ".join(f"{o.host}: {o.error.splitlines()[0]}" for o in bad))
