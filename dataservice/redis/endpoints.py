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
- ``sentinels://`` is the same over TLS, as ``rediss://`` is to ``redis://``:
  to the Sentinels and to the servers they name alike (a group is all-TLS).
  Its query takes the TLS options of :mod:`dataservice.redis.tls`, with the
  same defaults, and nothing else.

On a Sentinel URL a pool asks the Sentinels for the primary's address when
it connects, and again whenever a connection to it fails; a command on a
primary demoted to a replica (``READONLY``, or the ``UNBLOCKED`` a demotion
sends to blocked commands) closes its connection and raises
``redis.ConnectionError``, so the next command goes to the new primary
(redis-py's ``SentinelManagedConnection``). The pool keeps its own kind
(bounded, blocking) and its connections their hooks (packed commands, the
calling thread's bound): the Sentinel behaviour is mixed in, not swapped in.

A ``sentinel://`` URL with a query is a
:class:`~dataservice.errors.ConfigError`: TLS options there would otherwise be
dropped silently.

Given a plain connection class for a TLS URL, a pool takes its TLS kind
(``PackedConnection`` -> ``PackedSSLConnection``): a plain class would be
handed the TLS options it cannot take. For a ``unix://`` URL it takes the
class's Unix-socket kind (``PackedConnection`` -> ``PackedUnixConnection``)
alike: a TCP class would be handed the socket's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, quote, unquote

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from dataservice.compat.redis import use_connection_class
from dataservice.errors import ConfigError
from dataservice.redis.bounded import (
    BoundedConnection,
    BoundedSSLConnection,
    BoundedUnixConnection,
    bounds_calls,
)
from dataservice.redis.packing import (
    AsyncConnectionClass,
    AsyncPackedConnection,
    AsyncPackedSSLConnection,
    AsyncPackedUnixConnection,
    ConnectionClass,
    PackedConnection,
    PackedSSLConnection,
    PackedUnixConnection,
    uses_unix_socket,
)
from dataservice.redis.tls import RedisTLS, query_tls, uses_tls

SENTINEL_SCHEME: Final = "sentinel://"
SENTINEL_TLS_SCHEME: Final = "sentinels://"
SENTINEL_SCHEMES: Final = (SENTINEL_SCHEME, SENTINEL_TLS_SCHEME)
SENTINEL_PORT: Final = 26379
# How long a question to one Sentinel may take before the next is asked.
SENTINEL_TIMEOUT_S: Final = 1.0

_Pool = TypeVar("_Pool", bound=redis.ConnectionPool)
_AsyncPool = TypeVar("_AsyncPool", bound=redis.asyncio.ConnectionPool)
_Connection = TypeVar("_Connection", bound=redis.Connection | redis.UnixDomainSocketConnection)
_AsyncConnection = TypeVar(
    "_AsyncConnection", bound=redis.asyncio.Connection | redis.asyncio.UnixDomainSocketConnection
)


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """A ``sentinel://`` or ``sentinels://`` URL, read: the Sentinels, the
    primary's name, the db, and the TLS options (None: no TLS)."""

    sentinels: tuple[tuple[str, int], ...]
    primary: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: RedisTLS | None = None

    @classmethod
    def parse(cls, url: str, name: str = "the Redis URL") -> SentinelTarget:
        scheme = next((s for s in SENTINEL_SCHEMES if url.startswith(s)), None)
        if scheme is None:
            raise ConfigError(f"{name} is not a sentinel:// or sentinels:// URL")
        rest, asked, query = url[len(scheme) :].partition("?")
        if "#" in rest or "#" in query:
            raise ConfigError(f"{name}: a {scheme} URL takes no fragment (write a '#' as %23)")
        if asked and scheme == SENTINEL_SCHEME:
            raise ConfigError(
                f"{name}: a sentinel:// URL takes no query; for TLS write sentinels://,"
                " its options in the query"
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
        # Read after the rest: a "?" a password should have had as %3F fails
        # above, where no part of the password reaches the message.
        tls = _tls(query, name) if scheme == SENTINEL_TLS_SCHEME else None
        return cls(sentinels, unquote(parts[0]), db, username, password, tls)

    def kombu_url(self) -> str:
        """The URL kombu gets: the first Sentinel, the primary's credentials
        and the db. One URL only: kombu takes ``;``-joined URLs for fallbacks,
        and a fallback would take its scheme's stock transport in place of
        the service's. Every Sentinel, and the primary's name, go in
        transport options (``dataservice_sentinels``, ``master_name``); TLS
        goes in ``broker_use_ssl`` and ``sentinel_kwargs``, so the scheme is
        ``sentinel://`` either way."""
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
        over = " over TLS" if self.tls else ""
        return f"primary {self.primary!r} of the Sentinels at {sentinels}, db {self.db}{over}"

    def manager(self, options: Mapping[str, Any]) -> redis.sentinel.Sentinel:
        return redis.sentinel.Sentinel(
            self.sentinels, sentinel_kwargs={**_sentinel_options(options), **self.tls_options()}
        )

    def async_manager(self, options: Mapping[str, Any]) -> redis.asyncio.sentinel.Sentinel:
        return redis.asyncio.sentinel.Sentinel(
            self.sentinels, sentinel_kwargs={**_sentinel_options(options), **self.tls_options()}
        )

    def tls_options(self) -> dict[str, Any]:
        """What a redis-py client (``Redis(...)``, sync or asyncio) of a
        Sentinel or of a server of the group needs for TLS: none without."""
        if self.tls is None:
            return {}
        return {"ssl": True, **self.tls.connection_options()}

    def primary_options(self) -> dict[str, Any]:
        """A client's of a server of the group: the db, credentials and TLS
        (a Sentinel pool drops ``ssl``: its connection class says it)."""
        return {
            "db": self.db,
            "username": self.username,
            "password": self.password,
            **self.tls_options(),
        }


def _tls(query: str, name: str) -> RedisTLS | None:
    # Another key is refused without its name: it may be the tail of a
    # password whose "?" was not written %3F.
    if any(not key.startswith("ssl_") for key, _ in parse_qsl(query, keep_blank_values=True)):
        raise ConfigError(f"{name}: a sentinels:// URL's query takes TLS options (ssl_*) only")
    return query_tls(query, name, on=True)


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
    return url.startswith(SENTINEL_SCHEMES)


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


def sentinel_connection_class(cls: type[_Connection]) -> type[_Connection]:
    """``cls`` (and its hooks) finding the primary through its pool's Sentinels."""
    made: type[_Connection] = _mixed((redis.sentinel.SentinelManagedConnection,), cls)
    return made


def async_sentinel_connection_class(cls: type[_AsyncConnection]) -> type[_AsyncConnection]:
    """The same for asyncio connections."""
    made: type[_AsyncConnection] = _mixed((redis.asyncio.sentinel.SentinelManagedConnection,), cls)
    return made


def bound_sentinels(manager: redis.sentinel.Sentinel, tls: bool) -> None:
    """Ask ``manager``'s Sentinels within the calling thread's bound (what a
    caller has left of its deadline), as its pool's connections keep to it:
    else each Sentinel that does not answer costs up to
    :data:`SENTINEL_TIMEOUT_S` past it."""
    cls = BoundedSSLConnection if tls else BoundedConnection
    for sentinel in manager.sentinels:
        use_connection_class(sentinel, cls)


# The service's plain connection classes and their TLS kinds.
_TLS_KINDS: dict[type[Any], type[Any]] = {
    redis.Connection: redis.SSLConnection,
    PackedConnection: PackedSSLConnection,
    BoundedConnection: BoundedSSLConnection,
    redis.asyncio.Connection: redis.asyncio.SSLConnection,
    AsyncPackedConnection: AsyncPackedSSLConnection,
}


# Their Unix-socket kinds.
_UNIX_KINDS: dict[type[Any], type[Any]] = {
    redis.Connection: redis.UnixDomainSocketConnection,
    PackedConnection: PackedUnixConnection,
    BoundedConnection: BoundedUnixConnection,
    redis.asyncio.Connection: redis.asyncio.UnixDomainSocketConnection,
    AsyncPackedConnection: AsyncPackedUnixConnection,
}
_UNIX = (redis.UnixDomainSocketConnection, redis.asyncio.UnixDomainSocketConnection)


def _kind(url: str, cls: type[_Connection]) -> type[_Connection]:
    """``cls``, or its TLS kind for a TLS URL, or its Unix-socket kind for a
    ``unix://`` URL."""
    if uses_unix_socket(url) or issubclass(cls, _UNIX):
        return _unix_kind(url, cls)
    if not uses_tls(url) or issubclass(cls, redis.SSLConnection):
        return cls
    return _tls_kind(cls)


def _async_kind(url: str, cls: type[_AsyncConnection]) -> type[_AsyncConnection]:
    if uses_unix_socket(url) or issubclass(cls, _UNIX):
        return _unix_kind(url, cls)
    if not uses_tls(url) or issubclass(cls, redis.asyncio.SSLConnection):
        return cls
    return _tls_kind(cls)


def _unix_kind(url: str, cls: type[Any]) -> type[Any]:
    if not uses_unix_socket(url):
        # It would be handed a host and a port, and fail only when it connects.
        raise TypeError(f"{cls.__name__} is for a Unix socket: give a TCP URL a TCP class")
    if issubclass(cls, _UNIX):
        return cls
    made = _UNIX_KINDS.get(cls)
    if made is None:
        raise TypeError(
            f"{cls.__name__} has no Unix-socket kind: give a unix:// URL its Unix-socket class"
        )
    return made


def _tls_kind(cls: type[Any]) -> type[Any]:
    made = _TLS_KINDS.get(cls)
    if made is None:
        raise TypeError(f"{cls.__name__} has no TLS kind: give a TLS URL its TLS class")
    return made


def pool(
    url: str,
    pool_class: type[_Pool],
    connection_class: ConnectionClass | None = None,
    **options: Any,
) -> _Pool:
    """A pool of ``pool_class`` with connections of ``connection_class``
    (redis-py's for the URL if None; else the class, or its TLS or
    Unix-socket kind as the URL says) to the Redis at ``url``."""
    if not is_sentinel(url):
        if connection_class is None:
            return pool_class.from_url(url, **options)
        return pool_class.from_url(url, connection_class=_kind(url, connection_class), **options)
    target = SentinelTarget.parse(url)
    managed_pool = _mixed((_ClosesSentinels, redis.sentinel.SentinelConnectionPool), pool_class)
    connection = _kind(url, connection_class or redis.Connection)
    manager = target.manager(options)
    if bounds_calls(connection):
        bound_sentinels(manager, target.tls is not None)
    made: _Pool = managed_pool(
        target.primary,
        manager,
        connection_class=sentinel_connection_class(connection),
        **target.primary_options(),
        **options,
    )
    return made


def async_pool(
    url: str,
    pool_class: type[_AsyncPool],
    connection_class: AsyncConnectionClass | None = None,
    **options: Any,
) -> _AsyncPool:
    """The same for asyncio."""
    if not is_sentinel(url):
        if connection_class is None:
            return pool_class.from_url(url, **options)
        return pool_class.from_url(
            url, connection_class=_async_kind(url, connection_class), **options
        )
    target = SentinelTarget.parse(url)
    managed_pool = _mixed(
        (_AsyncClosesSentinels, redis.asyncio.sentinel.SentinelConnectionPool), pool_class
    )
    connection = _async_kind(url, connection_class or redis.asyncio.Connection)
    made: _AsyncPool = managed_pool(
        target.primary,
        target.async_manager(options),
        connection_class=async_sentinel_connection_class(connection),
        **target.primary_options(),
        **options,
    )
    return made


def client(
    url: str, connection_class: ConnectionClass | None = None, **options: Any
) -> redis.Redis:
    """A client of its own pool on the Redis at ``url``, ``options`` as
    redis-py's ``Redis.from_url`` takes them (``connection_class`` included:
    a plain class is taken in its TLS kind for a TLS URL, in its Unix-socket
    kind for a ``unix://`` one)."""
    if not is_sentinel(url):
        if connection_class is None:
            return redis.Redis.from_url(url, **options)
        return redis.Redis.from_url(url, connection_class=_kind(url, connection_class), **options)
    # Its own pool, closed with it, as from_url's.
    return redis.Redis.from_pool(pool(url, redis.ConnectionPool, connection_class, **options))


def async_client(
    url: str, connection_class: AsyncConnectionClass | None = None, **options: Any
) -> redis.asyncio.Redis:
    """The same for asyncio."""
    if not is_sentinel(url):
        if connection_class is None:
            return redis.asyncio.Redis.from_url(url, **options)
        return redis.asyncio.Redis.from_url(
            url, connection_class=_async_kind(url, connection_class), **options
        )
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
