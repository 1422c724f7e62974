"""Glue between Invoke tasks and the library: host resolution and error reporting."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional

from invoke.exceptions import Exit

from . import inventory
from .errors import SpecopsError
from .transport import Transport, connect


def host_name(c, host: Optional[str]) -> str:
    """--host, else $SPECOPS_HOST, else invoke.yaml's specops.host, else the built-in `local`."""
    cfg = c.config.get("specops", {}) if c is not None else {}
    return host or os.environ.get("SPECOPS_HOST") or (cfg or {}).get("host") or inventory.LOCAL


def hosts_file(c, hosts: Optional[str]) -> Optional[str]:
    cfg = c.config.get("specops", {}) if c is not None else {}
    return hosts or (cfg or {}).get("hosts")


def fail(e: SpecopsError) -> Exit:
    msg = f"specops: {e}"
    if e.detail:
        msg += "\n" + e.detail
    return Exit(msg, code=1)


@contextlib.contextmanager
def errors() -> Iterator[None]:
    try:
        yield
    except SpecopsError as e:
        raise fail(e) from None


@contextlib.contextmanager
def session(c, host: Optional[str], hosts: Optional[str], dry_run: bool = False) -> Iterator[Transport]:
    """Load the inventory, open one connection for the whole task, close it after. With
    dry_run, what would change the host is printed instead of run."""
    with errors():
        h = inventory.load(hosts_file(c, hosts)).get(host_name(c, host))
        t = connect(h)
        t.dry_run = dry_run
        try:
            yield t
            if dry_run:
                print(f"DRY-RUN {h.name}: nothing was changed")
        finally:
            t.close()


def targets(c, host: Optional[str], hosts: Optional[str]) -> list:
    """`--host gpu1`, `gpu1,gpu2` or `@group` -> hosts."""
    with errors():
        return inventory.load(hosts_file(c, hosts)).resolve(host_name(c, host))


def fan(c, host: Optional[str], hosts: Optional[str], title: str, fn, *, describe=str, dry_run: bool = False,
        command_timeout: Optional[float] = None):
    """Run fn(t) on every target host in parallel; one table row per host; Exit if any failed."""
    from . import fanout
    from .ui import console

    hs = targets(c, host, hosts)
    outs = fanout.run_on(hs, fn, dry_run=dry_run, command_timeout=command_timeout)
    console.print(fanout.table(f"{title} ({len(hs)} hosts)", outs, describe))
    with errors():
        fanout.verdict(title, outs)
    return outs


def is_multi(c, host: Optional[str], hosts: Optional[str]) -> bool:
    spec = host_name(c, host)
    return spec.startswith("@") or "," in spec
