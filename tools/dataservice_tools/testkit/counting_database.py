"""A database that counts the service's reads itself, for the read cache's
multi-replica tests and the stampede benchmark.

:class:`CountingDatabase` is a MariaDB of its own (a free port, a temporary
directory) whose general log goes to the table ``mysql.general_log``: one row
per statement the server receives, with the user that sent it. The workers
connect as a user that nothing else uses, so the reads of a record are counted
by the server, never by the service's own counters; seeding and counting run
as root and are not counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import TracebackType

from sqlalchemy import Engine, TextClause, create_engine, text

from dataservice.config.model import DatabaseConfig
from dataservice.config.settings import Settings
from dataservice.store import RecordStore, create_store_engine
from dataservice.store.migrate import upgrade
from dataservice_tools.localservices import TemporaryBinlogMariaDB

DATABASE = "dataservice_cache"
# Only the worker replicas connect as this user.
SERVICE_USER = "ds_replicas"
_PASSWORD = "ds-replicas-pw"

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


def _text(value: object) -> str:
    return bytes(value).decode() if isinstance(value, bytes | bytearray) else str(value)
