"""Strict host-key checking for paramiko clients (Fabric 3 hard-codes AutoAddPolicy).

``install(client, known_hosts, accept_new)`` must run before the connection opens:
- a host missing from known_hosts is refused (``UnknownHostKey``), unless ``accept_new``,
  in which case its key is appended to known_hosts (OpenSSH's ``accept-new``);
- a changed key is always refused by paramiko (``BadHostKeyException``): see ``describe``.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import paramiko

from specops.errors import SpecopsError


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey, path: Path):
        super().__init__(f"unknown host key for {hostname}")
        self.hostname, self.key, self.path = hostname, key, path


class RejectUnknown(paramiko.MissingHostKeyPolicy):
    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(hostname, key, self.path)


class AcceptNew(paramiko.MissingHostKeyPolicy):
    """Record an unseen key in known_hosts (never replaces a known one)."""

    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.path, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        os.chmod(self.path, 0o600)


def install(client: paramiko.SSHClient, known_hosts: str, accept_new: bool) -> Path:
    path = Path(known_hosts).expanduser()
    if path.exists() and not path.is_file():
        raise SpecopsError(f"known_hosts {path} is {'a directory' if path.is_dir() else 'not a regular file'}: "
                           f"point 'known_hosts' in hosts.yaml at a file (OpenSSH's own is ~/.ssh/known_hosts)")
    if path.is_file():
        try:
            client.load_host_keys(str(path))
        except (OSError, UnicodeDecodeError, paramiko.SSHException, ValueError) as e:
            raise SpecopsError(f"known_hosts {path} cannot be read ({type(e).__name__}: {e}): fix its "
                               f"permissions or point 'known_hosts' in hosts.yaml at another file") from None
    client.set_missing_host_key_policy(AcceptNew(path) if accept_new else RejectUnknown(path))
    return path


def openssh_options(known_hosts: str, accept_new: bool) -> list[str]:
    """The same policy for the OpenSSH client (rsync's transport)."""
    return [
        "-o", f"UserKnownHostsFile={Path(known_hosts).expanduser()}",
        "-o", f"StrictHostKeyChecking={'accept-new' if accept_new else 'yes'}",
    ]
