"""check: the preflight run by the host venv's interpreter (remote/check.py), shown as a table."""

from __future__ import annotations

import json

from rich.table import Table

from . import paths
from .errors import SpecopsError
from .push import push
from .remote_exec import run_script
from .transport import Transport
from .ui import console


def check(t: Transport, *, min_free_gb: float = 5.0) -> dict:
    h = t.host
    push(t)  # the scripts that run are always the laptop's current ones
    args = ["--venv", t.expand(h.venv_path), "--profile", f"{paths.PROFILES}/{h.profile}.txt",
            "--kind", h.profile, "--min-free-gb", str(min_free_gb)]
    if h.gpus is not None:
        args += ["--gpus", str(h.gpus)]
    return run_script(t, "check", args, changes=False)


def failing(res: dict) -> list[dict]:
    return [r for r in res["rows"] if r["hard"] and r["ok"] is False]


def render(name: str, res: dict, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(res, indent=1))
        return
    tab = Table(title=f"check {name}", show_lines=False)
    for col in ("", "check", "value", "hint"):
        tab.add_column(col)
    for r in res["rows"]:
        mark = {True: "[green]✓[/]", False: "[red]✗[/]" if r["hard"] else "[yellow]![/]", None: "·"}[r["ok"]]
        tab.add_row(mark, r["name"], r["value"], r["hint"])
    console.print(tab)


def verdict(name: str, res: dict) -> None:
    bad = failing(res)
    if bad:
        lines = "\n".join(f"  ✗ {r['name']}: {r['value']} -> {r['hint']}" for r in bad)
        raise SpecopsError(f"check {name}: {len(bad)} hard check(s) failed", detail=lines)
