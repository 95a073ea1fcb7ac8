"""TCP options that end a connection whose path is dead.

A network cut leaves connections half-open: nothing is refused, nothing
arrives, and a client waiting for an answer waits until TCP's
retransmissions reach a healed path, seconds to minutes later. With these
options a connection idle for 1 s is probed every second and ends at the
third unanswered probe, and one whose sent data goes unacknowledged for 3 s
ends then; the client then reconnects as soon as the path is back. A server
that is merely stalled (stopped, busy) keeps its connections: its kernel
still answers both.

Used on the broker's connections, and on each worker process's
administrative database connection. Not on the pools' database connections:
one abandoned this way lives on at the server (it cannot tell), so
reconnecting beside it would take the service past its share of the
database's connections (in a partition of the database, the pools' new
connections and the server's stale ones came to 14 where the share was 10).
The administrative connection can afford it: when it ends, custody holds it
like any other connection let go of (:mod:`dataservice.store.custody`).
"""

from __future__ import annotations

import socket

KEEPALIVE: dict[int, int] = {
    socket.TCP_KEEPIDLE: 1,
    socket.TCP_KEEPINTVL: 1,
    socket.TCP_KEEPCNT: 3,
    socket.TCP_USER_TIMEOUT: 3000,
}


def keep_alive(sock: socket.socket) -> None:
    """Set :data:`KEEPALIVE` on a TCP socket (a Unix socket needs none)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in KEEPALIVE.items():
        sock.setsockopt(socket.IPPROTO_TCP, option, value)
