"""The database's own view of the system under test, sampled as root.

Every tick reads ``information_schema.PROCESSLIST`` for the system's MariaDB
user (its connections, and its active statements: ``COMMAND = 'Query'``) and
that user's ``TOTAL_CONNECTIONS`` from ``information_schema.USER_STATISTICS``:
the server's exact count of connections opened, so new connections per
second miss none that opened and closed between two ticks. The sampler
connects as root, so its own connection is never counted. Nothing here asks
the service for its own counters.

The ticks run in a process of their own (:mod:`.probe`): in the harness's
process, beside thousands of caller threads taking turns at one interpreter
lock, a sampler asked for 100 Hz managed 50, with gaps of 400 ms. The
harness's side (:class:`Sampler`) reads its lines and sets each sample
against the share of the replicas alive when it was taken; both processes
read ``CLOCK_MONOTONIC``, one clock for the machine. A sample's time is when
the server's answer arrived: a query sent into a stalled server is answered
when it runs again, and shows that moment.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import MySQLdb
from sqlalchemy.engine import make_url

from dataservice_tools.loadtest import probe
from dataservice_tools.loadtest.probe import READ_TIMEOUT_S
from dataservice_tools.loadtest.stalls import stop_child

TARGET_HZ = 50.0


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the run's start
    connections: int
    active: int
    opened_total: int  # TOTAL_CONNECTIONS delta since the sampler started
    share_active: int  # what the replicas alive at t may hold by the budget
    share_connections: int


def address(root_url: str) -> dict[str, Any]:
    """The server and account of ``root_url``, as the driver takes them."""
    url = make_url(root_url)
    return {
        "host": url.host or "127.0.0.1",
        "port": url.port or 3306,
        "user": url.username or "root",
        "password": url.password or "",
    }


def connect_root(root_url: str) -> Any:
    return probe.connect(address(root_url))


ShareFn = Callable[[float], tuple[int, int]]


@dataclass
class Sampler:
    """The sampling process, started and stopped around the measured part of
    a run, and what it saw: each sample against the share at its time."""

    root_url: str
    user: str
    t0: float
    share: ShareFn  # monotonic time -> (active share, connection share)
    interval_s: float = 1 / TARGET_HZ
    read_timeout_s: int = READ_TIMEOUT_S
    samples: list[Sample] = field(default_factory=list)
    # How often each server STATE was seen on an active statement, per second
    # of the run: says what the database was doing when something stalled.
    states: dict[int, Counter[str]] = field(default_factory=dict)
    error: str | None = None
    # Times the server stopped answering and the sampler connected again.
    gaps: int = 0
    _process: subprocess.Popen[str] | None = None
    _reader: threading.Thread | None = None

    def start(self) -> None:
        argv = [
            sys.executable, "-m", probe.__name__, "--user", self.user,
            "--interval", str(self.interval_s), "--read-timeout", str(self.read_timeout_s),
        ]  # fmt: skip
        self._process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(json.dumps(address(self.root_url)) + "\n")
        stdin.close()
        self._reader = threading.Thread(
            target=self._read, args=(stdout,), name="db-sampler", daemon=True
        )
        self._reader.start()

    def stop(self) -> None:
        stop_child(self._process, self._reader)
        self._process = None

    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def achieved_hz(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        span = self.samples[-1].t - self.samples[0].t
        return (len(self.samples) - 1) / span if span > 0 else 0.0

    def _read(self, stdout: IO[str]) -> None:
        for line in stdout:
            self._take(json.loads(line))

    def _take(self, record: dict[str, Any]) -> None:
        if "error" in record:
            self.error = str(record["error"])
            return
        if "gap" in record:
            self.gaps += 1
            return
        at = float(record["at"])
        active_share, conn_share = self.share(at)
        self.samples.append(
            Sample(
                t=at - self.t0,
                connections=int(record["connections"]),
                active=int(record["active"]),
                opened_total=int(record["opened"]),
                share_active=active_share,
                share_connections=conn_share,
            )
        )
        if record["states"]:
            second = self.states.setdefault(math.floor(at - self.t0), Counter())
            second.update(record["states"])


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
