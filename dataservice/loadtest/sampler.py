"""The database's own view of the system under test, sampled as root.

Every tick reads ``information_schema.PROCESSLIST`` for the system's MariaDB
user: its connections, and its active statements (``COMMAND = 'Query'``). The
sampler connects as root, so its own connection is never counted. Every tick
also reads that user's ``TOTAL_CONNECTIONS`` from
``information_schema.USER_STATISTICS``: the server's exact count of
connections opened, so new connections per second miss none that opened and
closed between two ticks. Nothing here asks the service for its own counters.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import MySQLdb
from sqlalchemy.engine import make_url

TARGET_HZ = 50.0

_PROCESSES = "SELECT ID, COMMAND, STATE FROM information_schema.PROCESSLIST WHERE USER = %s"
_TOTALS = "SELECT TOTAL_CONNECTIONS FROM information_schema.USER_STATISTICS WHERE USER = %s"


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the run's start
    connections: int
    active: int
    opened_total: int  # TOTAL_CONNECTIONS delta since the sampler started
    share_active: int  # what the replicas alive at t may hold by the budget
    share_connections: int


def connect_root(root_url: str) -> Any:
    url = make_url(root_url)
    return MySQLdb.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 3306,
        user=url.username or "root",
        password=url.password or "",
        autocommit=True,
        connect_timeout=2,
    )


ShareFn = Callable[[float], tuple[int, int]]


@dataclass
class Sampler:
    root_url: str
    user: str
    t0: float
    share: ShareFn  # monotonic time -> (active share, connection share)
    interval_s: float = 1 / TARGET_HZ
    samples: list[Sample] = field(default_factory=list)
    # How often each server STATE was seen on an active statement, per second
    # of the run: says what the database was doing when something stalled.
    states: dict[int, Counter[str]] = field(default_factory=dict)
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="db-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def achieved_hz(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        span = self.samples[-1].t - self.samples[0].t
        return (len(self.samples) - 1) / span if span > 0 else 0.0

    def _total(self, cursor: Any) -> int:
        cursor.execute(_TOTALS, (self.user,))
        row = cursor.fetchone()
        return int(row[0]) if row else 0

    def _run(self) -> None:
        try:
            conn = connect_root(self.root_url)
        except MySQLdb.Error as exc:
            self.error = f"sampler cannot connect: {type(exc).__name__}"
            return
        try:
            cursor = conn.cursor()
            base = self._total(cursor)
            next_tick = time.monotonic()
            while not self._stop.is_set():
                now = time.monotonic()
                cursor.execute(_PROCESSES, (self.user,))
                rows = cursor.fetchall()
                opened = self._total(cursor) - base
                active_share, conn_share = self.share(now)
                self.samples.append(
                    Sample(
                        t=now - self.t0,
                        connections=len(rows),
                        active=sum(1 for _, command, _ in rows if command == "Query"),
                        opened_total=opened,
                        share_active=active_share,
                        share_connections=conn_share,
                    )
                )
                second = self.states.setdefault(math.floor(now - self.t0), Counter())
                second.update(str(state or "-") for _, command, state in rows if command == "Query")
                next_tick += self.interval_s
                delay = next_tick - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                else:
                    # Behind (a busy machine): sample again at once, do not bunch up.
                    next_tick = time.monotonic()
        except MySQLdb.Error as exc:
            self.error = f"sampler failed: {type(exc).__name__}"
        finally:
            conn.close()


def kill_connections(root_url: str, user: str) -> int:
    """KILL every connection of ``user`` (as root); how many were killed."""
    conn = connect_root(root_url)
    killed = 0
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (user,))
        for (ident,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL CONNECTION {int(ident)}")
                killed += 1
            except MySQLdb.OperationalError:
                pass  # it closed on its own in between
    finally:
        conn.close()
    return killed
