"""uv for the profile's install where it fits (stdlib; used by install/profile.py).

uv (a well-kept installer, on PyPI) installs the same pinned wheels into the same venv several
times faster than pip: it fetches and unpacks in parallel and links from its cache. It is no
part of the venv: `pip install --target <workdir>/.specops/uv` puts its binary beside the
workdir once (UV_VERSION). It gets pip's own configuration on this host (`pip config list`: the
index, extra indexes, find-links, constraints; the same keys from PIP_* variables), pip's
resolution rule (the best match over every index) and the profile's `--no-deps`, so it installs
what pip would. Whatever goes wrong with uv (no uv to be had, an index it cannot reach, any
failure) pip installs the same group as before: uv only ever makes the install faster. A
wheelhouse (air-gapped hosts) and a top-up of an existing venv stay with pip.
"""

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

UV_VERSION = "0.13.9"
#: pip's settings uv gets, as (pip's key, uv's flag, several values in one setting)
SETTINGS = (("index-url", "--index-url", False), ("extra-index-url", "--extra-index-url", True),
            ("find-links", "--find-links", True), ("constraint", "--constraint", True))
DOWNLOADING = re.compile(r"^\s*Downloading (\S+) \(([\d.]+)(B|KiB|MiB|GiB)\)")
DOWNLOADED = re.compile(r"^\s*Downloaded (\S+)\s*$")
UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3}


def where(workdir):
    return Path(workdir) / ".specops" / "uv"


def ensure(workdir, log):
    """The uv binary under the workdir, pip-installed there at UV_VERSION if it is not; None when
    it cannot be had (pip then installs as before)."""
    d = where(workdir)
    exe = d / "bin" / "uv"
    if exe.is_file() and os.access(exe, os.X_OK) and version(exe) == UV_VERSION:
        return exe
    with open(log, "a") as f:
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--upgrade",
               "--target", str(d), f"uv=={UV_VERSION}"]
        f.write(f"\n$ {shlex.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    return exe if rc == 0 and exe.is_file() and version(exe) == UV_VERSION else None


def version(exe):
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.match(r"uv (\S+)", out)
    return m.group(1) if m else None


def pip_settings():
    """pip's configuration on this host, {key: [values]} for SETTINGS' keys: `pip config list`
    (global, user, site files and PIP_* variables; a later scope wins, as in pip)."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"^[^.]*\.([\w-]+)='(.*)'$", line.strip())
        if m and m.group(1) in {k for k, _, _ in SETTINGS}:
            found[m.group(1)] = m.group(2)
    for key, _, _ in SETTINGS:  # (pip config list shows PIP_* as :env:, but a variable set here wins)
        env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            found[key] = env
    return {k: v.split() for k, v in found.items()}


def args(settings, extra_index=None):
    """uv's flags for pip's settings (+ a profile group's own index, last, as pip gets it)."""
    out = []
    for key, flag, several in SETTINGS:
        for v in settings.get(key, [])[:None if several else 1]:
            out += [flag, v]
    if extra_index:
        out += ["--extra-index-url", extra_index]
    return out + ["--index-strategy", "unsafe-best-match"]  # (pip's rule: the best version over every index)


class Bytes:
    """A reader of uv's output for a Progress: the large wheels it says it downloads (with their
    sizes) and each one it says it has."""

    def __init__(self, progress):
        self.progress = progress

    def feed(self, line):
        m = DOWNLOADING.match(line)
        if m:
            self.progress.downloading(m.group(1), float(m.group(2)) * UNITS[m.group(3)])
        m = DOWNLOADED.match(line)
        if m:
            self.progress.downloaded(m.group(1))


def install(exe, reqs_file, log, *, no_deps, extra_index=None, progress=None):
    """`uv pip install` of the requirements file into this venv; uv's exit code."""
    from specops_host.install import pipprogress

    cmd = [str(exe), "pip", "install", "--python", sys.executable, *args(pip_settings(), extra_index),
           *(["--no-deps"] if no_deps else []), "-r", str(reqs_file)]
    env = {**os.environ, "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(where_cache()),
           "NO_COLOR": "1", "UV_NO_PROGRESS": "1"}
    return pipprogress.run(cmd, log, progress, env=env, reader=Bytes(progress) if progress else None)


def where_cache():
    """uv's cache: beside pip's (~/.cache/uv), on the filesystem of the venv mostly: linked, not copied."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "uv"


class Ticker:
    """A Progress for a step with no count of its own (pipprogress.run's lines): its elapsed seconds."""

    def __init__(self, what):
        self.what, self.t0 = what, time.time()

    def feed(self, line):
        pass

    def finish(self):
        pass

    run = finish  # (pipprogress.run calls it when the command exits non-zero)

    def line(self):
        return f"install: {self.what}: {time.time() - self.t0:.0f}s"


#: left to compile at import, if ever imported (a quarter of the cpu profile's 23,500 files): the
#: packages' own tests, and transformers' model folders other than auto and llama (the host loads
#: a model's own through AutoConfig; vLLM and speculators bring their own model code)
SKIP_COMPILE = r"/(tests?|testing)/|/transformers/models/(?!(auto|llama)/)"


def compile_bytecode(log, progress=True):
    """Byte-compile the venv's site-packages (stdlib compileall, every core; files already
    compiled are skipped), as pip does at install and uv does not: without it every import of
    torch and vLLM compiles them again wherever Python may not write __pycache__
    (PYTHONDONTWRITEBYTECODE), about twice the CPU seconds of a vLLM server's start on a CPU
    (bench/results/first-ten-minutes.md). Its seconds (the exit code is not a failure: a few
    packages ship files of other Python versions, which compileall reports and skips)."""
    from specops_host.install import pipprogress
    import sysconfig

    t0 = time.time()
    cmd = [sys.executable, "-m", "compileall", "-q", "-j", "0", "-x", SKIP_COMPILE, sysconfig.get_paths()["purelib"]]
    pipprogress.run(cmd, log, Ticker("byte-compiling the installed packages") if progress else None)
    return round(time.time() - t0, 1)
