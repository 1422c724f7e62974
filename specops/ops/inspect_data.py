"""inspect-data: prove the real data layout (specops_host/data/inspect_data.py) and judge it."""

from __future__ import annotations

from typing import Optional

from specops.errors import SpecopsError
from specops.host.remote_exec import run_script
from specops.host.transport import Transport
from specops.payloads import Inspection


def inspect(t: Transport, path: str, *, sample: int = 8, verifier: Optional[str] = None,
            layers: Optional[int] = None, seed: Optional[int] = None) -> Inspection:
    """specops_host/data/inspect_data.py's verdict; `sample` files loaded fully, picked by `seed` (default:
    another each run; the result says which, and how many files were loaded fully)."""
    args = ["--path", t.expand(path), "--sample", str(sample)] + (["--seed", str(seed)] if seed is not None else [])
    if verifier:
        args += ["--verifier", t.expand(verifier)]
    if layers is not None:
        args += ["--layers", str(layers)]
    res = run_script(t, "data.inspect_data", args, changes=False, model=Inspection)
    if not res.ok and "violations" not in res:  # refused (bad arguments): one line
        raise SpecopsError(f"inspect-data on {t.host.name}: {res.error}")
    return res


def verdict(res: Inspection) -> None:
    if not res.ok:
        v = res.violations[0]
        more = f" (+{res.n_violations - 1} more)" if res.n_violations > 1 else ""
        raise SpecopsError(f"inspect-data: {v['file']}: {v['what']}{more}")
