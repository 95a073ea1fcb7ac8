"""Helpers for tests: checks on the database itself rather than the service's
word, and variations of the test configuration."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text

from dataservice.config import Settings


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


def changed(data: dict[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    """A deep copy of a configuration document with one nested key set."""
    result = copy.deepcopy(data)
    node = result
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return result


def on_redis(settings: Settings, redis_url: str, config_path: Path | None = None) -> Settings:
    """The same settings with broker, results and cache on another Redis database."""
    return dataclasses.replace(
        settings,
        broker_url=redis_url,
        result_backend_url=redis_url,
        redis_url=redis_url,
        config_path=config_path or settings.config_path,
    )
