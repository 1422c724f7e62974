"""Rich console output shared by the tasks."""

from __future__ import annotations

import contextlib
import os
import time

from rich.console import Console

console = Console(stderr=False, highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def step(what: str):
    """A spinner while ``what`` runs, then a tick (or a cross) with the elapsed time."""
    t0 = time.time()
    live = console.is_terminal and not os.environ.get("CI")
    try:
        if live:
            with console.status(f"{what} ..."):
                yield
        else:
            yield
    except BaseException:
        console.print(f"[red]✗[/] {what} ({time.time() - t0:.1f}s)")
        raise
    console.print(f"[green]✓[/] {what} ({time.time() - t0:.1f}s)")


def report_kept(kept: list[dict], want_key: str, where: str) -> None:
    """Profile packages an existing venv keeps at its own version (never upgraded)."""
    from rich.markup import escape

    same = [k for k in kept if k[want_key].endswith(f"=={k['have']}")]
    if same:
        console.print(f"  {len(same)} profile package(s) already {where} at the pinned version")
    for k in kept:
        if k not in same:
            console.print(escape(f"  kept {k['package']} {k['have']} (profile: {k[want_key]}"
                                 + ("" if k.get("satisfies", False) else "; never upgraded") + ")"))
