"""SSH transport: one Fabric connection for a whole task, strict host keys; bulk transfers through
specops.host.transfer (several OpenSSH streams, rsync groups and byte ranges, resumable, verified)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any, Optional, Sequence

import paramiko
from fabric import Connection
from fabric.runners import Remote
from invoke.exceptions import CommandTimedOut

from specops.host import hostkeys, transfer
from specops.errors import NoRetry, SpecopsError
from specops.inventory import Host, parse_jump
from specops.host.transport import Result, Transport

CONNECT_TIMEOUT = 10
KEEPALIVE = 15


#: what a dropped link raises under paramiko (a local file's own OSError is not among them)
LINK_ERRORS = (paramiko.SSHException, EOFError, ConnectionError, TimeoutError, socket.timeout)


def _parse_jump(spec: str, default_user: str) -> tuple[str, str, int]:
    return parse_jump(spec, default_user)  # (checked when hosts.yaml is loaded)


class SSHTransport(Transport):
    def __init__(self, host: Host, connect_timeout: int = CONNECT_TIMEOUT, keepalive: int = KEEPALIVE,
                 forward_agent: bool = False, **kw):
        super().__init__(host, **kw)
        self.forward_agent = forward_agent
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self._rsync_remote: Optional[bool] = None
        self.key_file = self._key_file()
        self.conn = self._connection(host.address, host.user, host.port, gateway=self._gateway())

    # -- connection ------------------------------------------------------------------
    def _key_file(self) -> Optional[str]:
        if not self.host.key:
            return None
        p = Path(self.host.key).expanduser()
        if not p.is_file():
            raise SpecopsError(f"key file {p} for host {self.host.name!r} not found: fix 'key' in hosts.yaml")
        if not os.access(p, os.R_OK):
            raise SpecopsError(f"key file {p} for host {self.host.name!r} is not readable: check its permissions")
        try:
            paramiko.PKey.from_path(p)
        except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's "no password"
            raise SpecopsError(f"key file {p} for {self.host.name!r} is encrypted: load it into ssh-agent "
                               f"(ssh-add) and drop 'key' from hosts.yaml, or use an unencrypted key") from None
        except (paramiko.SSHException, ValueError, OSError) as e:
            raise SpecopsError(f"key file {p} for {self.host.name!r} cannot be read as a private key ({e}): "
                               f"point 'key' at an OpenSSH private key") from None
        return str(p)

    class Interruptible(Remote):
        """fabric's runner, except that Ctrl-C (and SIGTERM, raised as it: specops.cli) ends the
        command's session at once: without a pty fabric re-raises it only once the host command's
        output ends (invoke joins its reader threads), so the laptop hung and the host's script ran
        on. Closing the channel ends both: the host's sshd closes the command's pipes (a host script
        that serves vLLM then stops it: remote/specops_host/serve/vllm_server.py end_with_session)."""

        def send_interrupt(self, interrupt):
            if not self.using_pty:
                try:
                    self.channel.close()
                except (paramiko.SSHException, OSError, EOFError):
                    pass
            super().send_interrupt(interrupt)

    def _connection(self, address, user, port, gateway=None) -> Connection:
        kw: dict[str, Any] = {"banner_timeout": self.connect_timeout, "auth_timeout": self.connect_timeout}
        if self.key_file:
            kw["key_filename"] = [self.key_file]
        c = Connection(
            address, user=user, port=port, connect_timeout=self.connect_timeout,
            connect_kwargs=kw, gateway=gateway if gateway is not None else False,
            forward_agent=self.forward_agent,
        )
        c.config.runners.remote = self.Interruptible
        # Fabric installs AutoAddPolicy and loads no known_hosts: replace both before open().
        hostkeys.install(c.client, self.host.known_hosts, self.host.accept_new_host_key)
        return c

    def _gateway(self) -> Optional[Connection]:
        if not self.host.proxy_jump:
            return None
        user, addr, port = _parse_jump(self.host.proxy_jump, self.host.user)
        return self._connection(addr, user, port)

    def open(self) -> None:
        h = self.host
        gw = self.conn.gateway
        if isinstance(gw, Connection):  # the jump host first, so that its failures name it
            self._open(gw, f"jump host {gw.user}@{gw.host}:{gw.port} (proxy_jump of {h.name})", "proxy_jump")
        self._open(self.conn, h.name, "address")
        self.conn.transport.set_keepalive(self.keepalive)
        sock = self.conn.transport.sock
        if isinstance(sock, socket.socket):  # not through a jump host's channel
            # paramiko leaves Nagle on: each short command would wait ~40 ms for a delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _open(self, conn: Connection, name: str, field: str) -> None:
        """conn.open(), each failure one line naming conn's address and `name` (the host, or the jump
        host and whose it is), and the hosts.yaml field to fix."""
        h = self.host
        where = f"{conn.host}:{conn.port}"
        t0 = time.monotonic()
        try:
            conn.open()
        except hostkeys.UnknownHostKey as e:
            raise NoRetry(
                f"unknown host key for {e.hostname} ({e.key.get_name()} {hostkeys.fingerprint(e.key)}), "
                f"not in {e.path}: verify the fingerprint, then add it (ssh-keyscan -p {conn.port} {conn.host} "
                f">> {e.path}) or set accept_new_host_key: true for {h.name!r}"
                + (f" ({name})" if field != "address" else "")
            ) from None
        except paramiko.BadHostKeyException as e:
            raise NoRetry(
                f"host key for {where} ({name}) CHANGED: known_hosts has {e.expected_key.get_name()} "
                f"{hostkeys.fingerprint(e.expected_key)}, server sent {e.key.get_name()} "
                f"{hostkeys.fingerprint(e.key)}: if the host was rebuilt, remove the old line with "
                f"ssh-keygen -R '[{conn.host}]:{conn.port}' -f {Path(h.known_hosts).expanduser()}; "
                f"otherwise do not connect"
            ) from None
        except paramiko.AuthenticationException:
            key = self.key_file or "agent/default keys"
            raise NoRetry(
                f"authentication refused for {conn.user}@{where} ({name}) (key: {key}): check 'user'/'key'/"
                f"'{field}' in hosts.yaml and the host's authorized_keys"
            ) from None
        except (socket.timeout, TimeoutError):
            raise SpecopsError(
                f"timed out after {self.connect_timeout}s connecting to {where} ({name}): is the "
                f"address right and the port open?"
            ) from None
        except paramiko.ssh_exception.NoValidConnectionsError:
            raise SpecopsError(
                f"nothing listening at {where} ({name}): is sshd running and the port right?"
            ) from None
        except socket.gaierror as e:
            raise SpecopsError(f"cannot resolve {conn.host!r} ({name}): {e.strerror}: fix '{field}'") from None
        except paramiko.ChannelException as e:  # the jump host is up but could not reach the target
            raise SpecopsError(
                f"the jump host {conn.gateway.host}:{conn.gateway.port} (proxy_jump of {h.name}) could not open a "
                f"connection to {where}: {e.text or e}: is the address right as the jump host sees it?"
            ) from None
        except (paramiko.SSHException, OSError) as e:
            if "banner" in str(e).lower() or time.monotonic() - t0 >= self.connect_timeout - 0.5:
                raise SpecopsError(
                    f"timed out after {self.connect_timeout}s waiting for the SSH banner from {where} ({name}): "
                    f"something listens there but is not answering as sshd (hung sshd, wrong port, firewall?)"
                ) from None
            raise SpecopsError(f"cannot connect to {where} ({name}): {e}") from None
    def close(self) -> None:
        self.conn.close()
        if isinstance(self.conn.gateway, Connection):
            self.conn.gateway.close()

    # -- operations ------------------------------------------------------------------
    def _run(self, cmd: str, *, timeout: Optional[float] = None, hide=True, out_stream=None) -> Result:
        try:
            r = self.conn.run(cmd, hide=hide, warn=True, timeout=timeout, in_stream=False, out_stream=out_stream)
        except CommandTimedOut:
            raise SpecopsError(f"command timed out after {timeout}s on {self.host.name}: {cmd[:80]}") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self.lost("running a command", e) from None
        return Result(cmd, r.exited, r.stdout, r.stderr)

    def lost(self, what: str, e: BaseException) -> SpecopsError:
        """The one line of a connection lost mid-operation (never paramiko's traceback)."""
        return SpecopsError(f"connection to {self.host.name} lost while {what} ({type(e).__name__}: {e}): "
                            f"run it again, it resumes")

    def _put(self, local: str, remote: str) -> None:
        if os.path.getsize(local) >= transfer.RANGE_MIN:  # a large upload: ranged streams, sha256-checked
            transfer.upload_file(self, local, remote, what=f"put {os.path.basename(local)}")
            return
        try:
            self.conn.put(local, remote)
        except LINK_ERRORS as e:
            raise self.lost(f"sending {os.path.basename(local)}", e) from None

    def get(self, remote: str, local: str) -> None:
        try:
            self.conn.get(remote, local)
        except LINK_ERRORS as e:
            raise self.lost(f"reading {remote}", e) from None

    def _read_bytes(self, path: str, offset: int = 0, limit: int = 4 << 20) -> Optional[bytes]:
        try:
            with self.conn.sftp().open(self.expand(path), "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self.lost(f"reading {path}", e) from None

    def reconnect(self) -> None:
        """Re-open in place after a drop: a fresh Fabric connection with the same parameters,
        opened by open() (strict host keys, keepalive, TCP_NODELAY)."""
        try:
            self.close()
        except Exception:  # noqa: BLE001 - the old one is gone anyway
            pass
        self.conn = self._connection(self.host.address, self.host.user, self.host.port, gateway=self._gateway())
        self.open()

    # -- bulk --------------------------------------------------------------------------
    def rtt(self, samples: int = 3) -> float:
        """The round trip to the host, in seconds: the fastest of `samples` SSH keepalive requests on
        the open connection (a global request: no session, no command started on the host)."""
        tr = self.conn.transport
        best = float("inf")
        for _ in range(max(1, samples)):
            t0 = time.perf_counter()
            try:
                if tr is None or not tr.is_active():
                    raise EOFError("the SSH transport is closed")
                tr.global_request("keepalive@openssh.com", wait=True)
            except LINK_ERRORS as e:
                raise self.lost("measuring the link", e) from None
            best = min(best, time.perf_counter() - t0)
        return best

    def ssh_command(self) -> list[str]:
        """OpenSSH argv with this host's parameters (port, key, known_hosts policy, jump)."""
        h = self.host
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}",
                "-o", f"ServerAliveInterval={self.keepalive}",
                *hostkeys.openssh_options(h.known_hosts, h.accept_new_host_key)]
        if self.key_file:
            opts += ["-i", self.key_file]
        argv = ["ssh", "-p", str(h.port), *opts]
        if h.proxy_jump:
            # Not -J: OpenSSH does not hand -i/-o to the jump hop; ProxyCommand gets them all.
            user, addr, port = _parse_jump(h.proxy_jump, h.user)
            hop = shlex.join(["ssh", "-p", str(port), *opts, "-W", "%h:%p", f"{user}@{addr}"])
            argv += ["-o", f"ProxyCommand={hop}"]
        return argv

    def _remote_spec(self, path: str) -> str:
        addr = self.host.address
        assert addr is not None  # (an ssh host has its address: inventory checks it)
        if ":" in addr:
            addr = f"[{addr}]"
        return f"{self.host.user}@{addr}:{path}"

    remote_spec = _remote_spec  # (rsync's user@host:path, for specops.transfer)

    def rsync_ok(self) -> bool:
        if shutil.which("rsync") is None:
            return False
        if self._rsync_remote is None:
            self._rsync_remote = self.fact("command -v rsync >/dev/null").ok
        return self._rsync_remote

    def rsync(self, src: str, dst: str, extra: Sequence[str] = (), on_progress=None) -> None:
        argv = ["rsync", "-a", "--secluded-args" if _rsync_has_secluded() else "--protect-args",
                "-e", shlex.join(self.ssh_command()), *extra, src, dst]
        rc, err = run_rsync(argv, on_progress)
        if rc != 0:
            tail = (err.strip().splitlines() or [f"exit {rc}"])[-1]
            raise SpecopsError(f"rsync {src} -> {dst} failed for {self.host.name}: {tail}")

    def _sync_up(self, local_dir: str, remote_dir: str, *, delete: bool = False, streams: Optional[int] = None,
                 on_progress=None) -> None:
        """Several streams when the work and the link call for it (transfer.Upload); otherwise, and for
        --delete afterwards, one rsync of the tree."""
        remote_dir = self.expand(remote_dir)
        up = transfer.Upload(self, local_dir, remote_dir, streams=streams, on_progress=on_progress,
                             what=f"upload {Path(local_dir).name}")
        units = max(1, len(up.ranges) + min(len(up.small), transfer.MAX_STREAMS))
        if up.rsync and up.decide(up.work, units).streams == 1:
            up.close()  # one stream is enough (a LAN, little work): one rsync, as ever
            self.rsync(local_dir.rstrip("/") + "/", self._remote_spec(remote_dir.rstrip("/") + "/"),
                       ["--delete"] if delete else [])
            return
        up.run()
        if delete and up.rsync:  # what is gone here goes there too (everything else already matches)
            self.rsync(local_dir.rstrip("/") + "/", self._remote_spec(remote_dir.rstrip("/") + "/"),
                       ["--delete", f"--exclude={transfer.SKIP_PREFIX}*"])

    def sync_down(self, remote_dir: str, local_dir: str, *, partial: bool = True,
                  progress: bool = False, checksum: bool = False, bwlimit: int = 0,
                  streams: Optional[int] = None, on_progress=None) -> None:
        """Several streams when the work and the link call for it (transfer.Download: byte ranges,
        resumable); otherwise one rsync of the tree. A file that changes on the host meanwhile is
        fetched once more; then this fails."""
        remote_dir = self.expand(remote_dir)
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        changed: list[str] = []
        for attempt in (1, 2):
            dl = transfer.Download(self, remote_dir, local_dir, bwlimit=bwlimit, streams=streams,
                                   what=f"sync {PurePosixPath(remote_dir).name}",
                                   only=None if attempt == 1 else set(changed), force=attempt > 1)
            if attempt == 1 and dl.rsync and (checksum or not dl.has_big and dl.decide(
                    dl.work, max(1, len(dl.pieces) + min(len(dl.small), transfer.MAX_STREAMS))).streams == 1):
                dl.close()  # nothing to split: one rsync, as ever
                extra = (["--partial"] if partial else []) + (["--checksum"] if checksum else [])
                if bwlimit:
                    extra.append(f"--bwlimit={int(bwlimit)}")
                self.rsync(self._remote_spec(remote_dir.rstrip("/") + "/"), local_dir.rstrip("/") + "/",
                           extra + [f"--exclude={transfer.SKIP_PREFIX}*"], on_progress=on_progress)
                return
            dl.on_progress = on_progress if attempt == 1 else None
            changed = dl.run()["changed"]
            if not changed:
                return
        raise SpecopsError(f"{len(changed)} file(s) kept changing on {self.host.name} during the transfer "
                           f"({', '.join(changed[:3])}): retry when they are complete")


def run_rsync(argv: list[str], on_progress=None) -> tuple[int, str]:
    """Run rsync; with on_progress(done_bytes, total_bytes), follow its overall progress
    (--info=progress2; the total is estimated from its percentage)."""
    if on_progress is None:
        done_p = subprocess.run(argv, capture_output=True, text=True)
        return done_p.returncode, done_p.stderr
    argv = argv[:1] + ["--info=progress2", "--no-inc-recursive"] + argv[1:]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    buf = b""
    while True:
        ch = p.stdout.read(1)
        if not ch:
            break
        if ch in b"\r\n":
            parts = buf.decode(errors="replace").split()
            if len(parts) >= 2 and parts[1].endswith("%") and parts[0].replace(",", "").isdigit():
                done, pct = int(parts[0].replace(",", "")), float(parts[1].rstrip("%") or 0)
                on_progress(done, int(done * 100 / pct) if pct > 0 else 0)
            buf = b""
        else:
            buf += ch
    err = p.stderr.read().decode(errors="replace")
    return p.wait(), err


_SECLUDED: Optional[bool] = None


def _rsync_has_secluded() -> bool:
    global _SECLUDED
    if _SECLUDED is None:
        out = subprocess.run(["rsync", "--help"], capture_output=True, text=True).stdout
        _SECLUDED = "--secluded-args" in out
    return _SECLUDED
