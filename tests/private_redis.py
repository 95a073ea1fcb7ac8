"""A redis-server of a test's own (``start_redis``: daemonized, nothing
saved), to pause, stall, kill and start again on the same port."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from dataservice.localservices import free_port, start_redis


class PrivateRedis:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        start_redis(self.directory, self.port)

    def signal(self, signum: int) -> None:
        pid = int((self.directory / "redis" / "redis.pid").read_text())
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return
        # Killed, it must let go of its port before it starts again there.
        deadline = time.monotonic() + 10
        while signum == signal.SIGKILL and not _dead(pid):
            assert time.monotonic() < deadline, f"redis-server (pid {pid}) outlived SIGKILL"
            time.sleep(0.01)


def _dead(pid: int) -> bool:
    """Gone, or a zombie (its sockets closed) that nobody has reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
