"""inspect-data: prove the real data layout (remote/specops_host/data/inspect_data.py) and judge it."""

from __future__ import annotations

from typing import Optional

from dataclasses import dataclass

from specops.args import Refused, refusing
from specops.errors import SpecopsError
from specops.host.remote_exec import run_script
from specops.host.transport import Transport
from specops.payloads import Converted, Inspection


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


def inspect_path(t: Transport, path: Optional[str] = None, *, sample: int = 8, verifier: Optional[str] = None,
                 layers: Optional[int] = None, seed: Optional[int] = None) -> Inspection:
    """`inv inspect-data`: inspect() of path (default <workdir>/data/default) against the verifier
    (default the host's, else the one recorded at extraction)."""
    return inspect(t, path or f"{t.workdir}/data/default", sample=sample, verifier=verifier or t.host.verifier,
                   layers=layers, seed=seed)


@dataclass
class Conversion:
    """convert(): the conversion's payload, then the inspection of what it wrote."""
    converted: Converted
    inspection: Inspection


def _convert_flags(src: Optional[str] = None, dst: Optional[str] = None, **_) -> None:
    if not src or not dst:
        raise Refused("convert-data needs --src OLD_DIR and --dst NEW_DIR (paths on the host)")


@refusing(_convert_flags)
def convert(t: Transport, src: str, dst: str, verifier: Optional[str] = None) -> Conversion:
    """`inv convert-data`: legacy v0.3 data converted (ops.data.convert), then inspected."""
    from specops.ops import data

    done = data.convert(t, src, dst)
    return Conversion(done, inspect(t, done.dst or dst, sample=8, verifier=verifier or t.host.verifier))
