"""What the read cache's multi-replica tests (``tests/test_cache_*.py``) and
``bench/stampede.py`` share: a database that counts reads itself, interactive
worker replicas known to answer, and bursts of concurrent reads.

:class:`CountingDatabase` is a MariaDB of its own (a free port, a temporary
directory) whose general log goes to the table ``mysql.general_log``: one row
per statement the server receives, with the user that sent it. The workers
connect as a user that nothing else uses, so the reads of a record are counted
by the server, never by the service's own counters; seeding and counting run
as root and are not counted.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dataservice_tools.localservices import TemporaryBinlogMariaDB, free_port
from sqlalchemy import Engine, TextClause, create_engine, text

from bench._fleet import Replicas
from dataservice.broker.glue import TASK_NAME, celery_app
from dataservice.client import Client
from dataservice.config.model import Config, DatabaseConfig
from dataservice.config.settings import Settings
from dataservice.enums import ReadMode
from dataservice.errors import DataServiceError
from dataservice.ops.processes import WorkerProcess
from dataservice.store import RecordStore, create_store_engine
from dataservice.store.migrate import upgrade
from dataservice.types import Record

DATABASE = "dataservice_cache"
# Only the worker replicas connect as this user.
SERVICE_USER = "ds_replicas"
_PASSWORD = "ds-replicas-pw"
# Threads share a client 50 at a time: each client publishes on one broker
# connection, so a burst's publishes go out on several at once.
_THREADS_PER_CLIENT = 50

# Statements from the service user that read the records table (the driver may
# prefix a statement timeout: SET STATEMENT ... FOR SELECT); the record's
# scope and id follow as literals (mysqlclient sends them inlined).
_READS = text(
    "SELECT COUNT(*) FROM mysql.general_log"
    " WHERE user_host LIKE :user AND command_type = 'Query'"
    " AND argument LIKE '%SELECT %FROM records%' AND argument LIKE :key"
)
_STATEMENTS = text(
    "SELECT argument FROM mysql.general_log"
    " WHERE user_host LIKE :user AND command_type = 'Query' AND argument LIKE :text"
    " ORDER BY event_time"
)
_CONNECTIONS = text("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = :user")


class CountingDatabase:
    """A private MariaDB with the service's schema, its own service user and
    every statement logged to ``mysql.general_log``."""

    def __init__(self, config: DatabaseConfig) -> None:
        self._config = config
        self._server = TemporaryBinlogMariaDB()
        self.root: Engine | None = None
        self._store: RecordStore | None = None

    @property
    def root_url(self) -> str:
        return self._server.url("")

    @property
    def service_url(self) -> str:
        return (
            f"mysql+mysqldb://{SERVICE_USER}:{_PASSWORD}@127.0.0.1:{self._server.port}/{DATABASE}"
        )

    def on(self, settings: Settings) -> Settings:
        """``settings`` with the workers' database here."""
        return dataclasses.replace(settings, database_url=self.service_url)

    def start(self) -> CountingDatabase:
        self._server.start()
        self.root = create_engine(self._server.url(""), isolation_level="AUTOCOMMIT")
        with self.root.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {DATABASE}"))
            for host in ("localhost", "127.0.0.1"):
                conn.execute(text(f"CREATE USER '{SERVICE_USER}'@'{host}' IDENTIFIED BY :pw"),
                             {"pw": _PASSWORD})  # fmt: skip
                conn.execute(text(f"GRANT ALL ON {DATABASE}.* TO '{SERVICE_USER}'@'{host}'"))
        upgrade(self._server.url(DATABASE), self._config)
        with self.root.connect() as conn:
            conn.execute(text("SET GLOBAL log_output = 'TABLE', general_log = 1"))
        seeding = create_store_engine(self._server.url(DATABASE), 1, self._config)
        self._store = RecordStore(seeding, max_statement_ms=self._config.max_statement_ms)
        return self

    def stop(self) -> None:
        if self._store is not None:
            self._store.engine.dispose()
        if self.root is not None:
            self.root.dispose()
        self._server.stop()

    def __enter__(self) -> CountingDatabase:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def forget(self) -> None:
        """Empty the general log: counting scans it whole, and it only grows."""
        assert self.root is not None, "not started"
        with self.root.connect() as conn:
            conn.execute(text("TRUNCATE TABLE mysql.general_log"))

    def seed(self, scope: str, object_ids: Sequence[str], payload: bytes) -> None:
        """Write each record as root: the service has never seen them."""
        assert self._store is not None, "not started"
        for object_id in object_ids:
            self._store.write(scope, object_id, payload)

    def reads(self, scope: str, object_id: str | None = None) -> int:
        """Statements the workers sent that read this record (every record of
        ``scope`` if no id). Ids are plain letters, digits and dashes: no LIKE
        wildcards."""
        record = f"'{object_id}'" if object_id is not None else ""
        key = f"%records.scope = '{scope}' AND records.object_id = {record}%"
        return self._scalar(_READS, {"user": f"{SERVICE_USER}[%", "key": key})

    def statements(self, containing: str) -> list[str]:
        """The statements the workers sent that contain ``containing`` (plain
        text: no LIKE wildcards), oldest first."""
        assert self.root is not None, "not started"
        with self.root.connect() as conn:
            rows = conn.execute(
                _STATEMENTS, {"user": f"{SERVICE_USER}[%", "text": f"%{containing}%"}
            ).all()
        return [_text(row[0]) for row in rows]

    def connections(self) -> int:
        """Connections the workers hold open now, busy or idle."""
        return self._scalar(_CONNECTIONS, {"user": SERVICE_USER})

    def _scalar(self, query: TextClause, params: dict[str, str]) -> int:
        assert self.root is not None, "not started"
        with self.root.connect() as conn:
            return int(conn.execute(query, params).scalar_one())


@dataclass(frozen=True, slots=True)
class Outcome:
    """One read of a burst: when it was sent and answered (monotonic s), and
    the record or the error's name."""

    object_id: str
    started: float
    ended: float
    record: Record | None
    error: str = ""

    @property
    def latency_ms(self) -> float:
        return (self.ended - self.started) * 1000


def burst(
    settings: Settings,
    config: Config,
    caller: str,
    scope: str,
    object_ids: Sequence[str],
    threads: int,
    timeout_s: float,
    mode: ReadMode = ReadMode.ALLOW_CACHED,
) -> list[Outcome]:
    """One read per entry of ``object_ids`` (an id listed
    twice is read twice), from ``threads`` threads released together; each
    thread's reads follow one another, ``threads`` of them at once.

    ``config``'s client retry policy applies: give it one attempt to see
    every answer as the service gave it."""
    clients = [Client(caller, settings, config) for _ in range(-(-threads // _THREADS_PER_CLIENT))]
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def reader(n: int) -> None:
        client = clients[n // _THREADS_PER_CLIENT]
        mine = object_ids[n::threads]
        start.wait()
        for object_id in mine:
            began = time.monotonic()
            record, error = None, ""
            try:
                record = client.read(scope, object_id, mode=mode, timeout=timeout_s)
            except DataServiceError as exc:
                reason = getattr(exc, "reason", "")
                error = f"{type(exc).__name__}({reason})" if reason else type(exc).__name__
            outcome = Outcome(object_id, began, time.monotonic(), record, error)
            with lock:
                outcomes.append(outcome)

    workers = [threading.Thread(target=reader, args=(n,), daemon=True) for n in range(threads)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout_s + 30)
    finally:
        for client in clients:
            client.close()
    return outcomes


def sent_before_first_answer(outcomes: Sequence[Outcome]) -> int:
    """How many reads were on their way before any was answered: the burst's
    real concurrency on the cold key."""
    first = min(o.ended for o in outcomes)
    return sum(o.started < first for o in outcomes)


@contextmanager
def replicas(
    settings: Settings,
    config: Config,
    log_dir: Path,
    count: int,
    settings_of: dict[int, Settings] | None = None,
) -> Iterator[Replicas]:
    """``count`` interactive worker processes, each serving its counters on a
    port of its own (``metrics_ports``), answering control pings; stopped on exit."""
    ports = [free_port() for _ in range(count)]
    fleet = Replicas(settings, config, count, log_dir, settings_of=settings_of or {},
                     metrics_ports=ports)  # fmt: skip
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def until_each_answers(
    settings: Settings,
    config: Config,
    workers: Sequence[WorkerProcess],
    caller: str,
    scope: str,
    object_id: str,
    timeout_s: float = 60.0,
) -> int:
    """``PRIMARY`` reads of ``object_id`` (a record that exists), a burst at a
    time, until each of ``workers`` has served one (Celery's per-worker totals);
    how many reads were answered with the record. A control ping shows a
    worker's consumer is up; this shows its whole read path is."""
    control = celery_app("cache-fleet-control", settings, config)
    pending = {worker.pid for worker in workers}
    answered = 0
    deadline = time.monotonic() + timeout_s
    try:
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers {sorted(pending)} served no read in {timeout_s} s")
            for worker in workers:
                worker.check_alive()
            reads = [object_id] * 4 * len(workers)
            outcomes = burst(settings, config, caller, scope, reads, len(reads), 10.0,
                             ReadMode.PRIMARY)  # fmt: skip
            answered += sum(o.record is not None for o in outcomes)
            stats = control.control.inspect(timeout=1.0).stats() or {}
            for node in stats.values():
                if node.get("total", {}).get(TASK_NAME, 0) > 0:
                    pending.discard(node.get("pid"))
    finally:
        control.close()
    return answered


def _text(value: object) -> str:
    return bytes(value).decode() if isinstance(value, bytes | bytearray) else str(value)
