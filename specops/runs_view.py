"""How runs are shown on the laptop: the status table and the logs follower."""

from __future__ import annotations

from rich.table import Table

from . import jobs
from .transport import Transport
from .ui import err_console


def age(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def status_table(host: str, rows: list[dict]) -> Table:
    tab = Table(title=f"runs on {host}")
    for col in ("run id", "kind", "state", "age", "pid", "GPU MiB", "last line"):
        tab.add_column(col, overflow="fold")
    for j in rows:
        gpu = j.get("gpu_mib")
        tab.add_row(j["run_id"], j.get("kind", ""), j["state"], age(j.get("age_s", 0)), str(j.get("pid", "")),
                    "" if gpu is None else str(gpu), (j.get("last_line") or "")[:100])
    return tab


def follow(t: Transport, run_id: str, *, until_end: bool = True) -> int | None:
    """Print the log as it grows; Ctrl-C detaches (the job keeps running)."""
    reconnect = getattr(t, "reopen", None)
    try:
        _, code = jobs.follow(t, run_id, reconnect=reconnect, until_end=until_end)
    except KeyboardInterrupt:
        err_console.print(f"\n\\[specops] detached from {run_id}; it keeps running on {t.host.name} "
                          f"(`inv logs -f --run-id {run_id}` re-attaches, `inv stop` stops it)")
        return None
    return code
