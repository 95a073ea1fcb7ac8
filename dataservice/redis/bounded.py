"""Redis calls that wait no longer than their caller has left.

redis-py fixes a socket timeout per connection pool when the pool is made (5 s
unless told otherwise): a server that stalls (stopped, paused, or cut off with
its connections left half-open) holds every command on it that long, whatever
the deadline of the request it serves. Inside :func:`within`, a thread's calls
on a pool of :class:`BoundedConnection` (or its TLS or Unix-socket twin) wait
no longer than the bound it gives, for everything they do: waiting for a
pooled connection (:class:`BoundedPool`), connecting, the connection's hello,
sending and reading the reply. Outside it they keep the pool's own figures.

A reply not read in time closes its connection (it would otherwise answer the
next command) and raises ``redis.TimeoutError``; a call made once the bound has
passed raises it without sending anything. Nothing is retried here: whoever
holds the deadline decides.

The Redis clients and pools the service's processes keep (callers' result
stores and broker channels, the workers', the change consumer's, the health
checks') are made with :data:`QUIET`: no client library reported and no
maintenance notifications asked for. redis-py would otherwise read its own
package metadata from disk for each new connection, send it in two ``CLIENT
SETINFO`` round trips (which callers' Redis users are refused) and ask for
``CLIENT MAINT_NOTIFICATIONS`` (which a Redis before 8 refuses): four times the
CPU per connect (``bench/connect.py``), paid by every connection at once when a
stalled or restarted Redis answers again, the moment a caller's thread most
needs the interpreter to return on time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, Final

import redis
from redis.maint_notifications import MaintNotificationsConfig

from dataservice.compat import redis as compat_redis
from dataservice.redis.packing import ConnectionClass, Packed, uses_unix_socket
from dataservice.redis.tls import uses_tls

# What a bounded call may take beyond its caller's deadline: a blocking
# command's reply, due just as the time runs out, must not race the socket's
# own timeout, and a reply on its way is worth its few milliseconds.
SLACK_S = 0.02
# The shortest wait a call is given: a socket timeout of 0 would mean
# non-blocking, not "no time left".
_FLOOR_S = 0.001

# Keyword arguments of the service's Redis clients and pools (see above).
QUIET: Final[Mapping[str, Any]] = MappingProxyType(
    {"driver_info": None, "maint_notifications_config": MaintNotificationsConfig(enabled=False)}
)

_bound = threading.local()


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Bound this thread's calls on bounded pools to ``seconds`` from now (a
    bound already in force that ends sooner stays)."""
    outer: float | None = getattr(_bound, "until", None)
    until = time.monotonic() + max(seconds, 0.0)
    _bound.until = until if outer is None else min(outer, until)
    try:
        yield
    finally:
        _bound.until = outer


def left() -> float | None:
    """Seconds this thread's bound leaves (at least a millisecond), or None outside one."""
    until: float | None = getattr(_bound, "until", None)
    if until is None:
        return None
    return max(until - time.monotonic(), _FLOOR_S)


def _limited(own: float | None) -> float | None:
    bound = left()
    if bound is None:
        return own
    return bound if own is None else min(own, bound)


class _Bounded(compat_redis.TimeoutHooks):
    """Socket timeouts that never outlast the calling thread's bound."""

    def bound_timeout(self, configured: float | None) -> float | None:
        return _limited(configured)

    def before_send(self) -> None:
        until: float | None = getattr(_bound, "until", None)
        if until is not None and time.monotonic() >= until:
            raise redis.TimeoutError("no time left for the call")


class BoundedConnection(_Bounded, Packed, redis.Connection):
    pass


class BoundedSSLConnection(_Bounded, Packed, redis.SSLConnection):
    pass


class BoundedUnixConnection(_Bounded, Packed, redis.UnixDomainSocketConnection):
    pass


class BoundedPool(compat_redis.WaitingPool):
    """A blocking pool whose wait for a free connection keeps to the bound too."""

    def bound_wait(self, configured: float | None) -> float | None:
        return _limited(configured)


def bounds_calls(cls: type[Any]) -> bool:
    """Whether connections of ``cls`` keep to the calling thread's bound."""
    return issubclass(cls, _Bounded)


def connection_class(url: str) -> ConnectionClass:
    """The bounded connection class for a Redis URL: TLS for ``rediss://``
    and ``sentinels://``, a Unix socket for ``unix://``."""
    if uses_unix_socket(url):
        return BoundedUnixConnection
    return BoundedSSLConnection if uses_tls(url) else BoundedConnection
