"""Glue between Invoke tasks and the library: the task decorator (short flags that never clash),
host resolution, one connection per task (with the views' sinks), one host or a group handled
in one place, and error reporting."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import shlex
from typing import Any, Callable, Iterator, Optional

import invoke
from invoke.exceptions import Exit

from specops import inventory, views
from specops.args import flags as numbers
from specops.contract import unframed
from specops.host.connection import connect
from specops.errors import SpecopsError
from specops.host.transport import Note, NotDone, Transport

#: the only short flags, the same in every task
SHORT = {"follow": "f", "run-id": "r", "dry-run": "n", "verbose": "v"}


#: --dry-run's help, the same in every task that changes a host
DRY_RUN = "print the commands and transfers that would change the host; change nothing"
#: -v/--verbose's help, the same in every task that follows a job or a server
VERBOSE = ("stream the job's whole log (the trainer's per-step lines, vLLM's own log) and every progress line; "
           "default: a live line per stage and the figures that matter (the log stays in the run's output.log)")


class Task(invoke.Task):
    """A task whose options get no automatic short flags (they clashed: `-h` meant --host in one
    task and --hosts in another, `--rdzv-port` got `-`): only SHORT's, everywhere alike; whose
    numeric flags reach it checked (specops.args), a bad one refused in one line (exit 2); and,
    `changes=True` (a task that changes hosts), a --dry-run flag the body never sees: the executor
    (executing()) takes it, and every connection the task opens plans its changes; `streams=True`
    (a task that follows a job or a server), a -v/--verbose flag the body never sees either: the
    views stream the job's whole log instead of its progress lines and figures."""

    def __init__(self, body, *args, changes: bool = False, streams: bool = False, **kwargs):
        self.changes, self.streams = changes, streams
        extra = {**({"dry_run": DRY_RUN} if changes else {}), **({"verbose": VERBOSE} if streams else {})}
        kwargs["help"] = {**(kwargs.get("help") or {}), **extra}
        super().__init__(body, *args, **kwargs)

    def argspec(self, body):
        sig = super().argspec(body)
        added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False)
                 for name, on in (("dry_run", self.changes), ("verbose", self.streams)) if on]
        return sig.replace(parameters=[*sig.parameters.values(), *added]) if added else sig

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
        if kwargs.pop("verbose", False):  # (-v: followed job logs streamed whole, every progress line)
            views.set_verbose(True)
        kwargs = numbers(self.body.__name__, kwargs)
        with executing(bool(kwargs.pop("dry_run", False))):
            return super().__call__(*args, **kwargs)


class _Run:
    """The task being run: whether it is a dry run, and the connections it opened (a plain
    object, not a context variable: a group's connections open in worker threads)."""
    dry = False
    opened: list = []


@contextlib.contextmanager
def executing(dry: bool) -> Iterator[None]:
    """The executor of one task: it alone decides to run or show. Under --dry-run every connection
    the task opens plans its changes; at the end each host's plan is said (views.dry_run_done), and
    a dry run that stops where what follows reads what it did not make (NotDone) says that line
    first, exit 0."""
    _Run.dry, _Run.opened = dry, []
    views.set_dry(dry)
    try:
        try:
            yield
        except NotDone as e:
            views.note(Note(e.host or "?", "plan", str(e)))
        if dry:
            for t in _Run.opened:
                views.dry_run_done(t.host.name, t.plan_of())
    finally:
        _Run.dry, _Run.opened = False, []
        views.set_dry(False)


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
    return Exit(unframed(msg).rstrip("\n"), code=getattr(e, "code", 1))  # (a payload frame is never for people)


@contextlib.contextmanager
def errors() -> Iterator[None]:
    try:
        yield
    except SpecopsError as e:
        raise fail(e) from None


def open_host(h: inventory.Host, *, hints: str = "", **kw) -> Transport:
    """A connection whose notes and followed logs go to the views (a log quiet unless -v), planning
    its changes when the task is a dry run (the executor's; kept to say its plan at the end)."""
    t = connect(h, dry_run=_Run.dry, on_note=views.note, on_log=views.job_log, hint_args=hints, **kw)
    _Run.opened.append(t)
    return t


@contextlib.contextmanager
def session(c, host: Optional[str], hosts: Optional[str]) -> Iterator[Transport]:
    """Load the inventory, open one connection for the whole task, close it after."""
    with errors():
        h = inventory.load(hosts_file(c, hosts)).get(host_name(c, host))
        t = open_host(h, hints=hint_args(c, host, hosts))
        try:
            yield t
        finally:
            t.close()


def targets(c, host: Optional[str], hosts: Optional[str]) -> list:
    """`--host gpu1`, `gpu1,gpu2` or `@group` -> hosts."""
    with errors():
        return inventory.load(hosts_file(c, hosts)).resolve(host_name(c, host))


def is_multi(c, host: Optional[str]) -> bool:
    spec = host_name(c, host)
    return spec.startswith("@") or "," in spec


def hint_maker(c, host: Optional[str], hosts: Optional[str]) -> Callable[[str], str]:
    """`inv TASK` with the --host/--hosts the user gave (a group's hints)."""
    args = hint_args(c, host, hosts)
    return lambda task: f"inv {task}" + (f" {args}" if args else "")


def said(text: str) -> None:
    """A library progress line (a callback's) as the views show notes."""
    views.line(f"[specops] {text}")


#: what a task hands on_hosts itself (the rest of its parameters are its flags)
WHERE_ARGS = ("c", "host", "hosts")


def passed(scope: dict) -> dict:
    """A task's flags from its locals(), passed to its operation whole, each under its own name (a
    task of many flags, `train`, spells them once in its signature, not again in its call)."""
    return {k: v for k, v in scope.items() if k not in WHERE_ARGS}


def on_hosts(c, host: Optional[str], hosts: Optional[str], op: Callable[..., Any], /, *, title: str = "",
             across: Optional[Callable[..., Any]] = None, group: bool = True, rank: Optional[int] = None,
             here: bool = False, json_: bool = False, progress: str = "", **kw) -> Any:
    """Run a task: op(t, **kw) on the host, or on each host of a group in parallel; the value is
    shown by its type (shown.view_of: views, a group's row, a judge that fails the task, JSON).
    First the operation's own flags check (op.refuse(**kw), before anything connects). A group:
    `across(hosts, connect=..., **kw)` when the operation has its own several-host form (group/),
    else op on each host (a failing host is a row; the task then exits non-zero naming each);
    group=False: one host only; rank: that node of a group. here: with no --host, op(None, **kw)
    on this machine. progress: a transfer's label (op gets on_progress, a bar on a terminal).
    Under --dry-run the executor shows no value (they are stand-ins), only those a dry run reads
    whole (View.dry), and says each host's plan at the end (executing())."""
    from specops import shown
    from specops.group import fanout

    multi = not (here and host is None) and is_multi(c, host) and (group or rank is not None)
    with errors():
        check = getattr(across if multi and across else op, "refuse", None)
        if check is not None:
            check(**({"host": host} if here else {}), **kw)
        if here and host is None:
            return _show(shown, shown.Where("", hint_maker(c, host, hosts)), op(None, **kw), json_)
        if multi and rank is None:
            hs = targets(c, host, hosts)
            value = (across(hs, connect=_group_connect(hosts), **kw) if across else
                     _on_each(hs, op, title or op.__name__, hosts, kw))
            return _show(shown, shown.Where("", hint_maker(c, host, hosts)), value, json_)
        if multi:
            host = fanout.pick(targets(c, host, hosts),
                               rank or 0).name  # (rank given: a group without one returned above)
    with session(c, host, hosts) as t, errors():
        with views.progress_to_stderr() if json_ else contextlib.nullcontext():
            if progress:
                with views.transfer_progress(f"{progress} from {t.host.name}") as bar:
                    value = op(t, on_progress=bar, **kw)
            else:
                value = op(t, **kw)
        return _show(shown, shown.Where(t.host.name, t.hint, t), value, json_)


def _show(shown, where, value, json_: bool) -> Any:
    view = shown.view_of(value)
    if value is None or (_Run.dry and not view.dry):
        return value
    if json_:
        views.as_json(view.json(value))
    elif view.show is not None:
        view.show(where, value)
    if view.judge is not None:
        view.judge(where.name, value)
    return value


def _group_connect(hosts: Optional[str]) -> Callable[..., Transport]:
    def connect(h, **kw):
        return open_host(h, hints=f"--host {shlex.quote(h.name)}" + (f" --hosts {shlex.quote(hosts)}" if hosts else ""),
                         **kw)
    return connect


def _on_each(hs: list, op: Callable[..., Any], title: str, hosts: Optional[str], kw: dict):
    """op on every host of a group in parallel, each value judged where it ran: one Outcome per host."""
    from specops import shown
    from specops.group import fanout

    def one(t: Transport):
        value = op(t, **kw)
        judge = shown.view_of(value).judge
        if value is not None and judge is not None and not _Run.dry:
            judge(t.host.name, value)
        return value

    outs = fanout.Outcomes(fanout.run_on(hs, one, connect=_group_connect(hosts)))
    outs.title = title
    if _Run.dry:  # (stand-ins: each host's plan is what there is to show)
        plans = {t.host.name: t.plan_of() for t in _Run.opened}
        outs[:] = [dataclasses.replace(o, value=plans.get(o.host, o.value)) if o.ok else o for o in outs]
    return outs


def on_targets(c, host: Optional[str], hosts: Optional[str], op: Callable[..., Any], /, **kw) -> Any:
    """An operation of several hosts as one (a group, or one `scheduler: slurm` host): op(hosts,
    connect=..., **kw), its value shown by its type."""
    from specops import shown

    with errors():
        return _show(shown, shown.Where("", hint_maker(c, host, hosts)),
                     op(targets(c, host, hosts), connect=open_host, **kw), False)


def hosts_table(c, hosts: Optional[str], *, json_: bool = False) -> None:
    """`inv hosts`: the inventory's hosts (and the built-in local) and groups."""
    with errors():
        views.hosts(inventory.load(hosts_file(c, hosts)), json_=json_)
