"""Glue between Invoke tasks and the library: the task decorator (short flags that never clash),
host resolution, one connection per task (with the views' sinks), one host or a group handled
in one place, and error reporting."""

from __future__ import annotations

import contextlib
import os
import shlex
from typing import Any, Callable, Iterator, Optional

import invoke
from invoke.exceptions import Exit

from specops import inventory, views
from specops.args import flags as numbers
from specops.host.connection import connect
from specops.errors import SpecopsError
from specops.host.transport import Transport, planned

#: the only short flags, the same in every task
SHORT = {"follow": "f", "run-id": "r", "dry-run": "n", "verbose": "v"}


class Task(invoke.Task):
    """A task whose options get no automatic short flags (they clashed: `-h` meant --host in one
    task and --hosts in another, `--rdzv-port` got `-`): only SHORT's, everywhere alike; and whose
    numeric flags reach it checked (specops.args), a bad one refused in one line (exit 2)."""

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        long = opts["names"][0]
        opts["names"] = [long] + ([SHORT[long]] if long in SHORT and SHORT[long] not in taken_names else [])
        if opts.get("kind") in (int, float):  # (invoke's own int()/float() would be a traceback)
            opts["kind"] = str
        return opts

    def __call__(self, *args, **kwargs):
        # every numeric flag converted and range-checked, and an empty --host refused, before the
        # body connects to anything
        refuse_empty_where(kwargs)
        term_as_interrupt()
        if kwargs.get("verbose"):  # (-v: followed job logs streamed whole, every progress line)
            views.set_verbose(True)
        return super().__call__(*args, **numbers(self.body.__name__, kwargs))


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def term_as_interrupt() -> None:
    """SIGTERM (a `kill`, a closing terminal's SIGHUP) is handled as Ctrl-C is: the transfer pools
    end their rsync/ssh processes, a stage says what is in place and how to resume (no orphans)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _interrupted)


def task(*args, **kwargs):
    """invoke's @task with specops' Task class."""
    kwargs.setdefault("klass", Task)
    return invoke.task(*args, **kwargs)


#: the flags that name where a task acts: given empty (`--host "$H"` with H unset), refused, never
#: read as "not given" (which would pick another host)
WHERE = {"host": ("host", "NAME", "SPECOPS_HOST"), "hosts": ("inventory file", "FILE", "SPECOPS_HOSTS")}


def _empty(v: Optional[str]) -> bool:
    return v is not None and not str(v).strip(" ,")


def refuse_empty_where(kwargs: dict) -> None:
    for name, (what, arg, _) in WHERE.items():
        if _empty(kwargs.get(name)):
            raise Exit(f"specops: --{name} {kwargs[name]!r}: no {what} given: pass --{name} {arg} "
                       f"(an unset variable in a script?)", code=2)
    for name, (what, arg, env) in WHERE.items():
        if name in kwargs and kwargs[name] is None and _empty(os.environ.get(env)):
            raise Exit(f"specops: ${env} is set but empty: no {what} given: pass --{name} {arg} or unset {env}",
                       code=2)


def host_name(c, host: Optional[str]) -> str:
    """--host, else $SPECOPS_HOST, else invoke.yaml's specops.host, else the built-in `local`."""
    cfg = c.config.get("specops", {}) if c is not None else {}
    refuse_empty_where({"host": host})
    return host or os.environ.get("SPECOPS_HOST") or (cfg or {}).get("host") or inventory.LOCAL


def hosts_file(c, hosts: Optional[str]) -> Optional[str]:
    cfg = c.config.get("specops", {}) if c is not None else {}
    return hosts or (cfg or {}).get("hosts")


def hint_args(c, host: Optional[str], hosts: Optional[str]) -> str:
    """The --host/--hosts a hint must repeat so that, typed as shown, it acts on the same host."""
    parts = []
    if host:
        parts.append(f"--host {shlex.quote(host)}")
    if hosts:
        parts.append(f"--hosts {shlex.quote(hosts)}")
    return " ".join(parts)


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


def open_host(h: inventory.Host, *, dry_run: bool = False, hints: str = "", **kw) -> Transport:
    """A connection whose notes and followed logs go to the views (a log quiet unless -v)."""
    return connect(h, dry_run=dry_run, on_note=views.note, on_log=views.job_log, hint_args=hints, **kw)


@contextlib.contextmanager
def session(c, host: Optional[str], hosts: Optional[str], dry_run: bool = False) -> Iterator[Transport]:
    """Load the inventory, open one connection for the whole task, close it after."""
    with errors():
        h = inventory.load(hosts_file(c, hosts)).get(host_name(c, host))
        t = open_host(h, dry_run=dry_run, hints=hint_args(c, host, hosts))
        try:
            yield t
            if dry_run:
                views.dry_run_done(h.name, t.plan_of())
        finally:
            t.close()


def targets(c, host: Optional[str], hosts: Optional[str]) -> list:
    """`--host gpu1`, `gpu1,gpu2` or `@group` -> hosts."""
    with errors():
        return inventory.load(hosts_file(c, hosts)).resolve(host_name(c, host))


def result(value: Any) -> Any:
    """A library call's value for the task to show: None for a dry run's Plan (the session's last
    line renders that: views.dry_run_done)."""
    return None if planned(value) else value


def is_multi(c, host: Optional[str]) -> bool:
    spec = host_name(c, host)
    return spec.startswith("@") or "," in spec


def _judged(fn, judge):
    def run(t):
        value = fn(t)
        if value is not None and not planned(value):
            judge(t.host.name, value)
        return value
    return run


def over(c, host: Optional[str], hosts: Optional[str], title: str, fn: Callable[[Transport], Any], *,
         show: Optional[Callable[[Transport, Any], None]] = None, describe: Callable[[Any], str] = str,
         judge: Optional[Callable[[str, Any], None]] = None, dry_run: bool = False, as_json: bool = False,
         group: bool = True) -> Any:
    """The one place a task meets one host or several: fn(t) on the host, then show(t, value) (or
    its JSON), then judge(host name, value) (raises to fail the task); or on every host of a group
    in parallel: judge inside each host's run, one row per host (`describe` of each value), a
    failing host is a row, and the task exits non-zero naming each. Returns the value(s). Under
    --dry-run a value is the host's Plan: the session's last line renders it (views.dry_run_done),
    nothing is shown or judged."""
    from specops.group import fanout

    if not (group and is_multi(c, host)):
        with session(c, host, hosts, dry_run) as t:
            value = fn(t)
            if value is not None and not planned(value):
                if as_json:
                    views.as_json(value)
                elif show is not None:
                    show(t, value)
                if judge is not None:
                    judge(t.host.name, value)
            return value
    if judge is not None:
        fn = _judged(fn, judge)
    hs = targets(c, host, hosts)
    outs = fanout.run_on(hs, fn, dry_run=dry_run,
                         connect=lambda h, **kw: open_host(h, hints=f"--host {shlex.quote(h.name)}"
                                                           + (f" --hosts {shlex.quote(hosts)}" if hosts else ""), **kw))
    if as_json:
        views.as_json(outs)
    else:
        views.outcomes(f"{title} ({len(hs)} hosts)", outs, describe)
    with errors():
        fanout.verdict(title, outs)
    return outs
