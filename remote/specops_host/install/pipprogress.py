"""A pip install that is never silent (stdlib; used by install/profile.py).

pip says what it collects (each wheel, with its size) and then, once, which packages it
installs; installing them (unpacking torch alone takes a while) it says nothing more. The
progress comes from that work itself: the wheels pip named and their sizes, and each package's
`.dist-info` as pip writes it into this venv. Every contract.PROGRESS_EVERY seconds of the run one line
on stdout, `[specops] install: ...` (run_script hands such lines to the laptop as they come).
"""

import os
import re
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path
from urllib.parse import unquote

from specops_host import contract

WHEEL = re.compile(r"^\s*(?:Downloading|Using cached|Processing|File was already downloaded|Saved) "
                   r"(\S+\.whl)(?: \(([\d.]+) (B|kB|KB|MB|GB)\))?")
INSTALLING = re.compile(r"^Installing collected packages: (.+)$")
SATISFIED = re.compile(r"^Requirement already satisfied: ")
UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def size(n):
    """Bytes as pip writes them (1.9 MB)."""
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n:.0f} B"


class Progress:
    """What the pip runs of one install have done so far. total: the packages the install brings
    (an exact profile's requirements), None when pip's resolver decides it."""

    def __init__(self, total=None):
        self.total = total
        self.earlier = 0  # packages installed by the earlier pip runs of this install
        self.earlier_bytes = 0
        self.t0 = time.time()
        self.sites = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
        self.lock = threading.Lock()  # (feed in pip's reader, line in the reporter thread)
        self.run()

    def run(self, tool="pip"):
        """A new pip (or uv) run begins."""
        self.tool = tool
        self.wheels = {}  # (name, version) -> bytes, in pip's order
        self.installing = None  # how many packages pip said it installs
        self.satisfied = 0  # requirements pip found installed already
        self.fetching = {}  # the large wheels uv said it downloads: name -> bytes
        self.fetched = set()  # those it said it has

    def expect(self, pins):
        """A uv run of these exact pins (name, version) begins: uv names no wheel as it goes, the
        venv's .dist-info say which are in place."""
        with self.lock:
            self.run("uv")
            self.wheels = {(norm(n), v): 0 for n, v in pins}
            self.installing = len(self.wheels)

    def downloading(self, name, nbytes):
        with self.lock:
            self.fetching[name] = nbytes

    def downloaded(self, name):
        with self.lock:
            self.fetched.add(name)

    def feed(self, line):
        """One line of pip's output."""
        with self.lock:
            self._feed(line)

    def _feed(self, line):
        m = WHEEL.match(line)
        if m:
            path = m.group(1)
            name, version = unquote(Path(path).name).split("-")[:2]
            n = float(m.group(2)) * UNITS[m.group(3)] if m.group(2) else (
                os.path.getsize(path) if os.path.isfile(path) else 0)
            self.wheels[(norm(name), version)] = n
            return
        if SATISFIED.match(line):
            self.satisfied += 1
            return
        m = INSTALLING.match(line)
        if m:
            self.installing = len([p for p in m.group(1).split(",") if p.strip()])

    def in_place(self):
        """The wheels of this run whose package is installed in the venv now (its .dist-info)."""
        have = set()
        for site in self.sites:
            try:
                names = os.listdir(site)
            except OSError:
                continue
            for d in names:
                if d.endswith(".dist-info"):
                    name, _, version = d[:-len(".dist-info")].partition("-")
                    have.add((norm(name), version))
        return [w for w in self.wheels if w in have]

    def finish(self):
        """This pip run ended: what it installed counts as done."""
        with self.lock:
            self._finish()

    def _finish(self):
        done = self.in_place() if self.installing else []
        self.earlier += self.satisfied + len(done)
        self.earlier_bytes += sum(self.wheels[w] for w in done)
        self.run()

    def line(self):
        """The progress line now: packages installed of the total, their bytes, what pip does."""
        with self.lock:
            return self._line()

    def _line(self):
        took = f"{time.time() - self.t0:.0f}s"
        if self.tool == "uv":
            n = self.earlier + len(self.in_place())
            got = sum(b for w, b in self.fetching.items() if w in self.fetched)
            return (f"install: {took}: {n} of {self.total or self.earlier + self.installing} packages in place; "
                    f"uv is installing" + (f": {len(self.fetched)} of the {len(self.fetching)} large wheels it names "
                                           f"downloaded ({size(got)} of {size(sum(self.fetching.values()))})"
                                           if self.fetching else ""))
        got = sum(self.wheels.values())
        if self.installing is None:  # collecting: what pip found so far
            total = f" of {self.total}" if self.total else ""
            return (f"install: {took}: {self.earlier + self.satisfied}{total} packages in place; pip is collecting: "
                    f"{len(self.wheels)} wheel(s), {size(got)}")
        done = self.in_place()
        n = self.earlier + self.satisfied + len(done)
        total = self.total or self.earlier + self.satisfied + self.installing
        nbytes = self.earlier_bytes + sum(self.wheels[w] for w in done)
        return (f"install: {took}: {n} of {total} packages in place "
                f"(wheels: {size(nbytes)} of {size(self.earlier_bytes + got)}); pip is installing")


def pip(args, log, progress=None, every=None):
    """`python -m pip install ARGS`, its output appended to log; with progress (a Progress) one
    line every `every` seconds while it runs. Returns pip's exit code."""
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    return run(cmd, log, progress, every=every)


def run(cmd, log, progress=None, *, every=None, env=None, reader=None):
    """An installer's command, its output appended to log; with progress one line every `every`
    seconds while it runs (`reader.feed` gets each output line: default progress.feed). Its exit code."""
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        if progress is None:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=env).returncode
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", bufsize=1, env=env)
        stop, every, feed = threading.Event(), every or contract.PROGRESS_EVERY, (reader or progress).feed

        def report():
            while not stop.wait(every):
                contract.progress(progress.line())

        th = threading.Thread(target=report, daemon=True)
        th.start()
        try:
            for line in proc.stdout:
                f.write(line)
                f.flush()
                feed(line.rstrip("\n"))
            rc = proc.wait()
        finally:
            stop.set()
            th.join()
            if proc.poll() is None:
                proc.kill()
        if rc == 0:
            progress.finish()
        else:  # (what it left half done is pip's to finish)
            progress.run()
        return rc
