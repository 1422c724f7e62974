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
