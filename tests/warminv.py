"""`inv` from a warm interpreter, for the fast layer's CLI tests (conftest.inv).

Each `inv` a test starts spends about a second of CPU importing invoke, paramiko, pydantic, rich
and specops before it reads its first flag: 89 of them made up most of `make test-fast`'s CPU
time. This server imports all that once (`import tasks`), then forks one child per call: each call
is still its own process, run by invoke's own `inv` program (invoke.main.program) on the real
tasks.py, with the call's argv, environment, working directory, stdin at /dev/null and its
stdout/stderr its own files, and its exit status the process's. What differs from a fresh `inv`:
the modules are imported already, under the server's environment (conftest.INV_ENV, the one
every `inv` of the tests gets), so a variable read at import time (the consoles' COLUMNS and
NO_COLOR) must not differ per call: conftest.inv starts a fresh process for a call that changes one.

The protocol: one JSON request a line on stdin ({"argv", "env", "cwd", "out", "err", and
"no_installs": who, for the fast layer's guard, tests/noinstall.py, in the child}), one JSON
answer a line on stdout ({"pid"} at the fork, {"rc"} at its end).
"""

import atexit
import json
import os
import subprocess
import sys
import traceback

import noinstall  # (beside this file: sys.path[0] until serve() makes it the repo)


def run(req: dict) -> int:
    """In the forked child: the call, as `python -m invoke ARGV` would run it; its exit code."""
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, 0)
    for target, path in ((1, req["out"]), (2, req["err"])):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    if req.get("no_installs"):  # (the fast layer's guard, in this process too)
        subprocess.Popen.__init__ = noinstall.refuse_installs(subprocess.Popen.__init__, req["no_installs"])
    sys.argv = ["inv", *req["argv"]]
    from invoke.main import program

    try:
        program.run(sys.argv)
        return 0
    except SystemExit as e:  # (what the interpreter does with it at exit)
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001  (what the interpreter would print, as a fresh `inv` would)
        traceback.print_exc()
        return 1


def serve() -> None:
    sys.path[0] = os.getcwd()  # (as `python -m invoke` in the repo: tasks.py importable, tests/ not)
    import tasks  # noqa: F401  (the import the calls share)
    from invoke.main import program  # noqa: F401

    answers = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        answers.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run(req)
            finally:
                atexit._run_exitfuncs()  # (as the interpreter's exit would)
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except Exception:  # noqa: BLE001  (a closed stream: the exit goes on)
                        pass
                os._exit(code)
        answers.write(json.dumps({"pid": pid}) + "\n")
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
