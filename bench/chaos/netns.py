"""Network namespaces for the chaos soak's replicas, so that a partition can be made.

Each namespace is joined to this one by a veth pair with a /30 of its own (this side .1, the
namespace .2). `partition()` takes the namespace's end down: packets either way vanish, with
no reset and no refusal, as when a switch or a cable fails, and connections in flight hear
nothing until `heal()`. The same recipe as `testkit/src/netns.rs`, which the Rust tests use.
Needs root and `ip` (iproute2): `available()` says whether they are here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import List


def available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class Netns:
    """Namespace `dqc<pid>n<k>` on 10.216.<k>.0/30; `addr` is where its processes listen."""

    def __init__(self, k: int):
        pid = os.getpid()
        self.name = f"dqc{pid}n{k}"
        # Interface names have at most 15 bytes.
        self.link, self.peer = f"dqch{pid % 10000}x{k}", f"dqcp{pid % 10000}x{k}"
        here, self.addr = f"10.216.{k}.1", f"10.216.{k}.2"
        self.partitioned = False
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        ip("netns", "add", self.name)
        try:
            ip("link", "add", self.link, "type", "veth", "peer", "name", self.peer)
            ip("link", "set", self.peer, "netns", self.name)
            ip("addr", "add", f"{here}/30", "dev", self.link)
            ip("link", "set", self.link, "up")
            ip("-n", self.name, "addr", "add", f"{self.addr}/30", "dev", self.peer)
            ip("-n", self.name, "link", "set", self.peer, "up")
            ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def prefix(self) -> List[str]:
        """What runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def partition(self) -> None:
        ip("-n", self.name, "link", "set", self.peer, "down")
        self.partitioned = True

    def heal(self) -> None:
        ip("-n", self.name, "link", "set", self.peer, "up")
        self.partitioned = False

    def close(self) -> None:
        # Deleting one end deletes the pair; then the namespace.
        subprocess.run(["ip", "link", "del", self.link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
