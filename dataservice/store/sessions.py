"""Connections for one operation: bound to its permit and deadline, and
discarded whenever anything went wrong on them.

A connection lost before the server answered (a driver read timeout, a reset,
a server gone away) may still be running its statement on the server: its
permit goes into the process's custody (:mod:`dataservice.store.custody`)
with it, and comes back when the server confirms the statement is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from dataservice.limits.permits import Permit
from dataservice.observe import trace as tracing
from dataservice.observe.metrics import Stage
from dataservice.store.connections import (
    CONNECT_BY,
    DEADLINE_OPTION,
    STATEMENT_TIMEOUT_CODES,
    StatementTimeout,
    bounded_statement,
    statement_bound_ms,
)
from dataservice.store.custody import CONNECTION_ID, ORIGIN, Origin, custody_of


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one operation runs under: its permit, and time until ``deadline_ms``
    (Unix ms); a new connection only if it comes by ``connect_by_ms``, after
    which the operation could no longer run (see ``connections.CONNECT_BY``)."""

    permit: Permit | None = None
    deadline_ms: int | None = None
    connect_by_ms: int | None = None


UNBOUNDED = Bounds()


def _timed_out(exc: BaseException) -> bool:
    orig = getattr(exc, "orig", None) if isinstance(exc, OperationalError) else None
    return bool(orig is not None and orig.args and orig.args[0] in STATEMENT_TIMEOUT_CODES)


@dataclass(frozen=True, slots=True)
class InjectedDelay:
    """The sleep that makes each operation take longer in the database: a
    fixed time, or one a load test changes in ``table`` (its one row's
    ``delay_ms``) and every statement reads.

    Bounded, the sleep is cut to what the statement could have had
    (:func:`~dataservice.store.connections.statement_bound_ms`) and a cut
    one ends as a statement timeout would: the operation is refused as
    :class:`~dataservice.store.connections.StatementTimeout`. The sleep itself
    carries no server-side timeout, since it is its own bound: on MariaDB a
    statement timeout that fires while ``SLEEP()`` ends (the two are due
    together after a stall, or when the bound is the sleep's length) can hold
    the server's timer thread, and with it every statement's start and end,
    for 2 s at a time (measured: 40 connections of ``max_statement_time=0.2
    FOR SELECT SLEEP(0.2)`` finished 171 statements in 8 s instead of 1,560,
    the slowest after 4.2 s; after a 5 s stall, none finished for 6 s).
    """

    delay_ms: int
    # The name matches identifiers.TABLE (checked on load): nothing to quote.
    table: str | None = None

    @classmethod
    def of(cls, delay_ms: int, table: str | None) -> InjectedDelay | None:
        """The delay a configuration asks for (None: no delay)."""
        if table is None and not delay_ms:
            return None
        return cls(delay_ms, table)

    def unbounded(self) -> tuple[str, tuple[int, ...]]:
        """The sleep with no bound of its own (the naive baseline's): the
        driver's own statement and parameters."""
        if self.table is not None:
            return f"SELECT SLEEP(delay_ms / 1000) FROM {self.table} LIMIT 1", ()
        return "SELECT SLEEP(%s / 1000)", (self.delay_ms,)

    def bounded(self, bound_ms: int) -> tuple[str, tuple[int, ...]]:
        """The sleep cut to ``bound_ms``; its one row says whether it was cut
        (no row: the delay table is empty, and nothing slept)."""
        if self.table is not None:
            return (
                f"SELECT SLEEP(LEAST(delay_ms, %s) / 1000), delay_ms > %s"
                f" FROM {self.table} LIMIT 1",
                (bound_ms, bound_ms),
            )
        return "SELECT SLEEP(%s / 1000), %s", (
            min(self.delay_ms, bound_ms),
            int(self.delay_ms > bound_ms),
        )

    def run(
        self,
        execute: Callable[[str, tuple[int, ...]], Any],
        bounds: Bounds,
        max_statement_ms: int,
    ) -> None:
        """Sleep as ``bounds`` allow; ``execute`` runs a statement on the
        operation's connection and returns its first row (None: no row)."""
        if bounds.deadline_ms is None:
            execute(*self.unbounded())
            return
        row = execute(*self.bounded(statement_bound_ms(bounds.deadline_ms, max_statement_ms)))
        if row is not None and row[1]:
            raise StatementTimeout


class Sessions:
    """The engine's connections, handed out one operation at a time."""

    def __init__(
        self,
        engine: Engine,
        max_statement_ms: int,
        injected_delay_ms: int = 0,
        injected_delay_table: str | None = None,
    ) -> None:
        self._engine = engine
        self._custody = custody_of(engine)
        self._max_statement_ms = max_statement_ms
        self._delay = InjectedDelay.of(injected_delay_ms, injected_delay_table)

    @contextmanager
    def connection(self, bounds: Bounds) -> Iterator[Connection]:
        """A pooled connection, bound to the bounds; discarded on any failure.

        After an error nothing is known for sure about the session (a
        statement may have been cut off half way), so the connection is
        invalidated, never returned to the pool.
        """
        with tracing.timed(Stage.CONNECTION_ACQUIRE):
            connect_by = CONNECT_BY.set(bounds.connect_by_ms)
            try:
                connection = self._engine.connect()
            finally:
                CONNECT_BY.reset(connect_by)
        with connection as conn:
            # Read now: once a lost connection is invalidated, its info may be gone.
            identity = _identity(conn.info)
            if bounds.permit is not None:
                bounds.permit.connection_id = identity[0]
            if bounds.deadline_ms is not None:
                conn.execution_options(**{DEADLINE_OPTION: bounds.deadline_ms})
            try:
                with tracing.timed(Stage.SQL):
                    if self._delay is not None:
                        self._delay.run(
                            lambda sql, params: conn.exec_driver_sql(
                                sql, params, execution_options=_NO_DEADLINE
                            ).first(),
                            bounds,
                            self._max_statement_ms,
                        )
                    yield conn
            except BaseException as exc:
                if isinstance(exc, DBAPIError) and exc.connection_invalidated:
                    self._abandon(identity, bounds)
                conn.invalidate()
                if _timed_out(exc):
                    raise StatementTimeout from None
                raise

    def fetch_one(self, bounds: Bounds, statement: str, params: tuple[Any, ...]) -> Any:
        """The first row of one statement (None: no row), on the pooled
        connection's own driver cursor: :meth:`connection`'s discipline (the
        permit learns the connection, the statement its server-side timeout,
        the connection is discarded on any failure, a driver error is raised
        as SQLAlchemy's, which the failures map) without SQLAlchemy's
        statement and result machinery, about half of a point read's CPU.
        For the hottest single statement (a point read)."""
        dialect = self._engine.dialect
        with tracing.timed(Stage.CONNECTION_ACQUIRE):
            connect_by = CONNECT_BY.set(bounds.connect_by_ms)
            try:
                fairy = self._engine.raw_connection()
            except dialect.loaded_dbapi.Error as exc:
                # As Engine.connect raises it: a connection never made.
                raise DBAPIError.instance(
                    None,
                    None,
                    exc,
                    dialect.loaded_dbapi.Error,
                    connection_invalidated=dialect.is_disconnect(exc, None, None),
                    dialect=dialect,
                ) from None
            finally:
                CONNECT_BY.reset(connect_by)
        sent = statement
        identity = _identity(fairy.info)
        try:
            if bounds.permit is not None:
                bounds.permit.connection_id = identity[0]
            cursor = fairy.cursor()
            try:
                with tracing.timed(Stage.SQL):
                    if self._delay is not None:
                        self._delay.run(
                            lambda sql, params: _first(cursor, sql, params),
                            bounds,
                            self._max_statement_ms,
                        )
                    sent = self._bounded(statement, bounds)
                    cursor.execute(sent, params)
                    return cursor.fetchone()
            finally:
                cursor.close()
        except BaseException as exc:
            disconnected = isinstance(exc, dialect.loaded_dbapi.Error) and dialect.is_disconnect(
                exc, fairy, None
            )
            if disconnected:
                self._abandon(identity, bounds)
            fairy.invalidate()
            if isinstance(exc, dialect.loaded_dbapi.Error):
                if exc.args and exc.args[0] in STATEMENT_TIMEOUT_CODES:
                    raise StatementTimeout from None
                raise DBAPIError.instance(
                    sent,
                    params,
                    exc,
                    dialect.loaded_dbapi.Error,
                    connection_invalidated=disconnected,
                    dialect=dialect,
                ) from None
            raise
        finally:
            fairy.close()

    def _bounded(self, statement: str, bounds: Bounds) -> str:
        if bounds.deadline_ms is None:
            return statement
        # Known once the dialect has met the server (its first connection).
        mariadb = bool(getattr(self._engine.dialect, "is_mariadb", False))
        return bounded_statement(
            statement, bounds.deadline_ms, self._max_statement_ms, mariadb=mariadb
        )

    def _abandon(self, identity: _Identity, bounds: Bounds) -> None:
        """The connection was lost before the server answered: its permit
        stays taken until the server confirms the statement is gone."""
        if self._custody is None:
            return
        release = bounds.permit.hand_over() if bounds.permit is not None else None
        self._custody.abandon(*identity, release)


_Identity = tuple[int | None, Origin | None]
# The injected sleep is its own bound: no server-side timeout (InjectedDelay).
_NO_DEADLINE = {DEADLINE_OPTION: None}


def _first(cursor: Any, statement: str, params: tuple[int, ...]) -> Any:
    cursor.execute(statement, params)
    rows = cursor.fetchall()
    return rows[0] if rows else None


def _identity(info: dict[Any, Any]) -> _Identity:
    """A pooled connection's server-side id and its origin."""
    return info.get(CONNECTION_ID), info.get(ORIGIN)
