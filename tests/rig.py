"""A real OpenSSH sshd on 127.0.0.1 for the integration tests.

Generated host key, client key, authorized_keys and known_hosts live in a temp dir;
sshd runs as `sshd -D -e -f CFG` and is stopped by its PID. When the tests run as root,
sshd can log in both root and a non-root user (created here), so both are tested.
The authorized_keys line sets PATH so that `python3` on the host is a recorder: a script
that logs its arguments and then runs the real interpreter (the interpreter-rule test).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

TEST_USER = os.environ.get("SPECOPS_TEST_USER", "specops-ci")
REAL_PYTHON = os.environ.get("SPECOPS_TEST_BASE_PYTHON", "/usr/bin/python3")


def pip_find_links() -> str | None:
    v = os.environ.get("PIP_FIND_LINKS")
    if v:
        return v
    p = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                       capture_output=True, text=True)
    return p.stdout.strip() or None if p.returncode == 0 else None


def remove_at_exit(path: Path, stop=None) -> Path:
    """`path` (a temp dir of the tests) removed when this process exits, after `stop()`, unless
    SPECOPS_KEEP_RIG=1 keeps it to look into; without this every suite run left its rigs' work
    dirs (up to 2 GB each) in /tmp."""
    import atexit

    def remove():
        if stop:
            try:
                stop()
            except Exception:  # noqa: BLE001  (exiting: remove what can be removed)
                pass
        if os.environ.get("SPECOPS_KEEP_RIG") != "1":
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "specops-test", "-f", str(path)],
                   check=True)
    return Path(f"{path}.pub").read_text().strip()


def ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
        # '*' = no password, but not a locked account (sshd refuses locked ones without PAM).
        subprocess.run(["usermod", "-p", "*", name], check=True)
        return pwd.getpwnam(name)


class Rig:
    def __init__(self, address: str = "127.0.0.1", port: int | None = None, netns: str | None = None,
                 max_startups: str = "100:30:200", max_sessions: int = 100, env: dict | None = None):
        extra_env = env
        self.root = remove_at_exit(Path(tempfile.mkdtemp(prefix="specops-rig-")), self.stop)
        self.root.chmod(0o755)
        self.address, self.netns = address, netns
        self.port = port or free_port()
        self.is_root = os.geteuid() == 0
        self.user = ensure_user(TEST_USER).pw_name if self.is_root else pwd.getpwuid(os.getuid()).pw_name
        self.home = pwd.getpwnam(self.user).pw_dir
        self.proc: subprocess.Popen | None = None

        self.host_key = self.root / "host_ed25519"
        self.client_key = self.root / "client_ed25519"
        self.other_key = self.root / "stranger_ed25519"
        keygen(self.host_key)
        pub = keygen(self.client_key)
        keygen(self.other_key)
        self.client_key.chmod(0o600)

        # python3 on the host's PATH is a recorder.
        self.bin = self.root / "bin"
        self.bin.mkdir()
        self.calls = self.root / "python3-calls.log"
        self.calls.touch()
        self.calls.chmod(0o666)
        rec = self.bin / "python3"
        rec.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {self.calls}\nexec {REAL_PYTHON} "$@"\n')
        rec.chmod(0o755)
        # One pip cache for the test users: the heavy venv's wheels are downloaded once.
        self.pip_cache = Path(os.environ.get("SPECOPS_TEST_PIP_CACHE", "/var/tmp/specops-test-pip-cache"))
        self.pip_cache.mkdir(parents=True, exist_ok=True)
        self.pip_cache.chmod(0o777)
        env = f'PATH={self.bin}:/usr/local/bin:/usr/bin:/bin,PIP_CACHE_DIR={self.pip_cache}'
        # The test host's pip sees the wheels this machine's pip sees (torch's CPU build lies on
        # disk here; on a user's host it comes from PyTorch's CPU index, as the profile says).
        links = pip_find_links()
        if links:
            env += f",PIP_FIND_LINKS={links}"
        for k, v in (extra_env or {}).items():  # (the login environment, e.g. a cluster's SLURM_CONF)
            env += f",{k}={v}"
        opts = ",".join(f'environment="{kv}"' for kv in env.split(","))
        (self.root / "authorized_keys").write_text(f"{opts} {pub}\n")
        (self.root / "authorized_keys").chmod(0o644)

        host_pub = Path(f"{self.host_key}.pub").read_text().split()
        self.known_hosts = self.root / "known_hosts"
        name = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        self.known_hosts.write_text(f"{name} {host_pub[0]} {host_pub[1]}\n")
        self.cfg = self.root / "sshd_config"
        self.cfg.write_text(f"""Port {self.port}
ListenAddress {self.address}
HostKey {self.host_key}
PidFile {self.root}/sshd.pid
AuthorizedKeysFile {self.root}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PermitUserEnvironment yes
MaxStartups {max_startups}
MaxSessions {max_sessions}
Subsystem sftp internal-sftp
LogLevel VERBOSE
""")
        self.log = self.root / "sshd.log"

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> "Rig":
        Path("/run/sshd").mkdir(exist_ok=True)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        argv = [os.path.abspath(sshd), "-D", "-e", "-f", str(self.cfg)]
        if self.netns:  # `ip netns exec` execs sshd: the PID is sshd's
            argv = ["ip", "netns", "exec", self.netns] + argv
        self.proc = subprocess.Popen(argv, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex((self.address, self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on {self.port}: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # by PID, never by name
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def drop_connections(self) -> None:
        """Kill the per-connection sshd processes (children of the master, found by PPID)."""
        import signal

        if not self.proc:
            return
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == self.proc.pid:
                    try:
                        os.kill(int(p.name), signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    # -- inventory -----------------------------------------------------------------------
    def host(self, user: str | None = None, **over) -> dict:
        h = {"address": self.address, "port": self.port, "user": user or self.user,
             "key": str(self.client_key), "known_hosts": str(self.known_hosts), "profile": "cpu"}
        h.update(over)
        return h

    def write_hosts(self, path: Path, hosts: dict, groups: dict | None = None) -> Path:
        doc = {"hosts": hosts}
        if groups:
            doc["groups"] = groups
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def recorded_calls(self) -> list[str]:
        return [ln for ln in self.calls.read_text().splitlines() if ln.strip()]
