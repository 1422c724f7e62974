"""connect(host, dry_run=...): the one way to get a connection to a host (SSH or this machine).
Keyword arguments are the connection's own (transport.Transport): dry_run, on_note, on_log,
default_timeout, hint_args."""

from __future__ import annotations

from specops.inventory import Host
from specops.host.local import LocalTransport
from specops.host.ssh import SSHTransport
from specops.host.transport import Transport


def connect(host: Host, *, forward_agent: bool = False, **kw) -> Transport:
    if host.transport == "local":
        return LocalTransport(host, **kw)
    t = SSHTransport(host, connect_timeout=host.connect_timeout, forward_agent=forward_agent, **kw)
    t.open()
    return t
