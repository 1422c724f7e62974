"""Benchmark: one remote venv-python call through specops vs OpenSSH with ControlMaster.

    .venv/bin/python bench/roundtrip.py [-n 30] [--cli-n 10]

Starts the real loopback sshd of tests/rig.py (127.0.0.1 only; as root the rig logs in its
non-root user), makes a bare host venv (`/usr/bin/python3 -m venv --without-pip
~/bench-venv`) and pushes specops_host/. Then, alternating, N times each (after 3 untimed
warm-ups of each):
  (a) specops: `remote_exec.run_script(t, "jobs.job", ["status"])` over one open
      `transport.connect(host)` connection (Fabric/paramiko exec channel);
  (b) peer: `ssh -o ControlMaster=auto -o ControlPersist=60 ...` (the same options specops
      gives rsync: port, key, strict known_hosts) running the very same command
      (`cd ~/specops-bench && ~/bench-venv/bin/python3 specops_host/jobs/job.py status`, as built by
      remote_exec.script_command) over the shared master connection.
Prints median/p90 of both and the ratio a/b (target <= 1.2x). Then times the whole CLI
`inv status --host bench --hosts FILE` (--cli-n times; target <= 1 s) and a breakdown of
where that time goes (interpreter start, imports, connect, push, the call).
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path[:0] = [os.path.dirname(_HERE), os.path.join(os.path.dirname(_HERE), "tests")]

import argparse  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from bench import _common as C  # noqa: E402
from rig import Rig  # noqa: E402
from specops import inventory  # noqa: E402
from specops.host.push import push  # noqa: E402
from specops.host.remote_exec import decode_payload, run_script, script_command  # noqa: E402
from specops.host.connection import connect  # noqa: E402

VENV = "~/bench-venv"
WORKDIR = "~/specops-bench"


def _run_true(t) -> float:
    t0 = time.perf_counter()
    assert t.run("true").ok
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--cli-n", type=int, default=10)
    a = ap.parse_args()
    n, cli_n = max(1, min(a.n, 1000)), max(1, min(a.cli_n, 100))
    print(f"machine: {C.machine()}; {time.strftime('%Y-%m-%d %H:%M:%S')}")
    rig = Rig().start()
    cm_path = str(rig.root / "cm-%C")
    ssh_base: list[str] = []
    try:
        hf = rig.write_hosts(rig.root / "hosts-bench.yaml", {"bench": rig.host(venv=VENV, workdir=WORKDIR)})
        h = inventory.load(str(hf)).get("bench")
        print(f"sshd on 127.0.0.1:{rig.port}, user {rig.user}")
        with connect(h) as t:
            t.check(f"test -x {VENV}/bin/python3 || /usr/bin/python3 -m venv --without-pip {VENV}",
                    "bench venv", timeout=120)
            push(t)
            cmd = script_command(t, "jobs.job", ["status"])
            ssh_base = t.ssh_command() + ["-o", "ControlMaster=auto", "-o", f"ControlPath={cm_path}",
                                          "-o", "ControlPersist=60", f"{h.user}@{h.address}"]
            print(f"command: {cmd}")

            def via_specops() -> float:
                t0 = time.perf_counter()
                res = run_script(t, "jobs.job", ["status"])
                dt = time.perf_counter() - t0
                assert res.get("ok"), res
                return dt

            def via_ssh() -> float:
                t0 = time.perf_counter()
                p = subprocess.run(ssh_base + [cmd], capture_output=True, text=True, timeout=60)
                dt = time.perf_counter() - t0
                res = decode_payload(p.stdout)
                assert p.returncode == 0 and res and res.get("ok"), (p.returncode, p.stdout, p.stderr)
                return dt

            def direct() -> float:  # the same command, no SSH at all (as this user; no .pyc written)
                t0 = time.perf_counter()
                subprocess.run(["sh", "-c", cmd], capture_output=True, timeout=60,
                               env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
                return time.perf_counter() - t0

            for _ in range(3):  # warm-up: master connection up, pages cached
                via_specops()
                via_ssh()
            # Back to back, as a task issues its calls (push, then the script): the main figure.
            sa = [via_specops() for _ in range(n)]
            sb = [via_ssh() for _ in range(n)]
            # Interleaved a, b, a, b: each specops call starts on an idle connection.
            ia, ib = [], []
            for _ in range(n):
                ia.append(via_specops())
                ib.append(via_ssh())
            sd = [direct() for _ in range(n)] if rig.is_root or rig.user == h.user else []
            # Diagnostic only (specops is not changed): the same connection with TCP_NODELAY.
            sock = t.conn.transport.sock
            nodelay0 = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sn = [via_specops() for _ in range(n)]
            tn = [_run_true(t) for _ in range(n)]
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, nodelay0)
            tt = [_run_true(t) for _ in range(n)]
            A, B = C.summary(sa), C.summary(sb)
            print(f"(a) specops run_script job status, back to back:   {C.fmt(A)}")
            print(f"(b) ssh ControlMaster, same cmd, back to back:     {C.fmt(B)}")
            print(f"(a) specops, interleaved with (b):                 {C.fmt(C.summary(ia))}")
            print(f"(b) ssh ControlMaster, interleaved with (a):       {C.fmt(C.summary(ib))}")
            if sd:
                print(f"    the command run directly (no SSH):             {C.fmt(C.summary(sd))}")
            print(f"    specops t.run('true') (TCP_NODELAY={nodelay0}):         {C.fmt(C.summary(tt))}")
            print("    diagnostic, socket set TCP_NODELAY=1 by the bench:")
            print(f"      run_script job status, back to back:         {C.fmt(C.summary(sn))}")
            print(f"      t.run('true'):                               {C.fmt(C.summary(tn))}")

            # Breakdown of the CLI's pieces, in process (median of cli_n).
            conn_t, push_t, call_t = [], [], []
            for _ in range(cli_n):
                t0 = time.perf_counter()
                t2 = connect(h)
                t1 = time.perf_counter()
                push(t2)
                t3 = time.perf_counter()
                run_script(t2, "jobs.job", ["status"])
                t4 = time.perf_counter()
                t2.close()
                conn_t.append(t1 - t0)
                push_t.append(t3 - t1)
                call_t.append(t4 - t3)

        env = C.cli_env()
        cli = []
        for _ in range(cli_n):
            dt, p = C.timed_run([str(C.VENV_BIN / "inv"), "status", "--host", "bench", "--hosts", str(hf)],
                                timeout=120, env=env, cwd=C.REPO)
            assert p.returncode == 0, p.stdout + p.stderr
            cli.append(dt)
        bare = [C.timed_run([str(C.VENV_BIN / "python"), "-c", "pass"], timeout=60)[0] for _ in range(cli_n)]
        imp = [C.timed_run([str(C.VENV_BIN / "python"), "-c", "import tasks"], timeout=60, cwd=C.REPO)[0]
               for _ in range(cli_n)]
        inv_list = [C.timed_run([str(C.VENV_BIN / "inv"), "--list"], timeout=60, cwd=C.REPO, env=env)[0]
                    for _ in range(cli_n)]
        S = C.summary(cli)
        med = lambda xs: C.summary(xs)["median"]  # noqa: E731
        print(f"(c) CLI `inv status --host bench`:   {C.fmt(S)}")
        print(f"    breakdown (medians): python start {med(bare) * 1000:.0f} ms; python + import tasks "
              f"{med(imp) * 1000:.0f} ms; `inv --list` {med(inv_list) * 1000:.0f} ms; connect "
              f"{med(conn_t) * 1000:.0f} ms; push (no-op) {med(push_t) * 1000:.0f} ms; "
              f"run_script {med(call_t) * 1000:.0f} ms")
        ratio = A["median"] / B["median"]
        ri = C.summary(ia)["median"] / C.summary(ib)["median"]
        rn = C.summary(sn)["median"] / B["median"]
        print("--- summary ---")
        print(f"specops / ssh-ControlMaster, back to back (median): {ratio:.2f}x  (p90 {A['p90'] / B['p90']:.2f}x)"
              f"  (target <= 1.2x: {'MET' if ratio <= 1.2 else 'MISSED'})")
        print(f"specops / ssh-ControlMaster, interleaved (median):  {ri:.2f}x")
        print(f"with TCP_NODELAY on specops' socket (diagnostic):   {rn:.2f}x")
        print(f"inv status CLI median: {S['median']:.3f}s  (target <= 1 s: {'MET' if S['median'] <= 1 else 'MISSED'})")
    finally:
        if ssh_base:
            subprocess.run(["ssh", "-o", f"ControlPath={cm_path}", "-O", "exit", ssh_base[-1]],
                           capture_output=True, timeout=30)
        rig.stop()
        shutil.rmtree(rig.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
