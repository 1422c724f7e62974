"""Moving hidden-state shards so that every host of a group holds every shard: nothing to do on a
shared filesystem, host to host where hosts reach each other (each host's own rsync over SSH,
authenticated by the laptop's forwarded ssh-agent, against known_hosts lines sent from the laptop),
otherwise through the laptop (rsync both ways, only what is missing)."""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Optional

from specops.ops import data
from specops.host.connection import connect
from specops.errors import SpecopsError
from specops.group.fanout import Group
from specops.inventory import Host


def complete_data(hosts: list[Host], dataset: Optional[str]) -> dict:
    """Give every host every shard's hidden-states files. Hosts declaring `shared_data` already
    see them; hosts declaring `reach_peers` move them host to host; otherwise the files travel
    through the laptop (rsync both ways, only what is missing): hosts cannot be assumed to hold
    credentials for each other."""
    notes: list[str] = []
    if all(h.shared_data for h in hosts):
        return {"mode": "shared filesystem", "moved": 0, "notes": notes}
    if all(h.reach_peers and h.transport == "ssh" for h in hosts):
        if os.environ.get("SSH_AUTH_SOCK"):
            return peer_sync(hosts, dataset)
        notes.append("reach_peers: no ssh-agent here (SSH_AUTH_SOCK): the shards go through the laptop instead "
                     "(ssh-add the hosts' key to move them host to host)")
    group = Group.open(hosts)
    ts = group.transports
    try:
        with tempfile.TemporaryDirectory(prefix="specops-shards-") as stage:
            for t in ts:
                t.sync_down(f"{data.data_dir(t, dataset)}/hidden_states", stage, partial=True)
            files = len(list(Path(stage).glob("hs_*.safetensors")))
            for t in ts:
                t.sync_up(stage, f"{data.data_dir(t, dataset)}/hidden_states")
        return {"mode": "through the laptop", "files": files, "notes": notes}
    finally:
        group.close()


def peer_known_hosts(hosts: list[Host]) -> str:
    """The laptop's known_hosts lines for these hosts (strict checking on the hosts too)."""
    import paramiko

    lines = []
    for h in hosts:
        keys = paramiko.HostKeys()
        path = Path(h.known_hosts).expanduser()
        if path.is_file():
            keys.load(str(path))
        assert h.address is not None  # (ssh hosts: inventory requires it)
        name = h.address if h.port == 22 else f"[{h.address}]:{h.port}"
        entry = keys.lookup(name)
        if not entry:
            raise SpecopsError(f"no known host key for {name} ({h.name}) in {path}: connect to it once from here")
        lines += [f"{name} {k.get_name()} {k.get_base64()}" for k in entry.values()]
    return "\n".join(lines) + "\n"


def peer_sync(hosts: list[Host], dataset: Optional[str]) -> dict:
    """Each host pushes the shard files it has to every other host with its own rsync over SSH,
    authenticated by the laptop's forwarded ssh-agent, against known_hosts lines sent from here."""
    kh = peer_known_hosts(hosts)
    moved = 0
    for src in hosts:
        t = connect(src, forward_agent=True)
        try:
            wd = t.expand(src.workdir_path)
            khf = f"{wd}/.specops/peers_known_hosts"
            t.check(f"mkdir -p {shlex.quote(wd)}/.specops", "mkdir")
            t.put_text(kh, khf, label="(known_hosts lines)")
            src_dir = f"{data.data_dir(t, dataset)}/hidden_states/"
            for dst in hosts:
                if dst.name == src.name:
                    continue
                with connect(dst) as td:
                    dst_dir = f"{data.data_dir(td, dataset)}/hidden_states/"
                    td.check(f"mkdir -p {shlex.quote(dst_dir)}", "mkdir hidden_states")
                ssh = shlex.join(["ssh", "-p", str(dst.port), "-o", "BatchMode=yes", "-o",
                                  f"UserKnownHostsFile={khf}", "-o", "StrictHostKeyChecking=yes"])
                addr = f"[{dst.address}]" if ":" in (dst.address or "") else dst.address
                r = t.check(f"rsync -a --ignore-existing --stats -e {shlex.quote(ssh)} --include 'hs_*.safetensors' "
                            f"--exclude '*' {shlex.quote(src_dir)} {shlex.quote(f'{dst.user}@{addr}:{dst_dir}')}",
                            f"rsync {src.name} -> {dst.name}", hint="can this host reach the other over SSH?")
                m = re.search(r"Number of regular files transferred: ([\d,]+)", r.stdout)
                moved += int(m.group(1).replace(",", "")) if m else 0
        finally:
            t.close()
    return {"mode": "host to host", "files": moved}
