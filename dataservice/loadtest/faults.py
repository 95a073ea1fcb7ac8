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

import os
import signal
import tempfile
import time
from enum import StrEnum
from pathlib import Path

from dataservice.errors import ServiceSetupError
from dataservice.localservices import free_port, start_redis
from dataservice.localservices.mariadb import PrivateMariaDB

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


def _wait_gone(pid: int, what: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return
        time.sleep(0.01)
    raise ServiceSetupError(f"{what} (pid {pid}) outlived SIGKILL")


class PrivateServers:
    """A redis-server and a mariadbd for one run, in a temporary directory."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="dataservice-faults-")
        # mariadbd runs as the mysql user, which must reach its directory.
        os.chmod(self._tmp.name, 0o755)
        self.directory = Path(self._tmp.name)
        self.redis_port = free_port()
        # Per-user connection totals from the first connection, and again after
        # a restart (SET GLOBAL does not survive one): a reconnect storm counts.
        self.mariadb = PrivateMariaDB(
            self.directory / "mariadb", free_port(), options=("--userstat=1",)
        )

    @property
    def redis_base(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}"

    @property
    def root_url(self) -> str:
        return f"mysql+mysqldb://root@127.0.0.1:{self.mariadb.port}/"

    def start(self) -> PrivateServers:
        self.start_redis()
        self.mariadb.start()
        return self

    def start_redis(self) -> None:
        start_redis(self.directory, self.redis_port)

    def redis_pid(self) -> int:
        return int((self.directory / "redis" / "redis.pid").read_text())

    def mariadb_pid(self) -> int:
        assert self.mariadb.process is not None
        return self.mariadb.process.pid

    def begin(self, fault: Fault) -> None:
        if fault is Fault.REDIS_STALL:
            os.kill(self.redis_pid(), signal.SIGSTOP)
        elif fault is Fault.DB_STALL:
            os.kill(self.mariadb_pid(), signal.SIGSTOP)
        elif fault is Fault.REDIS_RESTART:
            pid = self.redis_pid()
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, "redis-server")
        elif fault is Fault.DB_RESTART:
            assert self.mariadb.process is not None
            self.mariadb.process.kill()
            self.mariadb.process.wait()

    def end(self, fault: Fault) -> None:
        if fault is Fault.REDIS_STALL:
            os.kill(self.redis_pid(), signal.SIGCONT)
        elif fault is Fault.DB_STALL:
            os.kill(self.mariadb_pid(), signal.SIGCONT)
        elif fault is Fault.REDIS_RESTART:
            self.start_redis()
        elif fault is Fault.DB_RESTART:
            self.mariadb.start()

    def stop(self) -> None:
        for pid in (self._pid_or_none(self.redis_pid), self._pid_or_none(self.mariadb_pid)):
            if pid is not None:
                for signum in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, signum)
                    except ProcessLookupError:
                        break
        if self.mariadb.process is not None:
            self.mariadb.process.wait()
        self._tmp.cleanup()

    @staticmethod
    def _pid_or_none(read: object) -> int | None:
        try:
            return read()  # type: ignore[operator, no-any-return]
        except (OSError, ValueError, AssertionError):
            return None
