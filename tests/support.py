"""Helpers for tests that check the database itself rather than the service's word."""

from __future__ import annotations

from sqlalchemy import Engine, text


def row_count(engine: Engine, scope: str | None = None) -> int:
    query = "SELECT COUNT(*) FROM records" + (" WHERE scope = :scope" if scope else "")
    with engine.connect() as conn:
        return int(conn.execute(text(query), {"scope": scope}).scalar_one())


def statements_by(engine: Engine, user: str) -> int:
    """Statements the server has run for ``user`` (its user statistics; userstat is on)."""
    query = text(
        "SELECT SELECT_COMMANDS + UPDATE_COMMANDS + OTHER_COMMANDS"
        " FROM information_schema.USER_STATISTICS WHERE USER = :user"
    )
    with engine.connect() as conn:
        return int(conn.execute(query, {"user": user}).scalar() or 0)


def table_checksum(engine: Engine) -> int:
    """A checksum of every row of ``records``: equal before and after means no row changed."""
    with engine.connect() as conn:
        row = conn.execute(text("CHECKSUM TABLE records")).one()
    return int(row[1] or 0)
