"""inspect-data: prove the real data layout (remote/inspect_data.py), show it, judge it."""

from __future__ import annotations

import json
from typing import Optional

from rich.table import Table

from .errors import SpecopsError
from .push import push
from .remote_exec import run_script
from .transport import Transport
from .ui import console


def inspect(t: Transport, path: str, *, sample: int = 8, verifier: Optional[str] = None,
            layers: Optional[int] = None) -> dict:
    push(t)
    args = ["--path", t.expand(path), "--sample", str(sample)]
    if verifier:
        args += ["--verifier", t.expand(verifier)]
    if layers is not None:
        args += ["--layers", str(layers)]
    return run_script(t, "inspect_data", args, changes=False)


def render(res: dict, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(res, indent=1))
        return
    console.print(f"[bold]{res['path']}[/]: format {res.get('format') or 'unknown'}, "
                  f"{res.get('rows', '?')} rows, {res.get('files', 0)} files, "
                  f"{res.get('bytes', 0) / 2**20:.1f} MiB, {res.get('tokens', '?')} tokens, "
                  f"hidden {res.get('hidden_size')} (verifier {res.get('verifier_hidden_size')}), "
                  f"stored layers {res.get('stored_layers')} (expected {res.get('expected_layers')}); "
                  f"{res.get('seconds')}s")
    if res.get("keys"):
        tab = Table(title="tensors")
        for col in ("key", "dtype", "ndim", "files"):
            tab.add_column(col)
        for k in res["keys"]:
            tab.add_row(k["key"], k["dtype"], str(k["ndim"]), str(k["files"]))
        console.print(tab)
    if res.get("sampled") and isinstance(res["sampled"][0], dict):
        tab = Table(title=f"{len(res['sampled'])} file(s) fully loaded")
        for col in ("row", "file", "seq", "loss_mask sum", "|h| mean"):
            tab.add_column(col)
        for s in res["sampled"]:
            tab.add_row(str(s["row"]), s["file"], str(s["seq"]), str(s["loss_mask_sum"]), str(s["abs_mean"]))
        console.print(tab)
    for w in res.get("warnings", []):
        console.print(f"[yellow]! {w['file']}: {w['what']}[/]")
    for v in res.get("violations", [])[:20]:
        console.print(f"[red]✗ {v['file']}: {v['what']}[/]")
    console.print("[green]verdict: OK[/]" if res["ok"] else f"[red]verdict: {res['n_violations']} violation(s)[/]")


def verdict(res: dict) -> None:
    if not res["ok"]:
        v = res["violations"][0]
        more = f" (+{res['n_violations'] - 1} more)" if res["n_violations"] > 1 else ""
        raise SpecopsError(f"inspect-data: {v['file']}: {v['what']}{more}")
