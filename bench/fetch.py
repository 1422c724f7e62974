"""Benchmark: `specops.ops.fetch.fetch_run` vs plain `rsync -a -e ssh` of a 2 GiB run directory.

    .venv/bin/python bench/fetch.py [--gib 2] [--rounds 2] [--refetch-n 5] [--dir /var/tmp]

Starts the real loopback sshd of tests/rig.py (127.0.0.1 only; as root the rig logs in its
non-root user), makes a bare host venv and pushes specops_host/, then writes a run directory
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

Latency mode (issue 17: the laptop and the GPU host are rarely on one LAN):

    .venv/bin/python bench/fetch.py --latency [--delays 0,25,50] [--mib 1024] [--rounds 1] [--direct]

puts bench/delay_proxy.py (127.0.0.1 only, D ms added to each direction per chunk, in order)
in front of the same sshd, and for each D fetches two layouts of --mib MiB each: a run of four
equal shards (4 x 256 MiB at the default) and one file (1 GiB), each against `rsync -a` with
one stream through the same proxy, in the same run (rsync first, then specops; caches dropped
before each pass and the host's hash cache removed: a first fetch). The specops figure is the
whole `connect()` + `fetch_run()` (connection, push check, listing, link measurement, streams,
the host's sha256 manifest, verification). --direct adds a pass without the proxy (the LAN); --diag adds, without delay,
rsync with AES-GCM and specops with OpenSSH's default cipher (specops' streams prefer AES-GCM: the share of
the LAN figure that comes from the cipher).
Prints each pass, the stream count specops chose and why, and rsync/specops per layout and
delay (targets: >= 3 at 25 ms each way, a 50 ms round trip; >= 1.0 without delay).
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
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from bench import _common as C  # noqa: E402
from rig import Rig  # noqa: E402
from specops.ops import fetch as F  # noqa: E402
from specops import inventory  # noqa: E402
from specops.host.push import push  # noqa: E402
from specops.host.connection import connect  # noqa: E402

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
        self._orig = {"remote_manifest": F.remote_manifest, "local_manifest": F.local_manifest}

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
        self.t.ensure_pushed = self._wrap("push", self.t.ensure_pushed)
        self._run = F.transfer.Download.run
        F.transfer.Download.run = self._wrap("transfer", self._run)
        return self

    def __exit__(self, *exc):
        for k, fn in self._orig.items():
            setattr(F, k, fn)
        F.transfer.Download.run = self._run
        del self.t.sync_down, self.t.exists, self.t.ensure_pushed

    def line(self) -> str:
        return ", ".join(f"{k} {v:.2f}s" for k, v in self.times.items())


def write_random(path: Path, size: int, rng) -> None:
    with open(path, "wb") as f:
        left = size
        while left > 0:  # 64 MiB at a time: bounded memory
            k = min(left, 64 << 20)
            f.write(rng.bytes(k))
            left -= k


def make_layouts(wd: Path, mib: int, owner: pwd.struct_passwd) -> dict[str, Path]:
    """runs/bench-lat-shards: 4 equal shards + config.json + job.json; runs/bench-lat-one: one file."""
    rng = np.random.default_rng(1)
    out = {}
    shards = wd / "runs" / "bench-lat-shards"
    (shards / "checkpoint").mkdir(parents=True)
    for i in range(4):
        write_random(shards / "checkpoint" / f"model-{i + 1:05d}-of-00004.safetensors", (mib << 20) // 4, rng)
    (shards / "checkpoint" / "config.json").write_text('{"model_type": "eagle3", "hidden_size": 4096}\n')
    (shards / "job.json").write_text('{"state": "succeeded"}\n')
    out[f"4 x {mib // 4} MiB"] = shards
    one = wd / "runs" / "bench-lat-one"
    one.mkdir(parents=True)
    write_random(one / "model.safetensors", mib << 20, rng)
    out[f"1 x {mib} MiB"] = one
    if os.geteuid() == 0:
        for d in out.values():
            for p in [d, *d.rglob("*")]:
                os.chown(p, owner.pw_uid, owner.pw_gid)
    return out


def latency(a) -> int:
    from bench.delay_proxy import DelayProxy
    from specops.host import transfer

    delays = [float(x) for x in a.delays.split(",") if x.strip()]
    rounds = max(1, min(a.rounds, 5))
    mib = max(64, min(a.mib, 8192)) // 4 * 4
    need = mib * 2 * 3 / 1024 + 1
    if C.free_gib(a.dir) < need:
        raise SystemExit(f"refusing: {a.dir} has {C.free_gib(a.dir):.1f} GiB free; need {need:.1f} GiB")
    print(f"machine: {C.machine()}; {time.strftime('%Y-%m-%d %H:%M:%S')}; load {os.getloadavg()[0]:.1f}")
    print(f"command: .venv/bin/python bench/fetch.py --latency --delays {a.delays} --mib {mib} --rounds {rounds}"
          + (" --direct" if a.direct else "") + (" --diag" if a.diag else ""))
    rig = Rig().start()
    local = Path(tempfile.mkdtemp(prefix="specops-bench-lat-", dir=a.dir))
    layouts: dict[str, Path] = {}
    rows = []
    try:
        host_pub = Path(f"{rig.host_key}.pub").read_text().split()
        kh = rig.root / "known_hosts-bench"

        def host_for(port: int):
            with open(kh, "a") as f:
                f.write(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
            hf = rig.write_hosts(rig.root / f"hosts-lat-{port}.yaml", {"bench": rig.host(
                venv=VENV, workdir=WORKDIR, port=port, known_hosts=str(kh))})
            return inventory.load(str(hf)).get("bench")

        h0 = host_for(rig.port)
        with connect(h0) as t:
            t.check(f"test -x {VENV}/bin/python3 || /usr/bin/python3 -m venv --without-pip {VENV}",
                    "bench venv", timeout=120)
            push(t)
            wd = Path(t.expand(h0.workdir_path))
            for d in ("bench-lat-shards", "bench-lat-one"):
                shutil.rmtree(wd / "runs" / d, ignore_errors=True)
            t.check(f"mkdir -p {shlex.quote(str(wd / 'runs'))}", "mkdir runs")
        t0 = time.perf_counter()
        layouts = make_layouts(wd, mib, pwd.getpwnam(rig.user))
        print(f"host layouts written in {time.perf_counter() - t0:.1f}s: " + ", ".join(layouts))
        passes = (["direct"] if a.direct else []) + delays
        for r in range(rounds):
            for d in passes:
                proxy = None if d == "direct" else DelayProxy(rig.port, d, max_seconds=3600).start()
                try:
                    h = host_for(proxy.port if proxy else rig.port)
                    ssh_e = shlex.join(["ssh", "-p", str(h.port), "-o", "BatchMode=yes", "-o",
                                        f"UserKnownHostsFile={kh}", "-o", "StrictHostKeyChecking=yes",
                                        "-i", str(rig.client_key)])
                    label = "direct (no proxy)" if d == "direct" else f"{d:g} ms each way"
                    for name, run_dir in layouts.items():
                        size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()
                                   and not p.name.startswith(".specops"))
                        dest_r = local / f"rsync-{r}"
                        shutil.rmtree(dest_r, ignore_errors=True)
                        dest_r.mkdir()
                        cold = C.drop_caches()
                        dt_r, p = C.timed_run(["rsync", "-a", "-e", ssh_e, f"{h.user}@127.0.0.1:{run_dir}/",
                                               f"{dest_r}/"], timeout=900)
                        if p.returncode != 0:
                            raise SystemExit(f"rsync failed: {p.stderr[-1000:]}")
                        shutil.rmtree(dest_r)
                        (run_dir / ".specops-hashes.json").unlink(missing_ok=True)
                        dest_s = local / f"specops-{r}"
                        shutil.rmtree(dest_s, ignore_errors=True)
                        C.drop_caches()
                        notes = []
                        t0 = time.perf_counter()
                        with connect(h, on_note=notes.append) as t:
                            tc = time.perf_counter() - t0
                            res = F.fetch_run(t, run_dir.name, str(dest_s))
                        dt_s = time.perf_counter() - t0
                        shutil.rmtree(dest_s)
                        tr = res.get("transfer") or {}
                        rows.append({"round": r + 1, "delay": label, "layout": name, "bytes": size,
                                     "rsync": dt_r, "specops": dt_s, "streams": tr.get("streams"),
                                     "rtt_ms": tr.get("rtt_ms"), "one": tr.get("one_stream_mib_s")})
                        print(f"round {r + 1} {label:>18} {name:>12}: rsync -a (1 stream) {dt_r:6.2f}s "
                              f"({size / 2**20 / dt_r:5.0f} MiB/s) | specops connect+fetch_run {dt_s:6.2f}s "
                              f"({size / 2**20 / dt_s:5.0f} MiB/s; connect {tc:.2f}s, attempts {res['attempts']}, "
                              f"{tr.get('streams')} stream(s), rtt {tr.get('rtt_ms')} ms, one stream "
                              f"{tr.get('one_stream_mib_s') or 'not measured'} MiB/s) | rsync/specops {dt_r / dt_s:.2f} "
                              f"[{'cold' if cold else 'warm'}]", flush=True)
                        for n in notes:
                            if "stream" in n.text:
                                print(f"      note: {n.text}")
                        if a.diag and d in ("direct", 0.0):  # the cipher's share, both ways round
                            dest_r.mkdir()
                            C.drop_caches()
                            dt_ra, p = C.timed_run(["rsync", "-a", "-e", ssh_e + " -c aes128-gcm@openssh.com",
                                                    f"{h.user}@127.0.0.1:{run_dir}/", f"{dest_r}/"], timeout=900)
                            shutil.rmtree(dest_r)
                            (run_dir / ".specops-hashes.json").unlink(missing_ok=True)
                            C.drop_caches()
                            saved, transfer.streams._CIPHERS = transfer.streams._CIPHERS, []
                            try:
                                t0 = time.perf_counter()
                                with connect(h) as t:
                                    F.fetch_run(t, run_dir.name, str(dest_s))
                                dt_sc = time.perf_counter() - t0
                            finally:
                                transfer.streams._CIPHERS = saved
                            shutil.rmtree(dest_s)
                            print(f"      diagnostic: rsync -a with -c aes128-gcm {dt_ra:.2f}s "
                                  f"({size / 2**20 / dt_ra:.0f} MiB/s); specops with the default cipher "
                                  f"(chacha20-poly1305) {dt_sc:.2f}s ({size / 2**20 / dt_sc:.0f} MiB/s)", flush=True)
                finally:
                    if proxy:
                        proxy.stop()
        print("--- summary (median over rounds) ---")
        print("| delay | layout | rsync -a 1 stream | specops fetch | streams | rsync/specops | target |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for d in passes:
            label = "direct (no proxy)" if d == "direct" else f"{d:g} ms each way"
            for name in layouts:
                rs = [x for x in rows if x["delay"] == label and x["layout"] == name]
                R = C.summary([x["rsync"] for x in rs])["median"]
                S = C.summary([x["specops"] for x in rs])["median"]
                size = rs[0]["bytes"]
                want = 1.0 if d in ("direct", 0.0) else 3.0 if d >= 25 else None
                verdict = "" if want is None else f">= {want:g}: {'MET' if R / S >= want else 'MISSED'}"
                print(f"| {label} | {name} | {R:.2f}s ({size / 2**20 / R:.0f} MiB/s) | {S:.2f}s "
                      f"({size / 2**20 / S:.0f} MiB/s) | {rs[-1]['streams']} | {R / S:.2f} | {verdict} |")
    finally:
        for d in layouts.values():
            shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
        rig.stop()
        shutil.rmtree(rig.root, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--refetch-n", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp", help="where the local destinations go")
    ap.add_argument("--latency", action="store_true", help="the delay-proxy comparison (see the docstring)")
    ap.add_argument("--delays", default="0,25,50", help="ms added to each direction, comma-separated")
    ap.add_argument("--mib", type=int, default=1024, help="latency mode: MiB per layout")
    ap.add_argument("--direct", action="store_true", help="latency mode: also a pass without the proxy")
    ap.add_argument("--diag", action="store_true", help="latency mode: without delay, also rsync with AES-GCM "
                                                            "and specops with OpenSSH's default cipher")
    a = ap.parse_args()
    if a.latency:
        if a.rounds == 2 and "--rounds" not in sys.argv:
            a.rounds = 1
        return latency(a)
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
