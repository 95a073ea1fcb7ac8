"""Where a Redis URL leads: one server, or the primary a Sentinel names.

Every Redis client and pool of the service is made here, from its URL, so a
URL of either kind works wherever a Redis is configured:

- ``redis://``, ``rediss://`` and ``unix://`` name one server (redis-py's own
  URL forms, TLS options as :mod:`dataservice.redis.tls` reads them).
- ``sentinel://[user:password@]host:port[,host:port...]/<primary>[/<db>]``
  names a Sentinel-managed primary: the Sentinels to ask, the name they
  monitor it under, and the database number (0 unless given). The user and
  password are the primary's (and, after a failover, its replica's: Redis
  does not replicate ACL users, so each server of the group needs them);
  the Sentinels are asked without credentials.

On a Sentinel URL a pool asks the Sentinels for the primary's address when
it connects, and again whenever a connection to it fails; a command on a
primary demoted to a replica (``READONLY``, or the ``UNBLOCKED`` a demotion
sends to blocked commands) closes its connection and raises
``redis.ConnectionError``, so the next command goes to the new primary
(redis-py's ``SentinelManagedConnection``). The pool keeps its own kind
(bounded, blocking) and its connections their hooks (packed commands, the
calling thread's bound): the Sentinel behaviour is mixed in, not swapped in.

TLS to a Sentinel-managed Redis is not supported: a ``sentinel://`` URL with
a query is a :class:`~dataservice.errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import quote, unquote

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from dataservice.errors import ConfigError

SENTINEL_SCHEME: Final = "sentinel://"
SENTINEL_PORT: Final = 26379
# How long a question to one Sentinel may take before the next is asked.
SENTINEL_TIMEOUT_S: Final = 1.0

_Pool = TypeVar("_Pool", bound=redis.ConnectionPool)
_AsyncPool = TypeVar("_AsyncPool", bound=redis.asyncio.ConnectionPool)


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """A ``sentinel://`` URL, read: the Sentinels, the primary's name, the db."""

    sentinels: tuple[tuple[str, int], ...]
    primary: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str, name: str = "the Redis URL") -> SentinelTarget:
        if not url.startswith(SENTINEL_SCHEME):
            raise ConfigError(f"{name} is not a sentinel:// URL")
        rest = url[len(SENTINEL_SCHEME) :]
        if "?" in rest or "#" in rest:
            raise ConfigError(
                f"{name}: a sentinel:// URL takes no query (TLS to a Sentinel-managed"
                " Redis is not supported)"
            )
        # The credentials first, at the last "@": a password may hold a "/"
        # or a ",", and no part of it may reach an error message.
        userinfo, at, rest = rest.rpartition("@")
        username = password = None
        if at:
            user, colon, secret = userinfo.partition(":")
            username = unquote(user) or None
            password = unquote(secret) if colon else None
        hosts, _, path = rest.partition("/")
        sentinels = tuple(
            _address(part, name, n) for n, part in enumerate(hosts.split(","), start=1)
        )
        parts = path.split("/") if path else []
        if not parts or not parts[0] or len(parts) > 2:
            raise ConfigError(
                f"{name}: a sentinel:// URL ends in /<primary name>, or /<primary name>/<db>"
            )
        db = 0
        if len(parts) == 2:
            if not _number(parts[1]):
                raise ConfigError(f"{name}: the database number must be a number")
            db = int(parts[1])
        return cls(sentinels, unquote(parts[0]), db, username, password)

    def kombu_url(self) -> str:
        """The URL kombu gets: the first Sentinel, the primary's credentials
        and the db. One URL only: kombu takes ``;``-joined URLs for fallbacks,
        and a fallback would take its scheme's stock transport in place of
        the service's. Every Sentinel, and the primary's name, go in
        transport options (``dataservice_sentinels``, ``master_name``)."""
        auth = ""
        if self.username or self.password is not None:
            auth = quote(self.username or "", safe="")
            if self.password is not None:
                auth += ":" + quote(self.password, safe="")
            auth += "@"
        host, port = self.sentinels[0]
        return f"{SENTINEL_SCHEME}{auth}{_bracketed(host)}:{port}/{self.db}"

    def where(self) -> str:
        """For an operator, without credentials."""
        sentinels = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"primary {self.primary!r} of the Sentinels at {sentinels}, db {self.db}"

    def manager(self, options: Mapping[str, Any]) -> redis.sentinel.Sentinel:
        return redis.sentinel.Sentinel(self.sentinels, sentinel_kwargs=_sentinel_options(options))

    def async_manager(self, options: Mapping[str, Any]) -> redis.asyncio.sentinel.Sentinel:
        return redis.asyncio.sentinel.Sentinel(
            self.sentinels, sentinel_kwargs=_sentinel_options(options)
        )

    def primary_options(self) -> dict[str, Any]:
        return {"db": self.db, "username": self.username, "password": self.password}


def _address(part: str, name: str, n: int) -> tuple[str, int]:
    part = part.strip()
    if part.startswith("[") and "]" in part:
        host, _, after = part[1:].partition("]")
        port = after.removeprefix(":") or str(SENTINEL_PORT)
    elif part.count(":") == 1:
        host, _, port = part.partition(":")
    else:
        host, port = part, str(SENTINEL_PORT)
    if not host or not _number(port) or not 0 < int(port) < 65536:
        raise ConfigError(f"{name}: Sentinel {n} is not a host:port")
    return host, int(port)


def _number(text: str) -> bool:
    return text.isascii() and text.isdecimal()


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _sentinel_options(options: Mapping[str, Any]) -> dict[str, Any]:
    # A Sentinel that does not answer costs one timeout before the next is
    # asked: the pool's own socket timeout may be far longer (a blocking wait).
    timeout = options.get("socket_connect_timeout") or SENTINEL_TIMEOUT_S
    return {
        "socket_timeout": min(timeout, SENTINEL_TIMEOUT_S),
        "socket_connect_timeout": min(timeout, SENTINEL_TIMEOUT_S),
        **{k: options[k] for k in ("driver_info", "maint_notifications_config") if k in options},
    }


def is_sentinel(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEME)


def where(url: str) -> str:
    """Where the Redis at ``url`` is, for an operator: ``host:port/db``, the
    socket's path, or the Sentinels and the primary's name; no credentials."""
    if is_sentinel(url):
        return SentinelTarget.parse(url).where()
    pool = redis.ConnectionPool.from_url(url)
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


class _ClosesSentinels:
    """A Sentinel pool's full disconnect (its client's close) closes the
    connections its manager holds to the Sentinels too: redis-py leaves them
    open. The disconnect of idle connections a change of primary makes keeps
    them."""

    sentinel_manager: Any

    def disconnect(self, inuse_connections: bool = True) -> None:
        try:
            super().disconnect(inuse_connections)  # type: ignore[misc]
        finally:
            if inuse_connections:
                for sentinel in self.sentinel_manager.sentinels:
                    sentinel.close()


class _AsyncClosesSentinels:
    """The same for asyncio pools."""

    sentinel_manager: Any

    async def disconnect(self, inuse_connections: bool = True) -> None:
        try:
            await super().disconnect(inuse_connections)  # type: ignore[misc]
        finally:
            if inuse_connections:
                for sentinel in self.sentinel_manager.sentinels:
                    await sentinel.aclose()


# One class per combination, so that a class's identity (which kombu's and
# redis-py's pools compare) is the same however often it is asked for.
_MIXED: dict[tuple[tuple[type[Any], ...], type[Any]], type[Any]] = {}


def _mixed(managed: tuple[type[Any], ...], cls: type[Any]) -> type[Any]:
    """``cls`` with ``managed``'s Sentinel behaviour before its own."""
    if issubclass(cls, managed[-1]):
        return cls
    made = _MIXED.get((managed, cls))
    if made is None:
        made = _MIXED[managed, cls] = type(
            f"Sentinel{cls.__name__}", (*managed, cls), {"__module__": __name__}
        )
    return made


def sentinel_connection_class(cls: type[redis.Connection]) -> type[redis.Connection]:
    """``cls`` (and its hooks) finding the primary through its pool's Sentinels."""
    made: type[redis.Connection] = _mixed((redis.sentinel.SentinelManagedConnection,), cls)
    return made


def async_sentinel_connection_class(
    cls: type[redis.asyncio.Connection],
) -> type[redis.asyncio.Connection]:
    """The same for asyncio connections."""
    made: type[redis.asyncio.Connection] = _mixed(
        (redis.asyncio.sentinel.SentinelManagedConnection,), cls
    )
    return made


def pool(
    url: str,
    pool_class: type[_Pool],
    connection_class: type[redis.Connection] | None = None,
    **options: Any,
) -> _Pool:
    """A pool of ``pool_class`` with connections of ``connection_class``
    (redis-py's for the URL if None; else the class of its kind for the
    URL's scheme) to the Redis at ``url``."""
    if not is_sentinel(url):
        if connection_class is None:
            return pool_class.from_url(url, **options)
        return pool_class.from_url(url, connection_class=connection_class, **options)
    target = SentinelTarget.parse(url)
    managed_pool = _mixed((_ClosesSentinels, redis.sentinel.SentinelConnectionPool), pool_class)
    made: _Pool = managed_pool(
        target.primary,
        target.manager(options),
        connection_class=sentinel_connection_class(connection_class or redis.Connection),
        **target.primary_options(),
        **options,
    )
    return made


def async_pool(
    url: str,
    pool_class: type[_AsyncPool],
    connection_class: type[redis.asyncio.Connection] | None = None,
    **options: Any,
) -> _AsyncPool:
    """The same for asyncio."""
    if not is_sentinel(url):
        if connection_class is None:
            return pool_class.from_url(url, **options)
        return pool_class.from_url(url, connection_class=connection_class, **options)
    target = SentinelTarget.parse(url)
    managed_pool = _mixed(
        (_AsyncClosesSentinels, redis.asyncio.sentinel.SentinelConnectionPool), pool_class
    )
    made: _AsyncPool = managed_pool(
        target.primary,
        target.async_manager(options),
        connection_class=async_sentinel_connection_class(
            connection_class or redis.asyncio.Connection
        ),
        **target.primary_options(),
        **options,
    )
    return made


def client(
    url: str, connection_class: type[redis.Connection] | None = None, **options: Any
) -> redis.Redis:
    """A client of its own pool on the Redis at ``url``, ``options`` as
    redis-py's ``Redis.from_url`` takes them (``connection_class`` included:
    the plain-TCP class of its kind)."""
    if not is_sentinel(url):
        if connection_class is None:
            return redis.Redis.from_url(url, **options)
        return redis.Redis.from_url(url, connection_class=connection_class, **options)
    # Its own pool, closed with it, as from_url's.
    return redis.Redis.from_pool(pool(url, redis.ConnectionPool, connection_class, **options))


def async_client(
    url: str, connection_class: type[redis.asyncio.Connection] | None = None, **options: Any
) -> redis.asyncio.Redis:
    """The same for asyncio."""
    if not is_sentinel(url):
        if connection_class is None:
            return redis.asyncio.Redis.from_url(url, **options)
        return redis.asyncio.Redis.from_url(url, connection_class=connection_class, **options)
    # Its own pool, closed with it, as from_url's.
    return redis.asyncio.Redis.from_pool(
        async_pool(url, redis.asyncio.ConnectionPool, connection_class, **options)
    )


def primary_address(client: redis.Redis) -> str | None:
    """``host:port`` of the primary the Sentinels name now for ``client``'s
    pool (which then lets go of its idle connections to any other); None for
    a client of one server. Raises ``redis.ConnectionError`` (redis-py's
    ``MasterNotFoundError``) when no Sentinel names one."""
    pool = client.connection_pool
    if not isinstance(pool, redis.sentinel.SentinelConnectionPool):
        return None
    host, port = pool.get_master_address()  # type: ignore[no-untyped-call]
    return f"{host}:{port}"
