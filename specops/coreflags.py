"""A task's flag written before the task's name (`inv --hosts F hosts`): invoke reads what comes before
the first task as its own flags, which have no --host or --hosts, and says only `No idea what '--hosts'
is!`. tasks.py calls misplaced() as it loads (invoke loads it before it parses the tasks' flags): one
line saying where the flag goes, exit 2 (nothing else printed: not a view)."""

from __future__ import annotations

import sys
from typing import Iterable, Optional, Sequence

from invoke.exceptions import Exit

#: the task flags every task takes, and the environment variable each defaults to
TASK_FLAGS = {"--host": "SPECOPS_HOST", "--hosts": "SPECOPS_HOSTS"}
#: invoke's own flags that take a value (`-r DIR`): the value is not a task's name
CORE_VALUED = {"-c", "--collection", "-f", "--config", "-r", "--search-root", "-D", "--list-depth", "-F",
               "--list-format", "--print-completion-script", "-h", "--help", "-l", "--list"}


def misplaced(argv: Sequence[str], tasks: Iterable[str]) -> Optional[str]:
    """The line for a --host/--hosts given before the first task's name in argv (argv[0]: the program), or
    None. Shell completion (--complete) is left alone."""
    names, args = set(tasks), list(argv[1:])
    if "--complete" in args:
        return None
    found, i = None, 0
    while i < len(args) and args[i] not in names:
        flag, eq, value = args[i].partition("=")
        nxt = args[i + 1] if i + 1 < len(args) else None
        if flag in TASK_FLAGS and found is None:
            found = (flag, value or (nxt if nxt is not None and nxt not in names else "VALUE"))
        i += 2 if flag in CORE_VALUED and not eq and nxt not in names else 1  # (a core flag's value: not a flag)
    task = args[i] if i < len(args) else "TASK"
    if found:
        flag, value = found
        return (f"{flag} {value}: a task's flag, written before the task's name (where invoke reads only its own "
                f"flags): put it after the task, `inv {task} {flag} {value}`, or set {TASK_FLAGS[flag]}={value}")
    return None


def refuse_misplaced(tasks: Iterable[str], argv: Optional[Sequence[str]] = None) -> None:
    """misplaced()'s line, where it has one: invoke's Exit (invoke prints it on stderr, exit 2)."""
    why = misplaced(sys.argv if argv is None else argv, tasks)
    if why:
        raise Exit(f"specops: {why}", code=2)
