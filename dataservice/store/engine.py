"""Connections: a small fixed pool per process, and database creation.

The pool never overflows (``max_overflow=0``): a worker process opens at most
``pool_size`` connections, which is how the service's share of the database is
bounded. Every connection runs in autocommit, and every operation is a single
statement, so nothing (no transaction, no session variable) is left on a
connection between requests; the pool's rollback-on-return round trip is
therefore skipped.
"""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from dataservice.config import DatabaseConfig
from dataservice.errors import ServiceSetupError


def create_store_engine(url: str, pool_size: int, config: DatabaseConfig) -> Engine:
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=config.pool_timeout_ms / 1000,
        pool_recycle=config.pool_recycle_s,
        pool_pre_ping=True,
        isolation_level="AUTOCOMMIT",
        skip_autocommit_rollback=True,
        connect_args={"connect_timeout": config.connect_timeout_s, "charset": "utf8mb4"},
    )


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
            f"{type(exc.orig or exc).__name__}"
        ) from None
    finally:
        server.dispose()
