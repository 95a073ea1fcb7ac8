"""Connections: a small fixed pool per process, and database creation.

The pool never overflows (``max_overflow=0``): a worker process opens at most
``pool_size`` connections, which is how the service's share of the database is
bounded. Every connection runs in autocommit; a read is a single statement and
a keyed mutation one explicit transaction that ends (COMMIT or ROLLBACK) before
the connection goes back, or the connection is discarded. Nothing (no
transaction, no session variable) is left on a connection between requests, so
the pool's rollback-on-return round trip is skipped.

Liveness: a connection that sat idle in the pool longer than
``LIVENESS_IDLE_S`` is pinged before use and replaced if dead. A connection
returned moments ago is not: the ping would add a round trip to every request,
and a statement on a connection that died in between fails with a disconnect
error, which invalidates the pool's older connections and is answered
``UNAVAILABLE`` (retryable).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import MySQLdb
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError, SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry

from dataservice.config.model import DatabaseConfig
from dataservice.errors import ServiceSetupError
from dataservice.store.connections import ConnectRamp, install
from dataservice.store.custody import Custody, bound_by_tcp

LIVENESS_IDLE_S = 1.0
# The administrative connection waits its turn on the reconnect ramp however
# long it takes: custody cannot confirm anything without it.
_ADMIN_RAMP_WAIT_S = 3600.0
# Past the statement timeout, before a statement custody cannot see is taken as gone.
_OUTLAST_SLACK_S = 1.0
_IDLE_SINCE = "dataservice.idle_since"


def _on_checkin(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    record.info[_IDLE_SINCE] = time.monotonic()


def _on_checkout(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
    idle_since = record.info.get(_IDLE_SINCE)
    if idle_since is None or time.monotonic() - idle_since < LIVENESS_IDLE_S:
        return
    try:
        dbapi_connection.ping()
    except MySQLdb.Error:
        # The pool discards this connection and checks out another.
        raise DisconnectionError("connection failed its liveness check") from None


def driver_read_timeout_s(config: DatabaseConfig) -> int:
    """The driver's read timeout: past the longest statement timeout."""
    return math.ceil(config.max_statement_ms / 1000) + 2


def create_store_engine(url: str, pool_size: int, config: DatabaseConfig) -> Engine:
    """The pool of one worker process: ``pool_size`` connections and no more.

    The driver's read timeout is a backstop for a server that stops
    answering; it exceeds the longest statement timeout (``max_statement_ms``).
    A server that keeps running has given up on the statement by then; a
    stalled one has not, which is why a connection lost this way goes into
    custody with its permit (:mod:`dataservice.store.custody`).
    """
    read_timeout_s = driver_read_timeout_s(config)
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=config.pool_timeout_ms / 1000,
        pool_recycle=config.pool_recycle_s,
        isolation_level="AUTOCOMMIT",
        skip_autocommit_rollback=True,
        connect_args={
            "connect_timeout": config.connect_timeout_s,
            "read_timeout": read_timeout_s,
            "write_timeout": read_timeout_s,
            "charset": "utf8mb4",
        },
    )
    event.listen(engine, "checkin", _on_checkin)
    event.listen(engine, "checkout", _on_checkout)
    ramp = ConnectRamp(config.connect_rate_per_s, config.connect_burst)
    custody = Custody(
        _admin_connect(engine, config),
        lambda: ramp.take(_ADMIN_RAMP_WAIT_S),
        ping_every_s=config.pool_recycle_s,
        outlast_s=config.max_statement_ms / 1000 + _OUTLAST_SLACK_S,
    )
    install(engine, ramp, custody, config.pool_timeout_ms / 1000, config.max_statement_ms)
    return engine


def _admin_connect(engine: Engine, config: DatabaseConfig) -> Callable[[], Any]:
    """How the process opens its administrative connection: the pool's server
    and account, outside the pool, with no read timeout (custody waits
    through a stall; TCP bounds it, :func:`~dataservice.store.custody.bound_by_tcp`)."""
    cargs, cparams = engine.dialect.create_connect_args(engine.url)
    params = {
        **cparams,
        "connect_timeout": config.connect_timeout_s,
        "charset": "utf8mb4",
        "autocommit": True,
    }

    def connect() -> Any:
        connection = engine.dialect.loaded_dbapi.connect(*cargs, **params)
        bound_by_tcp(connection)
        return connection

    return connect


def ensure_database(url: str, config: DatabaseConfig) -> bool:
    """Create the URL's database if it does not exist. Returns True if it was created."""
    parsed = make_url(url)
    name = parsed.database
    if not name:
        raise ServiceSetupError("the database URL names no database")
    server = create_engine(
        parsed.set(database=""),
        poolclass=None,
        connect_args={"connect_timeout": config.connect_timeout_s},
    )
    try:
        with server.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = :n"),
                {"n": name},
            ).first()
            if exists:
                return False
            quoted = server.dialect.identifier_preparer.quote_identifier(name)
            conn.execute(text(f"CREATE DATABASE IF NOT EXISTS {quoted} CHARACTER SET utf8mb4"))
            return True
    except SQLAlchemyError as exc:
        raise ServiceSetupError(
            f"cannot reach the database at {parsed.render_as_string(hide_password=True)}: "
            f"{type(getattr(exc, 'orig', None) or exc).__name__}"
        ) from None
    finally:
        server.dispose()
