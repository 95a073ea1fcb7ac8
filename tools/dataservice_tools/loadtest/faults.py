"""Faults injected mid-run (``dataservice loadtest --fault``), on a Redis and a
MariaDB of the run's own: the shared servers are never stopped.

    redis-stall      redis-server stopped (SIGSTOP) for ``FAULT_S``, then continued
    redis-restart    redis-server killed (SIGKILL) and started again on the same
                     port ``DOWN_S`` later, empty (it saves nothing)
    db-stall         mariadbd stopped (SIGSTOP) for ``FAULT_S``, then continued
    db-stall-long    mariadbd stopped (SIGSTOP) for ``PAST_READ_TIMEOUT_S`` longer
                     than the driver's read timeout, then continued
    db-restart       mariadbd killed (SIGKILL) and started again on the same data
                     directory (crash recovery included)
    partition-redis  the worker replicas cut off from Redis for ``FAULT_S``, both
                     running: packets dropped, connections half-open
    partition-db     the worker replicas cut off from MariaDB, likewise

A stall keeps every connection open while nothing answers, the worst case for
a deadline: only a bounded wait notices. A partition runs the replicas in a
network namespace of the run's own (:mod:`dataservice_tools.localservices.netns`),
reaching Redis and MariaDB over a veth pair each, and sets one pair's link
down: callers, the harness and the servers keep their own way in. The fault
begins at ``AT`` of the run.

``db-stall-long`` outlasts the driver's read timeout
(:func:`dataservice.store.engine.driver_read_timeout_s`, 7 s with the shipped
``queues.yml``, so the stall is 10 s): every statement in flight is given up
by its client while the server still holds it, and what the replicas do next
(new connections, permits handed out again) meets the server's old statements
when it continues. Its consequences show in the first moments after the
stall, so the run watches them: it lasts until ``WATCH_AFTER_S`` after the
stall's end at least (a shorter ``--duration`` is lengthened, the stall
still beginning at ``AT`` of the run), and the database sampler reads every
``WATCHED_SAMPLE_S``, on a connection that waits the stall out
(:meth:`Fault.sampling`): its query is answered the moment the server
continues, where a new connection would wait for a greeting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import tempfile
from enum import StrEnum
from pathlib import Path

from dataservice.config.settings import Settings
from dataservice.errors import ServiceSetupError
from dataservice_tools.loadtest.environment import LOCAL_HOSTS
from dataservice_tools.loadtest.probe import READ_TIMEOUT_S
from dataservice_tools.localservices import PrivateMariaDB, PrivateRedis, free_port
from dataservice_tools.localservices.netns import NetworkNamespace

AT = 0.4
FAULT_S = 4.0
DOWN_S = 2.0
# db-stall-long: this much past the driver's read timeout, so that every
# client has given up on its statement before the server runs again.
PAST_READ_TIMEOUT_S = 3.0
# How long after db-stall-long's end the run goes on, sampled closely: the
# overlap of old statements and new ones lasted about 100 ms when CI caught it.
WATCH_AFTER_S = 10.0
WATCHED_SAMPLE_S = 0.01
FAULT_BEGINS = "fault begins"
FAULT_ENDS = "fault ends"


class Fault(StrEnum):
    REDIS_STALL = "redis-stall"
    REDIS_RESTART = "redis-restart"
    DB_STALL = "db-stall"
    DB_STALL_LONG = "db-stall-long"
    DB_RESTART = "db-restart"
    PARTITION_REDIS = "partition-redis"
    PARTITION_DB = "partition-db"

    def lasts_s(self, read_timeout_s: float) -> float:
        """From the fault's start to its end (the server answering again), with
        the driver's read timeout at ``read_timeout_s``."""
        if self is Fault.DB_STALL_LONG:
            return read_timeout_s + PAST_READ_TIMEOUT_S
        return DOWN_S if self in (Fault.REDIS_RESTART, Fault.DB_RESTART) else FAULT_S

    @property
    def stalls(self) -> bool:
        """Whether the fault stops a server (SIGSTOP) rather than ending it or a path."""
        return self in (Fault.REDIS_STALL, Fault.DB_STALL, Fault.DB_STALL_LONG)

    @property
    def cuts(self) -> str | None:
        """The path a partition cuts (``redis``, ``db``), None for other faults."""
        return {Fault.PARTITION_REDIS: "redis", Fault.PARTITION_DB: "db"}.get(self)

    @property
    def watch_after_s(self) -> float:
        """How long after the fault's end the share is watched closely (0: not)."""
        return WATCH_AFTER_S if self is Fault.DB_STALL_LONG else 0.0

    def settles_after_s(self, read_timeout_s: float) -> float:
        """How long after the fault begins its consequences may last, whatever
        its end: a database partition leaves statements stuck on connections
        nothing answers until the driver's read timeout ends them (the
        driver takes no per-call timeout; docs/operations.md, "Faults")."""
        return read_timeout_s if self is Fault.PARTITION_DB else 0.0

    def run_s(self, duration_s: float, read_timeout_s: float) -> float:
        """How long a run asked to last ``duration_s`` lasts: long enough for the
        load before the fault, the fault and ``watch_after_s`` after it."""
        if not self.watch_after_s:
            return duration_s
        needed = (self.lasts_s(read_timeout_s) + self.watch_after_s) / (1 - AT)
        return max(duration_s, float(math.ceil(needed)))

    def sampling(self, read_timeout_s: float) -> tuple[float, int] | None:
        """How often the database sampler reads in this fault's run, and its
        read timeout (whole seconds, as the driver takes it); None: its own.
        Past the stall when the run watches its end: the query sent into the
        stall is answered as it ends (0.8 ms after SIGCONT, measured), where a
        connection lost to a timeout would need a new one and its greeting."""
        if not self.watch_after_s:
            return None
        return WATCHED_SAMPLE_S, math.ceil(self.lasts_s(read_timeout_s)) + READ_TIMEOUT_S

    def events(self, duration_s: float, read_timeout_s: float) -> dict[str, float]:
        """When the fault begins and ends (seconds from the run's start)."""
        begins = AT * duration_s
        return {FAULT_BEGINS: begins, FAULT_ENDS: begins + self.lasts_s(read_timeout_s)}


FAULTS = tuple(f.value for f in Fault)


class PrivateServers:
    """A redis-server and a mariadbd for one run, in a temporary directory, and
    what ``fault`` does to one of them."""

    def __init__(self, fault: Fault, system: str = "service") -> None:
        if fault.cuts and system != "service":
            raise ServiceSetupError("a partition fault runs against the service only")
        self.fault = fault
        self._tmp = tempfile.TemporaryDirectory(prefix="dataservice-faults-")
        # mariadbd runs as the mysql user, which must reach its directory.
        os.chmod(self._tmp.name, 0o755)
        directory = Path(self._tmp.name)
        # Per-user connection totals from the first connection, and again after
        # a restart (SET GLOBAL does not survive one): a reconnect storm counts.
        options: tuple[str, ...] = ("--userstat=1",)
        self.netns = NetworkNamespace() if fault.cuts else None
        also_bind: tuple[str, ...] = ()
        db_address = "127.0.0.1"
        if self.netns is not None:
            also_bind, db_address = (self.netns.host("redis"),), self.netns.host("db")
            options += ("--skip-name-resolve", f"--init-file={self._root_at(db_address)}")
        self.redis = PrivateRedis(directory, also_bind=also_bind)
        self.mariadb = PrivateMariaDB(
            directory / "mariadb", free_port(), options=options, bind_address=db_address
        )

    def _root_at(self, address: str) -> Path:
        """A start-up file that lets root in from ``address`` (the server has only that one)."""
        path = Path(self._tmp.name) / "root.sql"
        user = f"'root'@'{address}'"
        path.write_text(
            f"CREATE USER IF NOT EXISTS {user};\n"
            f"GRANT ALL PRIVILEGES ON *.* TO {user} WITH GRANT OPTION;\n"
        )
        path.chmod(0o644)
        return path

    @property
    def root_url(self) -> str:
        return f"mysql+mysqldb://root@{self.mariadb.bind_address}:{self.mariadb.port}/"

    def worker_settings(self, settings: Settings) -> Settings:
        """``settings`` as the replicas use them: Redis over its veth pair in a
        partition run (MariaDB has only that way in for everyone)."""
        if self.netns is None:
            return settings
        base = f"redis://{self.netns.host('redis')}:{self.redis.port}"

        def swap(url: str) -> str:
            return url.replace(self.redis.base, base, 1)

        return dataclasses.replace(
            settings,
            broker_url=swap(settings.broker_url),
            result_backend_url=swap(settings.result_backend_url),
            redis_url=swap(settings.redis_url),
        )

    def database_hosts(self) -> tuple[str, ...]:
        """The hosts a database user connects from: the replicas' address too in a partition."""
        if self.netns is None:
            return LOCAL_HOSTS
        return (self.netns.host("db"), self.netns.peer("db"))

    def worker_prefix(self) -> list[str]:
        """What runs a replica where it can be cut off (nothing outside a partition run)."""
        return [] if self.netns is None else self.netns.prefix()

    def start(self) -> None:
        if self.netns is not None:
            self.netns.create()
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
        if self.netns is not None and self.fault.cuts:
            self.netns.cut(self.fault.cuts)
            return
        self._signal(signal.SIGSTOP if self.fault.stalls else signal.SIGKILL)

    def end(self) -> None:
        if self.netns is not None and self.fault.cuts:
            self.netns.heal(self.fault.cuts)
        elif self.fault is Fault.REDIS_RESTART:
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
        if self.netns is not None:
            self.netns.delete()
        self._tmp.cleanup()
