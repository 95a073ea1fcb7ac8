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


def running_statements(engine: Engine, user: str) -> set[tuple[int, int]]:
    """(connection id, query id) of every statement ``user`` has running now."""
    query = text(
        "SELECT ID, QUERY_ID FROM information_schema.PROCESSLIST"
        " WHERE USER = :user AND COMMAND = 'Query'"
    )
    with engine.connect() as conn:
        return {(int(r[0]), int(r[1])) for r in conn.execute(query, {"user": user})}


def connection_ids(engine: Engine, user: str) -> set[int]:
    """Every connection ``user`` has open now, busy or idle."""
    query = text("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = :user")
    with engine.connect() as conn:
        return {int(r[0]) for r in conn.execute(query, {"user": user})}
