"""The fast layer changes nothing on the machine: the programs that install, and the guard that
refuses them before they start (conftest.fast_layer_guard in each fast test, tests/warminv.py in
each `inv` it forks for one). Standard library only: the warm server imports it too."""

import os
import re
import shlex
import shutil


class InstallInFastLayer(AssertionError):
    pass


#: the programs that install (or raise privileges to): a fast test starts none of them
INSTALLERS = re.compile(r"(apt|apt-get|aptitude|dpkg|sudo|pip[0-9.]*|uv|conda)")


def split(line: str) -> list:
    try:
        return shlex.split(line)
    except ValueError:  # (a python -c program, say: its quotes need not be a shell's)
        return line.split()


def installer(args, env: dict | None = None) -> str | None:
    """What in a subprocess's command line would install something: an installer by name (also
    inside a shell string), `python -m pip`/`uv`, `python -c` code that imports pip, or
    .ci/system-deps without --check while its PATH leads to this machine's apt-get; None when nothing."""
    raw = [os.fsdecode(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else list(args))]
    for code in (c for flag, c in zip(raw, raw[1:]) if flag == "-c"):  # (python -c: pip driven from inside)
        if re.search(r"^\s*(import|from)\s+pip\b", code, re.M):
            return "pip (imported by python -c)"
    words = [w for a in raw for w in (split(a) if " " in a.strip() else [a])]
    for i, w in enumerate(words):
        name = os.path.basename(w)
        if INSTALLERS.fullmatch(name):
            return name
        if w == "-m" and words[i + 1:i + 2] in (["pip"], ["uv"]):
            return f"-m {words[i + 1]}"
        path = (env or os.environ).get("PATH")
        if name == "system-deps" and "--check" not in words and shutil.which("apt-get", path=path) \
                and shutil.which("apt-get", path=path) == shutil.which("apt-get"):
            return "system-deps without --check"
    return None


def refuse_installs(popen, who: str):
    """subprocess.Popen.__init__ that raises InstallInFastLayer, naming who, for a command line
    `installer` objects to; else the real one (popen)."""

    def no_installs(self, args, *a, **k):
        what = installer(args, k.get("env"))
        if what:
            raise InstallInFastLayer(f"{who} is in the fast layer, which changes nothing on the machine, but "
                                     f"starts {what}: {args!r}")
        popen(self, args, *a, **k)

    return no_installs

