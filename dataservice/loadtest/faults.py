"""Faults injected mid-run (``dataservice loadtest --fault``), on a Redis and a
MariaDB of the run's own: the shared servers are never stopped.

    redis-stall      redis-server stopped (SIGSTOP) for ``FAULT_S``, then continued
    redis-restart    redis-server killed (SIGKILL) and started again on the same
                     port ``DOWN_S`` later, empty (it saves nothing)
    db-stall         mariadbd stopped (SIGSTOP) for ``FAULT_S``, then continued
    db-restart       mariadbd killed (SIGKILL) and started again on the same data
                     directory (crash recovery included)

A stall keeps every connection open while nothing answers, the worst case for
a deadline: only a bounded wait notices. The fault begins at ``AT`` of the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from enum import StrEnum
from pathlib import Path

from dataservice.localservices import PrivateMariaDB, PrivateRedis, free_port

AT = 0.4
FAULT_S = 4.0
DOWN_S = 2.0
FAULT_BEGINS = "fault begins"
FAULT_ENDS = "fault ends"


class Fault(StrEnum):
    REDIS_STALL = "redis-stall"
    REDIS_RESTART = "redis-restart"
    DB_STALL = "db-stall"
    DB_RESTART = "db-restart"

    @property
    def lasts_s(self) -> float:
        """From the fault's start to its end (the server answering again)."""
        return DOWN_S if self in (Fault.REDIS_RESTART, Fault.DB_RESTART) else FAULT_S

    def events(self, duration_s: float) -> dict[str, float]:
        """When the fault begins and ends (seconds from the run's start)."""
        begins = AT * duration_s
        return {FAULT_BEGINS: begins, FAULT_ENDS: begins + self.lasts_s}


FAULTS = tuple(f.value for f in Fault)


class PrivateServers:
    """A redis-server and a mariadbd for one run, in a temporary directory, and
    what ``fault`` does to one of them."""

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self._tmp = tempfile.TemporaryDirectory(prefix="dataservice-faults-")
        # mariadbd runs as the mysql user, which must reach its directory.
        os.chmod(self._tmp.name, 0o755)
        directory = Path(self._tmp.name)
        self.redis = PrivateRedis(directory)
        # Per-user connection totals from the first connection, and again after
        # a restart (SET GLOBAL does not survive one): a reconnect storm counts.
        self.mariadb = PrivateMariaDB(directory / "mariadb", free_port(), options=("--userstat=1",))

    @property
    def root_url(self) -> str:
        return f"mysql+mysqldb://root@127.0.0.1:{self.mariadb.port}/"

    def start(self) -> None:
        self.redis.start()
        self.mariadb.start()

    def _signal(self, signum: int) -> None:
        if self.fault in (Fault.REDIS_STALL, Fault.REDIS_RESTART):
            self.redis.signal(signum)
        elif self.mariadb.process is not None:
            self.mariadb.process.send_signal(signum)
            if signum == signal.SIGKILL:
                self.mariadb.process.wait()

    def begin(self) -> None:
        stall = self.fault in (Fault.REDIS_STALL, Fault.DB_STALL)
        self._signal(signal.SIGSTOP if stall else signal.SIGKILL)

    def end(self) -> None:
        if self.fault is Fault.REDIS_RESTART:
            self.redis.start()
        elif self.fault is Fault.DB_RESTART:
            self.mariadb.start()
        else:
            self._signal(signal.SIGCONT)

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.redis.signal(signal.SIGCONT)
            self.redis.signal(signal.SIGKILL)
        if self.mariadb.process is not None:
            self.mariadb.process.send_signal(signal.SIGCONT)
            self.mariadb.process.kill()
            self.mariadb.process.wait()
        self._tmp.cleanup()
