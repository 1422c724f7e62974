"""A real Slurm cluster on loopback for the tests: munged, slurmctld and two slurmd (node1, node2).

Debian's slurm-wlm (22.05) is built with several slurmd per host: `slurmd -N node1` and
`slurmd -N node2` each listen on their own port and act as two compute nodes of partition
`debug` (2 CPUs, 2 fake GPUs each: device files that are symlinks to /dev/null). Everything
(config, keys, state, logs) lives in one temp dir; each daemon is stopped by its recorded PID.
Every Slurm command needs SLURM_CONF (else it looks the controller up in DNS): `env()` gives it.
The slurmd run in a mount namespace of their own where `node_local` is an empty tmpfs: a folder
the login node sees but the compute nodes do not (a workdir that is not shared).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from rig import free_port, remove_at_exit

NODES = ("node1", "node2")
PARTITION = "debug"
MAX_TIME = "00:30:00"
GPUS = 2
#: seconds a job step's credential lives, and so how long a requeued job waits before it may start
#: again (Slurm's BeginTime = requeue + cred_expire + 1): Slurm's default 120 held the requeue test two
#: minutes idle; 30 still outlasts a step launch on a loaded 2-core machine by far
CRED_EXPIRE = 30
#: seconds between the controller's scheduling passes (Slurm's default 60): a requeued job whose
#: BeginTime passed starts at the next pass, not at an event
SCHED_INTERVAL = 2


def have_slurm() -> bool:
    return all(shutil.which(x) or Path(f"/usr/sbin/{x}").exists() for x in ("slurmctld", "slurmd", "munged", "sbatch"))


class SlurmRig:
    def __init__(self, user: str):
        self.root = remove_at_exit(Path(tempfile.mkdtemp(prefix="specops-slurm-")), self.stop)
        self.root.chmod(0o755)
        self.user = user
        self.conf = self.root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.munge_sock = self.root / "munge" / "munge.socket.2"
        self.node_local = self.root / "node-local"

    # -- munge ---------------------------------------------------------------------------
    def _munge(self) -> None:
        keydir, sockdir = self.root / "munge-key", self.root / "munge"
        keydir.mkdir(mode=0o700)
        sockdir.mkdir()
        sockdir.chmod(0o755)  # (munged wants its socket folder 0755 and its key in a 0700 folder)
        key = keydir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        argv = [shutil.which("munged") or "/usr/sbin/munged", "--foreground", "--force", f"--key-file={key}",
                f"--socket={self.munge_sock}", f"--pid-file={self.root / 'munged.pid'}",
                f"--log-file={self.root / 'munged.log'}", f"--seed-file={keydir / 'munge.seed'}"]
        self.procs["munged"] = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                                stderr=open(self.root / "munged.err", "ab"))
        self._wait(lambda: self.munge_sock.exists(), "munged's socket", "munged")

    # -- config --------------------------------------------------------------------------
    def _config(self) -> None:
        r = self.root
        (r / "state").mkdir()
        (r / "dev").mkdir()
        for i in range(GPUS):
            (r / "dev" / f"gpu{i}").symlink_to("/dev/null")  # (fake GPUs: Slurm only hands out the names)
        self.ctld_port = free_port()
        self.node_ports = {n: free_port() for n in NODES}
        nodes = "\n".join(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs=2 "
                          f"RealMemory=1000 Gres=gpu:{GPUS} State=UNKNOWN" for n, p in self.node_ports.items())
        self.conf.write_text(f"""ClusterName=specopstest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={self.ctld_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_sock},cred_expire={CRED_EXPIRE}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_interval={SCHED_INTERVAL}
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
MinJobAge=600
KillWait=10
InactiveLimit=0
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
{nodes}
PartitionName={PARTITION} Nodes={','.join(NODES)} Default=YES MaxTime={MAX_TIME} State=UP
""")
        (r / "gres.conf").write_text("".join(f"NodeName={n} Name=gpu File={r}/dev/gpu[0-{GPUS - 1}]\n" for n in NODES))
        self.conf.chmod(0o644)

    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _wait(self, pred, what, name, timeout=20.0) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            p = self.procs.get(name)
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"{name} exited {p.returncode}: {self.logs(name)}")
            if pred():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}: {self.logs(name)}")

    def logs(self, name: str) -> str:
        out = []
        for f in sorted(self.root.glob(f"{name.replace('slurmd-', 'slurmd-')}*.log")) + sorted(self.root.glob(f"{name}*.err")):
            out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def cmd(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True, timeout=60)
        if check and r.returncode:
            raise RuntimeError(f"{' '.join(argv)} exited {r.returncode}: {r.stderr}")
        return r

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "SlurmRig":
        self._munge()
        self._config()
        env = self.env()
        self.procs["slurmctld"] = subprocess.Popen(
            [shutil.which("slurmctld") or "/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)],
            env=env, stdout=subprocess.DEVNULL, stderr=open(self.root / "slurmctld.err", "ab"))
        self._wait(lambda: self.cmd("scontrol", "ping", check=False).returncode == 0, "slurmctld", "slurmctld")
        self.node_local.mkdir()
        pw = pwd.getpwnam(self.user)
        os.chown(self.node_local, pw.pw_uid, pw.pw_gid)
        slurmd = shutil.which("slurmd") or "/usr/sbin/slurmd"
        for n in NODES:
            # (unshare execs sh, sh execs slurmd: the PID is slurmd's)
            node = (f"mount -t tmpfs -o mode=1777 specops-node-local {self.node_local} && "
                    f"exec {slurmd} -D -N {n} -f {self.conf}")
            self.procs[f"slurmd-{n}"] = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", node],
                env=env, stdout=subprocess.DEVNULL, stderr=open(self.root / f"slurmd-{n}.err", "ab"))
        self._wait(self._idle, "both nodes idle", "slurmctld", timeout=30)
        return self

    def _idle(self) -> bool:
        r = self.cmd("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n, "").rstrip("*") == "idle" for n in NODES)

    def queue(self) -> list[str]:
        """Job ids Slurm knows of that have not ended (pending or running)."""
        r = self.cmd("squeue", "-h", "-o", "%i %T")
        return [ln.split()[0] for ln in r.stdout.splitlines() if ln.split()[1] in ("PENDING", "RUNNING", "CONFIGURING",
                                                                                   "COMPLETING")]

    def stop(self) -> None:
        """Stop every daemon by its PID (slurmd first, munged last)."""
        order = [k for k in self.procs if k.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.get(name)
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
