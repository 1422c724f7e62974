"""The screen's primitives and the connection's sinks (specops.views renders results on them).

A line (rich on a terminal, plain text in a pipe), the live line (on a terminal one line kept in
place: a host script's latest progress, the trainer's latest figures), the connection's notes,
and a followed job's log: quiet by default (its progress lines and the trainer's figures, read
by specops.progress; the whole log stays in the run's output.log), streamed byte for byte when
verbose (`-v`/`--verbose` on the tasks that follow a job, or SPECOPS_VERBOSE=1).

In a pipe the quiet view prints lines, a kind of line (a wait's progress, the trainer's figures)
BURST at once and then one every LINE_EVERY seconds at most: a wait shows at once, then a line
every half minute; a host's faster progress lines (every 15 s by default, SPECOPS_PROGRESS_EVERY)
or a trainer logging every step would scroll the figures a user came for out of sight.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import sys
import time
from typing import Optional

from rich.console import Console
from rich.markup import escape

from specops.host.transport import Note
from specops.progress import Event, LogReader, accuracies

console = Console(stderr=False, highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

#: a pipe's quiet view: at most one line of a kind every LINE_EVERY seconds, after BURST at once
LINE_EVERY = 30.0
BURST = 3


def is_terminal() -> bool:
    return console.is_terminal and not os.environ.get("SPECOPS_PLAIN")


def line(text: str, style: str = "") -> None:
    """One line of output (markup-free text; style only on a terminal)."""
    if is_terminal():
        console.print(f"[{style}]{escape(text)}[/]" if style else escape(text))
    else:
        print(text, flush=True)


# -- verbose or quiet -----------------------------------------------------------------------
_verbose = False


def set_verbose(on: bool) -> None:
    """-v/--verbose: followed job logs streamed whole, every progress line shown."""
    global _verbose
    _verbose = bool(on)


_dry = False


def set_dry(on: bool) -> None:
    """The task is a dry run: every progress line says so (DRY-RUN), not only the plan's."""
    global _dry
    _dry = bool(on)


def verbose() -> bool:
    return _verbose or os.environ.get("SPECOPS_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on")


class Throttle:
    """A token bucket per kind of line: BURST lines at once, then one every LINE_EVERY seconds."""

    def __init__(self, every: float = LINE_EVERY, burst: int = BURST):
        self.every, self.burst = every, burst
        self.kinds: dict[str, tuple[float, float]] = {}

    def allow(self, kind: str, burst: Optional[int] = None) -> bool:
        now, cap = time.monotonic(), self.burst if burst is None else burst
        tokens, then = self.kinds.get(kind, (cap, now))
        tokens = min(cap, tokens + (now - then) / self.every)
        if tokens < 1:
            self.kinds[kind] = (tokens, now)
            return False
        self.kinds[kind] = (tokens - 1, now)
        return True


_throttle = Throttle()


def kind_of(text: str) -> str:
    """A line's kind: what it says before its first number (`vLLM server starting: 15s; its log: ...`
    and `... 30s; its log: ...` are one kind, `vLLM server healthy after 41s` another)."""
    return re.split(r"\d", text, maxsplit=1)[0]


# -- the live line --------------------------------------------------------------------------
#: the live line on a terminal (a rich Status: a spinner and the latest progress line)
_live = None


def live_line(text: Optional[str]) -> None:
    """On a terminal, one line kept in place (rich): text replaces what it said; None ends it.
    Other output is printed above it while it runs. In a pipe: nothing (the caller prints lines)."""
    global _live
    if text is None:
        if _live is not None:
            _live.stop()
        _live = None
    elif _live is None:
        _live = console.status(escape(text), spinner="dots")
        _live.start()
    else:
        _live.update(escape(text))


atexit.register(live_line, None)  # (a task that ends or fails mid-step leaves no live line behind)


def progress(text: str) -> None:
    """A progress line: the live line on a terminal; in a pipe a line (quiet: throttled per kind)."""
    if is_terminal():
        live_line(f"[specops] {text}")
    elif verbose() or _throttle.allow(kind_of(text)):
        print(f"[specops] {text}", flush=True)


def note(n: Note) -> None:
    """Progress lines from the library (through the connection), on stderr when they are not
    results: plan lines of a dry run, warnings, finished steps. A host script's progress lines
    (kind "progress": every ~15 s) are one live line on a terminal, lines in a pipe (progress())."""
    if n.kind == "progress":
        progress(n.text)
        return
    if n.kind in ("done", "warn"):  # (a step ended or went wrong: its live line goes)
        live_line(None)
    if n.kind == "plan" or (_dry and n.kind in ("info", "done")):  # (a dry run's every line: a "would" or DRY-RUN)
        line(f"DRY-RUN {n.host}: {n.text}")
    elif n.kind == "warn" and is_terminal():
        err_console.print(f"[yellow]{escape('[specops] ' + n.text)}[/]")
    elif n.kind == "warn":
        print(f"[specops] {n.text}", file=sys.stderr, flush=True)
    elif n.kind == "done":
        line(n.text, "red" if n.text.startswith("✗") else "green")
    else:
        line(f"[specops] {n.text}")


@contextlib.contextmanager
def transfer_progress(label: str):
    """A progress callback (done_bytes, total_bytes) drawing a bar with the total rate and ETA on a
    terminal; None on a pipe (nothing drawn)."""
    if not is_terminal():
        yield None
        return
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
                  TransferSpeedColumn(), TimeRemainingColumn(), console=err_console, transient=True) as bar:
        task = bar.add_task(escape(label), total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total or None)


@contextlib.contextmanager
def progress_to_stderr():
    """Progress lines and followed logs on stderr while a task's result goes to stdout as JSON (so
    `inv plan --json | jq` reads one document)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


# -- followed job logs ----------------------------------------------------------------------
_held = b""  # (a payload frame begun in one chunk of a followed log, its end still to come)


def unframed_chunk(chunk: bytes) -> bytes:
    """A followed log's chunk without the host scripts' payload frames (machine-readable JSON for
    the laptop, never for people), also when a frame spans chunks."""
    global _held
    from specops.contract import BEGIN, END

    begin, end = BEGIN.encode(), END.encode()
    data, out, _held = _held + chunk, b"", b""
    while (i := data.find(begin)) >= 0:
        j = data.find(end, i)
        if j < 0:
            _held = data[i:]
            return out + data[:i]
        out, data = out + data[:i], data[j + len(end):].removeprefix(b"\n")
    k = next((k for k in range(len(begin) - 1, 1, -1) if data.endswith(begin[:k])), 0)  # (a frame's start, cut)
    if k:
        _held, data = data[-k:], data[:-k]
    return out + data


def log(chunk: bytes) -> None:
    """A followed job log, byte for byte (but the payload frames)."""
    live_line(None)
    sys.stdout.buffer.write(unframed_chunk(chunk))
    sys.stdout.flush()


_reader = LogReader()


def job_log(chunk: bytes) -> None:
    """The connection's sink for a followed job's log: byte for byte when verbose, else its
    progress lines and the trainer's figures (specops.progress)."""
    if verbose():
        log(chunk)
        return
    for ev in _reader.feed(chunk):
        show_event(ev)


def show_event(ev: Event) -> None:
    if ev.kind == "progress":
        progress(ev.text)
        return
    rec = ev.record or {}
    if any(k.startswith("val/") for k in rec):  # (an epoch's validation: always a line of its own)
        live_line(None)
        line(figures(rec), "cyan")
    elif is_terminal():
        live_line(figures(rec))
    elif _throttle.allow("train figures", burst=1):
        print(figures(rec), flush=True)


def figures(rec: dict) -> str:
    """One metric record of the trainer as one line: step, epoch, loss, accuracy per draft
    position, tokens/s (validation: after which epoch, its loss and accuracies)."""
    n = rec.get("epochs")
    ep = rec.get("epoch")
    of = f"/{n:.0f}" if n else ""
    if any(k.startswith("val/") for k in rec):
        acc = accuracies(rec, "val")
        return (f"[train] validation after epoch {ep + 1:.0f}{of}: loss {rec.get('val/loss_epoch', float('nan')):.4g}"
                + (f", accuracy by position {' '.join(f'{a:.3f}' for a in acc)}" if acc else "")) \
            if ep is not None else "[train] validation: " + f"loss {rec.get('val/loss_epoch', float('nan')):.4g}"
    acc = accuracies(rec)
    tps = rec.get("profile/tokens_per_s")
    return (f"[train] step {rec.get('global_step', 0):.0f}" + (f", epoch {ep + 1:.0f}{of}" if ep is not None else "")
            + f": loss {rec.get('train/loss', float('nan')):.4g}"
            + (f", accuracy by position {' '.join(f'{a:.3f}' for a in acc)}" if acc else "")
            + (f", {tps:,.0f} tokens/s" if tps is not None else ""))
