"""A redis-server of our own on a port of its own (``start_redis``: daemonized,
nothing saved), to pause, kill and start again on the same port; over TLS
alone when given certificates, or on a Unix socket alone when asked."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from dataservice.errors import ServiceSetupError
from dataservice_tools.localservices.certificates import Certificates
from dataservice_tools.localservices.lifecycle import local_redis_url, start_redis, unix_redis_url
from dataservice_tools.localservices.probes import free_port


def gone(pid: int) -> bool:
    """Gone, or a zombie (its sockets closed) that nobody has reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


class PrivateRedis:
    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        also_bind: Sequence[str] = (),
        certificates: Certificates | None = None,
        *,
        unix_socket: bool = False,
    ) -> None:
        self.directory = directory
        self.also_bind = tuple(also_bind)
        self.certificates = certificates
        # On a Unix socket alone: no port (0 is redis-server's "none").
        self.socket = (directory / "redis" / "redis.sock").absolute() if unix_socket else None
        self.port = 0 if unix_socket else port or free_port()
        # Over TLS, the URL also names the CA to trust: base is not enough.
        self.base = f"{'rediss' if certificates else 'redis'}://127.0.0.1:{self.port}"
        self.url = local_redis_url(self.port, certificates)
        if self.socket is not None:
            # Its database goes in the query (url_of), not after base.
            self.base = self.url = unix_redis_url(self.socket)

    def url_of(self, db: int) -> str:
        """The URL of its database ``db``."""
        if self.socket is not None:
            return unix_redis_url(self.socket, db)
        return local_redis_url(self.port, self.certificates, db)

    def start(self, extra: Sequence[str] = ()) -> None:
        start_redis(
            self.directory,
            self.port,
            self.also_bind,
            extra,
            self.certificates,
            unix_socket=self.socket,
        )

    def pid(self) -> int:
        return int((self.directory / "redis" / "redis.pid").read_text())

    def signal(self, signum: int) -> None:
        """Send ``signum``; after SIGKILL, wait until the port is let go."""
        pid = self.pid()
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while signum == signal.SIGKILL and not gone(pid):
            if time.monotonic() > deadline:
                raise ServiceSetupError(f"redis-server (pid {pid}) outlived SIGKILL")
            time.sleep(0.01)
