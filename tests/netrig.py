"""Several test hosts on this machine, each in its own network namespace with its own address
and its own real sshd (port 22 there), joined by a bridge that also gives this (the laptop's)
namespace an address: 10.77.0.1 here, 10.77.0.2, .3, ... for the hosts."""

from __future__ import annotations

import shutil
import subprocess

from rig import Rig

BRIDGE = "specops-br0"
NET = "10.77.0"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def netns_works() -> bool:
    if shutil.which("ip") is None:
        return False
    p = subprocess.run(["ip", "netns", "add", "specops-probe"], capture_output=True)
    if p.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", "specops-probe"], capture_output=True)
    return True


class NetRig:
    def __init__(self, n: int = 2):
        self.n = n
        self.rigs: list[Rig] = []
        self.ifaces: list[str] = []

    def start(self) -> "NetRig":
        self.teardown_net()
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{NET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for i in range(self.n):
            ns, out, inside = f"specops-ns{i}", f"spv{i}", f"spv{i}-in"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", out, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", ns)
            sh("ip", "link", "set", out, "master", BRIDGE, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{NET}.{i + 2}/24", "dev", inside)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", inside, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
            self.ifaces.append(inside)
            self.rigs.append(Rig(address=f"{NET}.{i + 2}", port=22, netns=ns).start())
        return self

    def stop(self) -> None:
        for r in self.rigs:
            r.stop()
        self.teardown_net()

    def teardown_net(self) -> None:
        for i in range(self.n):
            subprocess.run(["ip", "netns", "del", f"specops-ns{i}"], capture_output=True)
            subprocess.run(["ip", "link", "del", f"spv{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
