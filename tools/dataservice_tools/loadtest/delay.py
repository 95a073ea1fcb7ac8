"""The database's speed, changed under running workers: the delay table.

``database.injected_delay_table`` names a one-row table (column ``delay_ms``)
that every operation's injected sleep reads in the same statement
(:class:`dataservice.store.sessions.InjectedDelay`; the naive baseline runs the
same statement). The harness creates it in the run's own database, as the
server's admin and not as a migration (it is no part of the service's
schema), and updates the row mid-run: the next statement of every worker
sleeps the new time, and none of them is told.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, create_engine, text

from dataservice_tools.loadtest.environment import direct_url

DELAY_TABLE = "loadtest_delay"


class DelayTable:
    """The run's delay table, on one admin connection kept open, so that a
    change mid-run is one UPDATE and no connection set-up."""

    def __init__(self, root_url: str, database: str, table: str = DELAY_TABLE) -> None:
        self.table = table
        self._engine: Engine = create_engine(
            direct_url(root_url, database), isolation_level="AUTOCOMMIT"
        )
        self._conn: Connection | None = None

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self._engine.connect()
        return self._conn

    def create(self, delay_ms: int) -> None:
        """(Re)create the table with its one row at ``delay_ms``."""
        conn = self._connection()
        conn.execute(text(f"DROP TABLE IF EXISTS `{self.table}`"))
        conn.execute(text(f"CREATE TABLE `{self.table}` (delay_ms INT UNSIGNED NOT NULL)"))
        conn.execute(text(f"INSERT INTO `{self.table}` (delay_ms) VALUES (:d)"), {"d": delay_ms})

    def set(self, delay_ms: int) -> None:
        self._connection().execute(
            text(f"UPDATE `{self.table}` SET delay_ms = :d"), {"d": delay_ms}
        )

    def get(self) -> int:
        value = self._connection().execute(text(f"SELECT delay_ms FROM `{self.table}`")).scalar()
        return int(value or 0)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._engine.dispose()
