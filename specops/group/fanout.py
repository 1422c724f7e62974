"""Several hosts as one Group: connections opened in parallel, one operation on each in parallel.

Each host gets its own connection, a connect timeout (the host's `connect_timeout`) and a
command timeout; one host failing never hides the others' results: a failing host is a value
(an Outcome with ok False), and the caller decides the exit code (all must succeed).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Optional

from specops.host.connection import connect as _connect
from specops.args import Refused
from specops.errors import SpecopsError
from specops.inventory import Host
from specops.host.transport import NotDone, Transport


@dataclass
class Outcome:
    host: str
    ok: bool
    value: Any = None
    error: str = ""
    #: under --dry-run: where the host's dry run stopped (value: its Plan)
    stopped: str = ""


class Group:
    """Several hosts as one (Fabric's Group / GroupResult): `open` connects to every host in
    parallel, `run(fn)` calls fn(t) on each connection in parallel and returns one Outcome per
    host in the group's order (a failing host is a value), `close` closes them all (a `with`
    block does). Each connection is the caller's `connect` (cli.open_host: its notes reach the
    views as they come, each line naming its host).

    all_or_none (the default): a host that cannot be reached closes the others and raises,
    naming every unreachable host (a multi-node run needs every node); otherwise the unreachable
    hosts are kept as failed outcomes and `run` goes on with the rest."""

    def __init__(self, hosts: list[Host], transports: dict[str, Transport], unreachable: dict[str, str]):
        self.hosts = list(hosts)
        self._by_name = transports
        self.unreachable = unreachable

    @classmethod
    def open(cls, hosts: list[Host], *, connect: Callable[..., Transport] = _connect,
             command_timeout: Optional[float] = None, all_or_none: bool = True) -> "Group":
        kw = {"default_timeout": command_timeout} if command_timeout is not None else {}
        with ThreadPoolExecutor(max_workers=min(32, len(hosts)) or 1) as pool:
            futs = [pool.submit(connect, h, **kw) for h in hosts]
        opened, errs = {}, {}
        for h, f in zip(hosts, futs):
            try:
                opened[h.name] = f.result()
            except SpecopsError as e:
                errs[h.name] = str(e)
        g = cls(hosts, opened, errs)
        if errs and all_or_none:
            g.close()
            raise SpecopsError(f"cannot reach every node: {'; '.join(f'{n}: {e}' for n, e in errs.items())}")
        return g

    @property
    def transports(self) -> list[Transport]:
        """The open connections, in the group's order."""
        return [self._by_name[h.name] for h in self.hosts if h.name in self._by_name]

    def run(self, fn: Callable[[Transport], Any]) -> list[Outcome]:
        """fn(t) on every connection in parallel: one Outcome per host, in the group's order (a host
        whose dry run stopped: its Plan as the value, `stopped` the line where it stopped)."""
        def one(h: Host) -> Outcome:
            if h.name in self.unreachable:
                return Outcome(h.name, False, error=self.unreachable[h.name])
            t = self._by_name[h.name]
            try:
                return Outcome(h.name, True, fn(t))
            except NotDone as e:
                return Outcome(h.name, True, t.plan_of(), stopped=str(e))
            except SpecopsError as e:
                return Outcome(h.name, False, error=str(e) + (f"\n{e.detail}" if e.detail else ""))
            except Exception as e:  # noqa: BLE001 - one host's bug must not hide the others
                return Outcome(h.name, False, error=f"{type(e).__name__}: {e}")

        with ThreadPoolExecutor(max_workers=min(32, len(self.hosts)) or 1) as pool:
            return list(pool.map(one, self.hosts))

    def close(self) -> None:
        for t in self._by_name.values():
            t.close()

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_on(hosts: list[Host], fn: Callable[[Transport], Any], *, command_timeout: Optional[float] = None,
           connect: Callable[..., Transport] = _connect) -> list[Outcome]:
    """fn on every host that can be reached (an unreachable one is a failed outcome): one Group,
    opened and closed. Each connection is connect(host) (cli.open_host: the task's --dry-run)."""
    with Group.open(hosts, connect=connect, command_timeout=command_timeout,
                    all_or_none=False) as g:
        return g.run(fn)


def verdict(what: str, outcomes: list[Outcome]) -> None:
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise SpecopsError(f"{what}: {len(bad)} of {len(outcomes)} host(s) failed: "
                           + "; ".join(f"{o.host}: {o.error.splitlines()[0]}" for o in bad))


class Outcomes(list):
    """run_on()'s outcomes as a task's value: one row per host (`title` names the operation)."""
    title: str = ""


def pick(hosts: list[Host], rank: int) -> Host:
    """A group's node by rank (`inv logs --rank`)."""
    if not 0 <= int(rank) < len(hosts):
        raise Refused(f"--rank {rank}: the group has ranks 0..{len(hosts) - 1}")
    return hosts[int(rank)]
