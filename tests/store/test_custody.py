"""Acceptance: a permit is free when the database has let go, not when the client has.

A private MariaDB (never the shared one) is stopped with SIGSTOP for longer
than the driver's read timeout, or its service connection is cut under a
running statement; the server's own process list, read as root on a
connection of the test's, is the judge: the service's user never has more
statements or connections there than its permits and pool allow, plus the
process's administrative connection.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import MySQLdb
import pytest
import yaml
from dataservice_tools.localservices import TemporaryBinlogMariaDB
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, event

from dataservice.config.budget import ADMIN_CONNECTIONS
from dataservice.config.model import Config, parse_config
from dataservice.enums import LaneName, OperationClass
from dataservice.handler.failures import database_errors
from dataservice.limits.permits import LanePermits
from dataservice.refusals import Refusal
from dataservice.store import Bounds, create_store_engine
from dataservice.store.connections import ConnectionsInDoubt, now_ms
from dataservice.store.custody import CONNECTION_ID, Custody, custody_of
from dataservice.store.engine import driver_read_timeout_s
from dataservice.store.sessions import Sessions
from tests.conftest import SHIPPED_CONFIG, started_binlog_mariadb

USER = "custody"
PASSWORD = "custody-pw"
PERMITS = 3


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryBinlogMariaDB]:
    mariadb = started_binlog_mariadb()
    root = _root(mariadb)
    cursor = root.cursor()
    cursor.execute("CREATE DATABASE IF NOT EXISTS custody")
    for host in ("127.0.0.1", "localhost"):
        cursor.execute(f"CREATE USER IF NOT EXISTS '{USER}'@'{host}' IDENTIFIED BY '{PASSWORD}'")
        cursor.execute(f"GRANT ALL ON custody.* TO '{USER}'@'{host}'")
    root.close()
    yield mariadb
    mariadb.stop()


def _config(max_statement_ms: int) -> Config:
    data: dict[str, Any] = yaml.safe_load(SHIPPED_CONFIG.read_text())
    data["database"].update(
        max_statement_ms=max_statement_ms, connect_timeout_s=1, pool_timeout_ms=300
    )
    data["lanes"]["interactive"].update(
        permits=PERMITS,
        concurrency=PERMITS,
        classes={"point_read": PERMITS, "point_write": PERMITS, "bounded_list": 1},
    )
    return parse_config(data)


def _engine(server: TemporaryBinlogMariaDB, config: Config) -> Engine:
    url = f"mysql+mysqldb://{USER}:{PASSWORD}@127.0.0.1:{server.port}/custody"
    return create_store_engine(url, PERMITS, config.database)


@pytest.fixture
def config() -> Config:
    # A read timeout of 3 s (1 s statements + 2), so that a stall outlasts it.
    return _config(1000)


@pytest.fixture
def engine(server: TemporaryBinlogMariaDB, config: Config) -> Iterator[Engine]:
    engine = _engine(server, config)
    yield engine
    engine.dispose()


def _root(server: TemporaryBinlogMariaDB) -> Any:
    return MySQLdb.connect(
        host="127.0.0.1", port=server.port, user="root", autocommit=True,
        connect_timeout=2, read_timeout=2,
    )  # fmt: skip


@dataclass
class ProcessList:
    """The service user's connections and active statements, read as root
    every few ms; ``admin`` names the administrative connection, counted apart
    (in every sample, once the run is over: a new administrative connection
    runs its first statement before custody knows its id)."""

    server: TemporaryBinlogMariaDB
    admin: Callable[[], int | None] = lambda: None
    interval_s: float = 0.005
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _raw: list[tuple[float, list[tuple[int, str]]]] = field(default_factory=list)
    _admins: set[int] = field(default_factory=set)

    def __enter__(self) -> ProcessList:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)
        self.samples[:] = [self._sample(t, rows, self._admins) for t, rows in self._raw]

    @staticmethod
    def _sample(t: float, rows: list[tuple[int, str]], admins: set[int]) -> Sample:
        pool = [(i, command) for i, command in rows if i not in admins]
        return Sample(
            t,
            connections=len(pool),
            active=sum(1 for _, command in pool if command == "Query"),
            admin=len(rows) - len(pool),
            ids=frozenset(i for i, _ in pool),
        )

    def _run(self) -> None:
        conn: Any = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = _root(self.server)
                cursor = conn.cursor()
                cursor.execute(
                    "SELECT ID, COMMAND FROM information_schema.PROCESSLIST WHERE USER = %s",
                    (USER,),
                )
                rows = cursor.fetchall()
                cursor.close()
            except MySQLdb.Error:
                conn = None
                continue
            admin = self.admin()
            if admin is not None:
                self._admins.add(admin)
            now, listed = time.monotonic(), [(int(i), str(command)) for i, command in rows]
            self._raw.append((now, listed))
            self.samples.append(self._sample(now, listed, {admin} if admin is not None else set()))
            self._stop.wait(self.interval_s)

    def last_seen(self, connection_id: int) -> float | None:
        seen = [s.t for s in self.samples if connection_id in s.ids]
        return max(seen) if seen else None

    def peaks(self) -> tuple[int, int, int]:
        """The most pooled connections, active statements and administrative
        connections any sample saw."""
        return (
            max((s.connections for s in self.samples), default=0),
            max((s.active for s in self.samples), default=0),
            max((s.admin for s in self.samples), default=0),
        )


@dataclass(frozen=True)
class Sample:
    t: float
    connections: int  # the pool's (all but the administrative one)
    active: int  # statements running on them
    admin: int  # the administrative connection (0 or 1)
    ids: frozenset[int]


@dataclass
class Worker:
    """A lane's permits and sessions over ``engine``, as a worker process holds them."""

    engine: Engine
    config: Config
    permits: LanePermits = field(init=False)
    sessions: Sessions = field(init=False)
    released_at: list[float] = field(default_factory=list)
    # The driver's sockets (file descriptors) by server-side id, as they are checked out.
    checked_out: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.permits = LanePermits(self.config.lanes[LaneName.INTERACTIVE])
        self.permits.on_released = lambda held_s: self.released_at.append(time.monotonic())
        self.sessions = Sessions(self.engine, self.config.database.max_statement_ms)

        def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
            self.checked_out[record.info[CONNECTION_ID]] = dbapi_connection.fileno()

        event.listen(self.engine, "checkout", checkout)

    def run(self, statement: str, deadline_ms: int, wait_s: float = 0.3) -> Any:
        """One statement under a permit, as Database.run runs it."""
        with database_errors(), self.permits.acquire(OperationClass.POINT_READ, wait_s) as p:
            return self.sessions.fetch_one(
                Bounds(p, deadline_ms, connect_by_ms=deadline_ms), statement, ()
            )


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def call() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # the test inspects what happened
            outcome.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    return thread, outcome


def _cut(fileno: int) -> None:
    """End the client's side of a connection, as a failed network path would:
    its statement's read returns at once, the server's goes on."""
    sock = socket.socket(fileno=socket.dup(fileno))
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.close()


def _custody(engine: Engine) -> Custody:
    custody = custody_of(engine)
    assert custody is not None
    return custody


def test_a_statement_cut_off_from_its_client_is_killed_before_its_permit_returns(
    server: TemporaryBinlogMariaDB,
) -> None:
    """The client loses its connection while the server still sleeps in the
    statement: the permit stays taken until a KILL has ended it, long before
    the statement would have ended on its own."""
    config = _config(5000)
    engine = _engine(server, config)
    try:
        worker = Worker(engine, config)
        worker.run("SELECT 1", now_ms() + 2000)  # the pool's connection, then the admin's
        custody = _custody(engine)
        assert eventually(
            lambda: custody.snapshot().admin_connects_total == 1, timeout=5, interval=0.005
        )
        thread, outcome = _in_thread(lambda: worker.run("SELECT SLEEP(4)", now_ms() + 5000))
        assert eventually(
            lambda: worker.permits.snapshot().connection_ids != [], timeout=2, interval=0.005
        )
        (connection_id,) = worker.permits.snapshot().connection_ids
        with ProcessList(server) as listing:
            assert eventually(
                lambda: listing.last_seen(connection_id) is not None, timeout=2, interval=0.005
            )
            # The statement's connection, as the server lists it: cut it on the client's side.
            _cut(worker.checked_out[connection_id])
            thread.join(5)
            assert eventually(
                lambda: worker.permits.snapshot().in_use == 0, timeout=4, interval=0.005
            )
        assert isinstance(outcome[0], Refusal), outcome
        released = worker.released_at[-1]
        last_seen = listing.last_seen(connection_id)
        assert last_seen is not None
        assert last_seen < released
        snap = custody.snapshot()
        assert (snap.abandoned_total, snap.killed_total, snap.held) == (1, 1, 0)
    finally:
        engine.dispose()


def _load(worker: Worker, threads: int, stop: threading.Event) -> list[threading.Thread]:
    """``threads`` callers with interactive deadlines, each running a 0.3 s
    statement, then pausing for up to a third as long: a stall finds some
    statements running and some connections idle, which the callers use while
    the server is stopped (those statements start when it resumes). No
    connection sits idle long enough to be pinged at checkout."""

    def call(seed: int) -> None:
        pause = random.Random(seed)
        while not stop.is_set():
            with contextlib.suppress(Refusal):
                worker.run("SELECT SLEEP(0.3)", now_ms() + 900)
            time.sleep(pause.uniform(0, 0.1))

    started = [threading.Thread(target=call, args=(n,), daemon=True) for n in range(threads)]
    for thread in started:
        thread.start()
    return started


@pytest.mark.fault
def test_a_stall_past_the_read_timeout_never_puts_more_in_the_database_than_the_share(
    server: TemporaryBinlogMariaDB, engine: Engine, config: Config
) -> None:
    """SIGSTOP for longer than the driver's read timeout: every statement in
    flight is abandoned by its client, and its permit comes back only once
    the resumed server has let go of it; no new connection stands beside it."""
    # Long enough for a statement sent a second into the stall to time out too.
    stall_s = driver_read_timeout_s(config.database) + 2.0
    worker = Worker(engine, config)
    custody = _custody(engine)
    stop = threading.Event()
    assert server.process is not None
    with ProcessList(server, lambda: custody.snapshot().admin_connection_id) as listing:
        threads = _load(worker, PERMITS + 2, stop)
        time.sleep(1.0)
        stopped_at = time.monotonic()
        server.process.send_signal(signal.SIGSTOP)
        try:
            time.sleep(stall_s)
            # Every permit is held for a statement the server has not let go of.
            held = worker.permits.snapshot()
            assert (held.in_use, held.in_custody) == (PERMITS, PERMITS), custody.snapshot()
            assert not custody.wait_clear(0)
        finally:
            resumed_at = time.monotonic()
            server.process.send_signal(signal.SIGCONT)
        time.sleep(2.0)
        stop.set()
        for thread in threads:
            thread.join(5)
    in_stall = [t - stopped_at for t in worker.released_at if stopped_at + 0.1 < t < resumed_at]
    assert in_stall == [], (in_stall, custody.snapshot())
    assert any(t > resumed_at for t in worker.released_at), "the service never recovered"
    assert len([s for s in listing.samples if s.t > resumed_at]) > 100, "no samples after"
    connections, active, admin = listing.peaks()
    assert connections <= PERMITS, listing.samples
    assert active <= PERMITS, listing.samples
    assert admin <= ADMIN_CONNECTIONS
    snap = custody.snapshot()
    assert snap.abandoned_total >= PERMITS
    assert snap.held == 0
    assert worker.permits.snapshot().in_use == 0


def test_a_discarded_connection_is_confirmed_gone_before_its_slot_connects_again(
    server: TemporaryBinlogMariaDB, engine: Engine, config: Config
) -> None:
    """A connection the pool closes (here: invalidated after an error) holds
    back new connections until the server no longer lists it."""
    worker = Worker(engine, config)
    with ProcessList(server) as listing:
        worker.run("SELECT 1", now_ms() + 2000)
        (first,) = worker.checked_out
        assert eventually(lambda: listing.last_seen(first) is not None, timeout=2, interval=0.005)
        with pytest.raises(Refusal):
            worker.run("SELECT no_such_column", now_ms() + 2000)
        worker.run("SELECT 1", now_ms() + 2000)
        opened = [i for i in worker.checked_out if i != first]
        assert len(opened) == 1
        assert eventually(
            lambda: listing.last_seen(opened[0]) is not None, timeout=2, interval=0.005
        )
    gone = listing.last_seen(first)
    came = min(sample.t for sample in listing.samples if opened[0] in sample.ids)
    assert gone is not None
    assert gone < came
    snap = _custody(engine).snapshot()
    assert snap.discarded_total >= 1
    assert snap.held == 0


def test_a_connection_waits_for_the_gate_only_until_its_connect_by(
    server: TemporaryBinlogMariaDB, engine: Engine, config: Config
) -> None:
    """While a connection is in custody, a request that needs a new one waits
    no longer than it could still use it, then is refused, retryably; once the
    server lets go, connections open again."""
    custody = _custody(engine)
    worker = Worker(engine, config)
    # A connection of the service's user that the process has let go of but
    # the server still holds (the test's own, still open).
    lingering = MySQLdb.connect(
        host="127.0.0.1", port=server.port, user=USER, password=PASSWORD, database="custody"
    )
    custody.discarded(lingering.thread_id(), None)
    started = time.monotonic()
    with pytest.raises(ConnectionsInDoubt):
        worker.run("SELECT 1", now_ms() + 200)
    assert time.monotonic() - started < 1.0
    assert worker.checked_out == {}, "a connection opened beside one in custody"
    lingering.close()
    assert custody.wait_clear(5)
    assert worker.run("SELECT 1", now_ms() + 2000) == (1,)
