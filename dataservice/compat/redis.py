"""redis-py's internals the service relies on: when a connection reads its
socket timeouts, how an open connection takes a new one, how a blocking pool
waits for a free connection, and where a command is packed.

Tested with redis-py 8.2.0 (``pyproject.toml`` pins ``redis~=8.2.0`` for this
module's sake); ``tests/compat/test_compat_redis.py`` pins each name below, by
signature and by its behaviour on a real Redis, so that an upgrade that
changes one fails there rather than as a call that waits past its deadline.

The service's connections and pools (:mod:`dataservice.redis.bounded`,
:mod:`dataservice.redis.packing`) are built on the classes here and use only
their public hooks: :meth:`TimeoutHooks.bound_timeout`,
:meth:`TimeoutHooks.before_send`, :meth:`WaitingPool.bound_wait` and
:meth:`CommandHook.pack` (:class:`AsyncCommandHook`'s too).

Internal names, and why:

- ``redis.connection.AbstractConnection._socket_timeout``,
  ``_socket_connect_timeout``: the figures a connection was made with, which
  its ``__init__`` writes directly, past the properties ``socket_timeout``
  and ``socket_connect_timeout``; redis-py reads the properties each time it
  connects, arms a socket or builds a reply parser, and caches them nowhere
  else (``redis.UnixDomainSocketConnection``'s ``__init__`` writes its
  socket timeout once more, through the property, and its ``_connect``
  reads both properties as the TCP one's does). :class:`TimeoutHooks`
  overrides the properties and reads the figures through
  :meth:`~TimeoutHooks.bound_timeout`. Renamed, every command on such
  a connection fails with ``AttributeError``; read once and cached, a bound
  would hold only for connections opened inside it.
- ``redis.connection.AbstractConnection._get_socket``: the open socket, or
  None before the connection is made (connecting arms a new socket anyway).
  Renamed, every command fails with ``AttributeError``.
- ``redis.connection.AbstractConnection.update_current_socket_timeout``:
  given ``-1``, arms the open socket, and the copy its reply parser restores
  after a read, with ``socket_timeout`` as read now. Without it an open
  connection keeps the timeout it was opened with: a call on a pooled
  connection would wait the pool's full timeout on a stalled server.
- ``redis.connection.AbstractConnection.send_packed_command``: what every
  command a connection sends, alone or a pipeline's, passes through once,
  before anything is written: where a bound that has run out stops a call
  (:meth:`TimeoutHooks.before_send`) and the socket takes the call's timeout.
- ``redis.connection.AbstractConnection.send_command``: a command sent alone,
  with its arguments and its ``check_health`` keyword, before redis-py packs
  it (a pipeline packs its commands with ``pack_commands`` and sends them
  through ``send_packed_command``): where :meth:`CommandHook.pack` may pack it
  instead. Bypassed, commands go redis-py's slower way (nothing else changes).
- ``redis.asyncio.connection.AbstractConnection.pack_command``: every asyncio
  command, a pipeline's included (its ``pack_commands`` packs each through
  it): where :meth:`AsyncCommandHook.pack` may pack it instead.
- ``redis.connection.AbstractConnection.encoder``: its ``encoding`` and
  ``encoding_errors`` (the asyncio connection's too), compared with redis-py's
  default by :func:`default_encoding` before a command is packed as UTF-8.
  Renamed, :func:`default_encoding` fails with ``AttributeError``.
- ``redis.ConnectionPool.connection_class``: the class a pool's
  ``make_connection`` builds its next connection of, read at each build.
  redis-py makes each Sentinel's client as ``Redis(host, port,
  **sentinel_kwargs)``, which takes no connection class:
  :func:`use_connection_class` sets it on the client's pool before the
  client connects, so a caller's questions to the Sentinels keep to its
  deadline. Renamed, the questions go on plain connections (each up to the
  Sentinel timeout) and the pin test fails.
- ``redis.connection.parse_url``: what ``from_url`` reads out of a URL
  for a connection: of a ``unix://`` URL the socket's path, the database
  (``?db=``), the credentials and the query's other options, parsed.
  :func:`url_options` hands it to the broker's channels on a Unix socket
  (:mod:`dataservice.compat.kombu`), which kombu cannot read from the URL,
  so that they read it as every other client of the service does. Renamed,
  a broker channel on ``unix://`` fails as it is opened and the pin test
  fails.
- ``redis.BlockingConnectionPool.timeout``: how long ``get_connection``
  waits for a free connection, read at each wait; :class:`WaitingPool`
  overrides it and reads it through :meth:`~WaitingPool.bound_wait`. Read
  once and cached, a caller would wait the pool's full timeout for a
  connection whatever its deadline.
"""

from __future__ import annotations

from typing import Any

import redis

__all__ = [
    "AsyncCommandHook",
    "CommandHook",
    "TimeoutHooks",
    "WaitingPool",
    "default_encoding",
    "url_options",
    "use_connection_class",
]

# update_current_socket_timeout's argument for "the connection's socket_timeout, as read now".
_CURRENT = -1


class TimeoutHooks:
    """A connection mixin, placed before ``redis.Connection`` (or
    ``redis.SSLConnection``, or ``redis.UnixDomainSocketConnection``) among
    the bases: its socket timeouts pass through :meth:`bound_timeout`
    whenever redis-py reads them (to connect, to arm a socket, to read a
    reply), and an open connection's socket takes them again before each
    command is sent, after :meth:`before_send`."""

    # redis-py's, set by its __init__.
    _socket_timeout: float | None
    _socket_connect_timeout: float | None

    def bound_timeout(self, configured: float | None) -> float | None:
        """The timeout to use now in place of ``configured`` (the connection's own)."""
        return configured

    def before_send(self) -> None:
        """Called before each command is sent; may raise to send nothing."""

    @property
    def socket_timeout(self) -> float | None:
        return self.bound_timeout(self._socket_timeout)

    @socket_timeout.setter
    def socket_timeout(self, value: float | None) -> None:
        self._socket_timeout = value

    @property
    def socket_connect_timeout(self) -> float | None:
        return self.bound_timeout(self._socket_connect_timeout)

    @socket_connect_timeout.setter
    def socket_connect_timeout(self, value: float | None) -> None:
        self._socket_connect_timeout = value

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self.before_send()
        if self._get_socket() is not None:  # type: ignore[attr-defined]
            # An open connection keeps the timeout it was opened with: give it
            # this call's (or, without a bound, its own again).
            self.update_current_socket_timeout(_CURRENT)  # type: ignore[attr-defined]
        super().send_packed_command(command, check_health)  # type: ignore[misc]


class WaitingPool(redis.BlockingConnectionPool):
    """A blocking pool whose wait for a free connection passes through
    :meth:`bound_wait` at each wait."""

    _configured_wait: float | None

    def bound_wait(self, configured: float | None) -> float | None:
        """The wait to use now in place of ``configured`` (the pool's own)."""
        return configured

    @property
    def timeout(self) -> float | None:
        return self.bound_wait(self._configured_wait)

    @timeout.setter
    def timeout(self, value: float | None) -> None:
        self._configured_wait = value


class CommandHook:
    """A connection mixin, placed before ``redis.Connection`` (or
    ``redis.SSLConnection``, or ``redis.UnixDomainSocketConnection``) among
    the bases: a command sent alone is offered to :meth:`pack` first (a
    pipeline's commands go redis-py's way)."""

    def pack(self, args: tuple[Any, ...]) -> list[bytes] | None:
        """The command ``args`` as the bytes to send, or None to leave it to redis-py."""
        return None

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        packed = self.pack(args)
        if packed is None:
            super().send_command(*args, **kwargs)  # type: ignore[misc]
        else:
            self.send_packed_command(  # type: ignore[attr-defined]
                packed, check_health=kwargs.get("check_health", True)
            )


class AsyncCommandHook:
    """The same for ``redis.asyncio.Connection`` (or its SSL twin), whose
    every command, a pipeline's included, is offered to :meth:`pack`."""

    def pack(self, args: tuple[Any, ...]) -> list[bytes] | None:
        """The command ``args`` as the bytes to send, or None to leave it to redis-py."""
        return None

    def pack_command(self, *args: Any) -> list[bytes]:
        packed = self.pack(args)
        if packed is None:
            packed = super().pack_command(*args)  # type: ignore[misc]
        return packed


def default_encoding(connection: Any) -> bool:
    """Whether ``connection`` (sync or asyncio) encodes as redis-py does by
    default: UTF-8, strict."""
    encoder = connection.encoder
    return bool(encoder.encoding == "utf-8" and encoder.encoding_errors == "strict")


def use_connection_class(client: redis.Redis, cls: type[redis.Connection]) -> None:
    """Make ``client``'s next connections of ``cls`` (a client that has not
    connected yet: its pool holds none of another kind)."""
    client.connection_pool.connection_class = cls


def url_options(url: str) -> dict[str, Any]:
    """A connection's arguments as redis-py's ``from_url`` reads them from
    ``url``, without the connection class it would choose."""
    options: dict[str, Any] = redis.connection.parse_url(url)
    options.pop("connection_class", None)
    return options
