"""A network of our own to cut: worker processes in a network namespace,
reaching each server over a veth pair of its own.

``NetworkNamespace.create()`` makes the namespace and, per path (``redis``,
``db``), a veth pair on a /30 of 10.201.0.0/16: the server side's address
(``host(path)``) stays in this namespace, where a server binds it, and the
other end (``peer(path)``) goes into the new one, where the workers run
(``prefix()`` is the command that runs a program there). ``cut(path)`` sets
the server side's link down: packets on that path are dropped, not refused,
so open connections go half-open and new ones get no answer, while both ends
keep running; ``heal(path)`` sets it up again and the connections carry on.
Processes of this namespace reach the server side's address whatever its
link does (it is one of their own), so callers are never cut off.

Needs root (``CAP_NET_ADMIN``) and ``ip`` from iproute2.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess

from dataservice.errors import ServiceSetupError

PATHS = ("redis", "db")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    ip = shutil.which("ip")
    if ip is None:
        raise ServiceSetupError("a partition needs 'ip' (iproute2), which is not installed")
    done = subprocess.run([ip, *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ServiceSetupError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


class NetworkNamespace:
    def __init__(self) -> None:
        tag = f"{os.getpid() % 100_000}"
        self.name = f"ds-part-{tag}"
        self._links = {path: f"ds{path[0]}{tag}" for path in PATHS}
        # Two /30s side by side, somewhere in 10.201.0.0/16.
        base = random.Random().randrange(0, 1 << 14) * 4 & 0xFFF8
        self._subnets = {path: base + 4 * n for n, path in enumerate(PATHS)}
        self._created = False

    def host(self, path: str) -> str:
        """The server side's address on ``path``: bind the server to it."""
        return self._address(path, 1)

    def peer(self, path: str) -> str:
        """The workers' address on ``path`` (a database user's host)."""
        return self._address(path, 2)

    def _address(self, path: str, last: int) -> str:
        n = self._subnets[path] + last
        return f"10.201.{n >> 8}.{n & 0xFF}"

    def prefix(self) -> list[str]:
        """The command that runs a program in the namespace (put before its argv)."""
        ip = shutil.which("ip") or "ip"
        return [ip, "netns", "exec", self.name]

    def create(self) -> None:
        if os.geteuid() != 0:
            raise ServiceSetupError("a partition needs root (CAP_NET_ADMIN) for its namespace")
        taken = _ip("-4", "-o", "addr", "show").stdout
        if any(self.host(path) in taken for path in PATHS):
            raise ServiceSetupError("the partition's addresses are in use; try again")
        _ip("netns", "add", self.name)
        self._created = True
        _ip("-n", self.name, "link", "set", "lo", "up")
        for path, link in self._links.items():
            inside = link + "n"
            _ip("link", "add", link, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", self.name)
            _ip("addr", "add", f"{self.host(path)}/30", "dev", link)
            _ip("-n", self.name, "addr", "add", f"{self.peer(path)}/30", "dev", inside)
            _ip("-n", self.name, "link", "set", inside, "up")
            _ip("link", "set", link, "up")

    def cut(self, path: str) -> None:
        _ip("link", "set", self._links[path], "down")

    def heal(self, path: str) -> None:
        _ip("link", "set", self._links[path], "up")

    def delete(self) -> None:
        """Remove the namespace and both pairs (deleting one end of a pair deletes both)."""
        if not self._created:
            return
        for link in self._links.values():
            _ip("link", "del", link, check=False)
        _ip("netns", "del", self.name, check=False)
        self._created = False
