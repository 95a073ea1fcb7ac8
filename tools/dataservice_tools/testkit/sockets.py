"""This process's own TCP sockets (Linux: its open descriptors matched against
``/proc/net/tcp`` and ``/proc/net/tcp6``): how many connections it holds to a
port, and which local ports are its own (to tell its connections apart from
everyone else's in a server's client list)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# The ``st`` column of proc(5)'s TCP table.
_ESTABLISHED = "01"


@dataclass(frozen=True, slots=True)
class Socket:
    local_port: int
    remote_port: int
    established: bool


def own_sockets() -> list[Socket]:
    """The TCP sockets this process has open now."""
    inodes: set[str] = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found: list[Socket] = []
    for table in _TABLES:
        for fields in (line.split() for line in Path(table).read_text().splitlines()[1:]):
            if fields[9] in inodes:
                local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
                found.append(Socket(local, remote, fields[3] == _ESTABLISHED))
    return found


def own_local_ports() -> set[int]:
    """The local ports of this process's TCP sockets."""
    return {s.local_port for s in own_sockets()}


def connections_to(port: int) -> int:
    """This process's established TCP connections to ``port``."""
    return sum(s.established and s.remote_port == port for s in own_sockets())
