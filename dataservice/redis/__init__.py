"""Redis plumbing: every key's name, bounded connections, TLS, packed commands, Lua scripts."""

from __future__ import annotations

import redis


def where(url: str) -> str:
    """Where the Redis at ``url`` is, for an operator: ``host:port/db`` or the
    socket's path, without credentials."""
    pool = redis.ConnectionPool.from_url(url)
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
