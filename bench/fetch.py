"""Benchmark: `specops.fetch.fetch_run` vs plain `rsync -a -e ssh` of a 2 GiB run directory.

    .venv/bin/python bench/fetch.py [--gib 2] [--rounds 2] [--refetch-n 5] [--dir /var/tmp]

Starts the real loopback sshd of tests/rig.py (127.0.0.1 only; as root the rig logs in its
non-root user), makes a bare host venv and pushes remote/, then writes a run directory
runs/bench-fetch/ in the host's workdir: a 2 GiB "checkpoint" of 4 random-byte shards plus
two small JSON files. Each round, after `sync; echo 3 > /proc/sys/vm/drop_caches` (cold, if
permitted) and with the host's hash cache removed (a first fetch of a new checkpoint), (b)
then (a):
  (a) specops: `fetch_run(t, "bench-fetch", DEST)` into a fresh local dir, over an open
      connection (push check, rsync --partial, host sha256 manifest, local sha256 manifest,
      compare), with a per-phase breakdown;
  (b) peer: `rsync -a -e '<the ssh argv specops uses>'` of the same directory into another
      fresh local dir.
Prints both and rsync/specops (target >= 0.9). Then the unchanged re-fetch into the same
dest (the host's hash cache now present, as after any fetch): once cold, then --refetch-n
times warm; target <= 1 s, in process and as the CLI
`inv fetch`. Everything it wrote (host run dir, local dirs, rig dir) is removed at the end.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path[:0] = [os.path.dirname(_HERE), os.path.join(os.path.dirname(_HERE), "tests")]

import argparse  # noqa: E402
import pwd  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bench import _common as C  # noqa: E402
from rig import Rig  # noqa: E402
from specops import fetch as F  # noqa: E402
from specops import inventory  # noqa: E402
from specops.push import push  # noqa: E402
from specops.connection import connect  # noqa: E402

VENV = "~/bench-venv"
WORKDIR = "~/specops-bench"
RUN_ID = "bench-fetch"


def make_run(run_dir: Path, gib: float, owner: pwd.struct_passwd) -> int:
    ckpt = run_dir / "checkpoint"
    ckpt.mkdir()
    rng = np.random.default_rng(0)
    shards, total = 4, int(gib * 2**30)
    for i in range(shards):
        with open(ckpt / f"model-{i + 1:05d}-of-{shards:05d}.safetensors", "wb") as f:
            left = total // shards
            while left > 0:  # 64 MiB at a time: bounded memory
                k = min(left, 64 << 20)
                f.write(rng.bytes(k))
                left -= k
    (ckpt / "config.json").write_text('{"model_type": "eagle3", "hidden_size": 4096}\n')
    (run_dir / "job.json").write_text('{"state": "succeeded"}\n')
    if os.geteuid() == 0:
        for p in run_dir.rglob("*"):
            os.chown(p, owner.pw_uid, owner.pw_gid)
    return sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())


class Phases:
    """Wraps the phases of fetch_run (bench-side only; specops is not changed)."""

    def __init__(self, t):
        self.t, self.times = t, {}
        self._orig = {"push": F.push, "remote_manifest": F.remote_manifest, "local_manifest": F.local_manifest}

    def _wrap(self, name, fn):
        def w(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
        return w

    def __enter__(self):
        for k, fn in self._orig.items():
            setattr(F, k, self._wrap(k, fn))
        self.t.sync_down = self._wrap("rsync (sync_down)", self.t.sync_down)
        self.t.exists = self._wrap("exists", self.t.exists)
        return self

    def __exit__(self, *exc):
        for k, fn in self._orig.items():
            setattr(F, k, fn)
        del self.t.sync_down, self.t.exists

    def line(self) -> str:
        return ", ".join(f"{k} {v:.2f}s" for k, v in self.times.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--refetch-n", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp", help="where the local destinations go")
    a = ap.parse_args()
    rounds, refetch_n = max(1, min(a.rounds, 10)), max(1, min(a.refetch_n, 50))
    need = a.gib * 3 + 1
    if C.free_gib(a.dir) < need:
        raise SystemExit(f"refusing: {a.dir} has {C.free_gib(a.dir):.1f} GiB free; this benchmark needs "
                         f"{need:.1f} GiB (host copy + two local copies)")
    print(f"machine: {C.machine()}; {time.strftime('%Y-%m-%d %H:%M:%S')}")
    rig = Rig()
    if C.free_gib(rig.home) < need:
        shutil.rmtree(rig.root, ignore_errors=True)
        raise SystemExit(f"refusing: {rig.home} has {C.free_gib(rig.home):.1f} GiB free; need {need:.1f} GiB")
    rig.start()
    local = Path(tempfile.mkdtemp(prefix="specops-bench-fetch-", dir=a.dir))
    run_dir = None
    try:
        hf = rig.write_hosts(rig.root / "hosts-bench.yaml", {"bench": rig.host(venv=VENV, workdir=WORKDIR)})
        h = inventory.load(str(hf)).get("bench")
        with connect(h) as t:
            t.check(f"test -x {VENV}/bin/python3 || /usr/bin/python3 -m venv --without-pip {VENV}",
                    "bench venv", timeout=120)
            push(t)
            wd = t.expand(h.workdir_path)
            run_dir = Path(wd) / "runs" / RUN_ID  # the rig's host is this machine
            shutil.rmtree(run_dir, ignore_errors=True)
            t.check(f"mkdir -p {shlex.quote(str(run_dir))}", "mkdir run dir")  # as the host's user
            t0 = time.perf_counter()
            size = make_run(run_dir, a.gib, pwd.getpwnam(rig.user))
            print(f"host run dir {run_dir}: {size / 2**30:.2f} GiB written in {time.perf_counter() - t0:.1f}s")
            hash_cache = run_dir / ".specops-hashes.json"
            ssh_e = shlex.join(t.ssh_command())
            src = f"{h.user}@{h.address}:{run_dir}/"

            s_times, r_times, cold = [], [], None
            for r in range(rounds):
                hash_cache.unlink(missing_ok=True)
                dest_r = local / f"rsync-{r}"
                dest_r.mkdir()
                cold = C.drop_caches()
                dt, p = C.timed_run(["rsync", "-a", "-e", ssh_e, src, f"{dest_r}/"], timeout=600)
                if p.returncode != 0:
                    raise SystemExit(f"rsync failed: {p.stderr[-1000:]}")
                r_times.append(dt)
                got = sum(f.stat().st_size for f in dest_r.rglob("*") if f.is_file())
                print(f"round {r + 1} (b) rsync -a -e ssh [{'cold' if cold else 'warm'}]: {dt:.2f}s "
                      f"({got / 2**30:.2f} GiB)")
                shutil.rmtree(dest_r)
                hash_cache.unlink(missing_ok=True)
                dest_s = local / f"specops-{r}"
                C.drop_caches()
                with Phases(t) as ph:
                    t0 = time.perf_counter()
                    res = F.fetch_run(t, RUN_ID, str(dest_s))
                    s_times.append(time.perf_counter() - t0)
                print(f"round {r + 1} (a) specops fetch_run [{'cold' if cold else 'warm'}]: {s_times[-1]:.2f}s "
                      f"({res['files']} files, {res['bytes'] / 2**30:.2f} GiB, attempts {res['attempts']}); "
                      f"{ph.line()}")
                if r < rounds - 1:
                    shutil.rmtree(dest_s / RUN_ID)

            # Unchanged re-fetch into the last specops dest.
            C.drop_caches()
            with Phases(t) as ph:
                t0 = time.perf_counter()
                F.fetch_run(t, RUN_ID, str(dest_s))
                re_cold = time.perf_counter() - t0
            cold_line = ph.line()
            re_warm = []
            for _ in range(refetch_n):
                t0 = time.perf_counter()
                F.fetch_run(t, RUN_ID, str(dest_s))
                re_warm.append(time.perf_counter() - t0)
            with Phases(t) as ph:
                F.fetch_run(t, RUN_ID, str(dest_s))
            warm_line = ph.line()
            # Diagnostic only (specops is not changed): the same, with TCP_NODELAY on its socket.
            sock = t.conn.transport.sock
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            re_nd = []
            for _ in range(refetch_n):
                t0 = time.perf_counter()
                F.fetch_run(t, RUN_ID, str(dest_s))
                re_nd.append(time.perf_counter() - t0)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)

        env = C.cli_env()
        re_cli = []
        for _ in range(refetch_n):
            dt, p = C.timed_run([str(C.VENV_BIN / "inv"), "fetch", "--host", "bench", "--hosts", str(hf),
                                 "--run-id", RUN_ID, "--dest", str(dest_s)], timeout=300, env=env, cwd=C.REPO)
            assert p.returncode == 0, p.stdout + p.stderr
            re_cli.append(dt)

        S, R, W, L = C.summary(s_times), C.summary(r_times), C.summary(re_warm), C.summary(re_cli)
        print(f"re-fetch unchanged, in process [{'cold' if cold else 'warm'}]: {re_cold:.3f}s; {cold_line}")
        print(f"re-fetch unchanged, in process, warm: {C.fmt(W)}; {warm_line}")
        print(f"re-fetch unchanged, CLI `inv fetch`:  {C.fmt(L)}")
        print(f"re-fetch unchanged, in process, warm, TCP_NODELAY=1 set by the bench (diagnostic): "
              f"{C.fmt(C.summary(re_nd))}")
        ratio = R["median"] / S["median"]
        print("--- summary ---")
        print(f"specops fetch_run median {S['median']:.2f}s ({size / 2**20 / S['median']:.0f} MiB/s); "
              f"rsync median {R['median']:.2f}s ({size / 2**20 / R['median']:.0f} MiB/s)")
        print(f"rsync / specops: {ratio:.2f}  (target >= 0.9: {'MET' if ratio >= 0.9 else 'MISSED'})")
        print(f"unchanged re-fetch: {re_cold:.3f}s cold, {W['median']:.3f}s warm, CLI {L['median']:.3f}s  "
              f"(target <= 1 s: {'MET' if max(re_cold, W['median']) <= 1 else 'MISSED'})")
    finally:
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
        rig.stop()
        shutil.rmtree(rig.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
