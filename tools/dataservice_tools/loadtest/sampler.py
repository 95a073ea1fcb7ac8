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
# After losing the server, try again this often.
RECONNECT_S = 0.2

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
        # A stalled server must cost the sampler a gap, not its thread.
        read_timeout=2,
        write_timeout=2,
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
    # Times the server stopped answering and the sampler connected again.
    gaps: int = 0
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
        """Sample until stopped; a lost server (a fault run stops or restarts it)
        leaves a gap and a reconnection, its totals carried across a restart."""
        connected = False
        base = carried = 0
        while not self._stop.is_set():
            try:
                conn = connect_root(self.root_url)
            except MySQLdb.Error as exc:
                if not connected:
                    self.error = f"sampler cannot connect: {type(exc).__name__}"
                    return
                self._stop.wait(RECONNECT_S)
                continue
            try:
                cursor = conn.cursor()
                if not connected:
                    base, carried = self._total(cursor), 0
                elif self._restarted(cursor):
                    # It counts its connections from zero again.
                    base, carried = 0, self.samples[-1].opened_total if self.samples else 0
                connected = True
                self._sample(cursor, base, carried)
            except MySQLdb.Error:
                self.gaps += 1
                self._stop.wait(RECONNECT_S)
            finally:
                conn.close()

    def _restarted(self, cursor: Any) -> bool:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Uptime'")
        row = cursor.fetchone()
        last = self.samples[-1].t if self.samples else 0.0
        since_last = time.monotonic() - self.t0 - last
        return row is not None and int(row[1]) <= since_last + 1

    def _sample(self, cursor: Any, base: int, carried: int) -> None:
        """Sample on one connection until stopped (returns) or it fails (raises);
        ``carried``: new connections counted before this one."""
        next_tick = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            cursor.execute(_PROCESSES, (self.user,))
            rows = cursor.fetchall()
            opened = carried + self._total(cursor) - base
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
