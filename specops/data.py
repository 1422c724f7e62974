"""The data stage on a host: convert-data (and prepare-data / extract, which build on jobs)."""

from __future__ import annotations

from .errors import SpecopsError
from .push import push
from .remote_exec import run_script
from .transport import Transport


def convert(t: Transport, src: str, dst: str) -> dict:
    push(t)
    res = run_script(t, "convert_data", ["--src", t.expand(src), "--dst", t.expand(dst)])
    if not res.get("ok"):
        raise SpecopsError(f"convert-data on {t.host.name}: {res.get('error')}")
    return res
