"""Redis commands packed by hiredis in one call.

redis-py packs a command's arguments one at a time in Python (a type check and
an encode each) before hiredis writes the protocol: 2.5 ms for a script with
the 4,000 keys of a big transaction's invalidation, and a few per cent of a
worker's CPU on every request's scripts. hiredis packs ``str`` (as UTF-8),
``bytes``, ``int`` and ``float`` (as its ``repr``) itself, byte for byte as
redis-py does
(``tests/redis/test_packing.py``). A :class:`Packed` connection hands it a command
made only of those, on a connection with redis-py's default encoding; any
other command goes redis-py's way. The service's Redis clients are made with
one (:func:`packed_connection_class`; :mod:`dataservice.redis.bounded`'s connections
are packed too).

Each kind comes in three: TCP, TLS (``rediss://``, ``sentinels://``) and a
Unix socket (``unix://``), chosen by the URL. redis-py picks its own
``UnixDomainSocketConnection`` for a ``unix://`` URL, but a connection class
handed to ``from_url`` replaces it: a TCP one would then be given the
socket's ``path`` it cannot take.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import redis
import redis.asyncio
from hiredis import pack_command

from dataservice.compat import redis as compat_redis
from dataservice.redis.tls import uses_tls

UNIX_SCHEME = "unix://"

# redis-py's Unix-socket connections are no kind of its TCP ones.
ConnectionClass: TypeAlias = type[redis.Connection] | type[redis.UnixDomainSocketConnection]
AsyncConnectionClass: TypeAlias = (
    type[redis.asyncio.Connection] | type[redis.asyncio.UnixDomainSocketConnection]
)

_PLAIN = frozenset({str, bytes, int, float})


class Packed(compat_redis.CommandHook):
    """A connection mixin: plain commands packed by hiredis directly."""

    def pack(self, args: tuple[Any, ...]) -> list[bytes] | None:
        return _packed(self, args)


def _packed(connection: Any, args: tuple[Any, ...]) -> list[bytes] | None:
    if _plain(args) and compat_redis.default_encoding(connection):
        return [pack_command(args)]
    return None


def _plain(args: tuple[Any, ...]) -> bool:
    # redis-py splits a first argument with a space ("CLIENT SETNAME") in two.
    if not args or type(args[0]) is not str or " " in args[0]:
        return False
    # A script's call has dozens of arguments: checked in C, not a generator.
    return _PLAIN.issuperset(map(type, args))


class PackedConnection(Packed, redis.Connection):
    pass


class PackedSSLConnection(Packed, redis.SSLConnection):
    pass


class PackedUnixConnection(Packed, redis.UnixDomainSocketConnection):
    pass


class AsyncPacked(compat_redis.AsyncCommandHook):
    """The same for asyncio connections, which pack every command (pipelines'
    included) this way."""

    def pack(self, args: tuple[Any, ...]) -> list[bytes] | None:
        return _packed(self, args)


class AsyncPackedConnection(AsyncPacked, redis.asyncio.Connection):
    pass


class AsyncPackedSSLConnection(AsyncPacked, redis.asyncio.SSLConnection):
    pass


class AsyncPackedUnixConnection(AsyncPacked, redis.asyncio.UnixDomainSocketConnection):
    pass


def uses_unix_socket(url: str) -> bool:
    return url.startswith(UNIX_SCHEME)


def async_packed_connection_class(url: str) -> AsyncConnectionClass:
    """The packed asyncio connection class for a Redis URL: TLS for
    ``rediss://`` and ``sentinels://``, a Unix socket for ``unix://``."""
    if uses_unix_socket(url):
        return AsyncPackedUnixConnection
    return AsyncPackedSSLConnection if uses_tls(url) else AsyncPackedConnection


def packed_connection_class(url: str) -> ConnectionClass:
    """The packed connection class for a Redis URL: TLS for ``rediss://``
    and ``sentinels://``, a Unix socket for ``unix://``."""
    if uses_unix_socket(url):
        return PackedUnixConnection
    return PackedSSLConnection if uses_tls(url) else PackedConnection
