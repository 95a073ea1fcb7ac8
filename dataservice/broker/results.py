"""The result backend: where a worker leaves an answer and its caller picks it up.

Each answer is a one-element Redis list under :func:`~dataservice.redis.keys.result_key`,
written with its expiry in one step, so an abandoned answer disappears at the
request deadline plus the grace period; or, when its request named a reply
channel, one element of that channel's list (:func:`~dataservice.redis.keys.reply_key`),
which lives until the latest of its answers expires. The caller blocks on BLPOP
for at most its remaining time: one command to wait, one to deliver, nothing to
subscribe to, and an answer that arrives before its caller starts waiting is
still found.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dataservice.errors import Unavailable
from dataservice.redis import endpoints
from dataservice.redis.bounded import QUIET, SLACK_S, BoundedPool, connection_class, within
from dataservice.redis.keys import reply_key, result_key
from dataservice.redis.scripts import LuaScript

# BLPOP treats 0 as "forever"; a wait is never shorter than this instead.
_MIN_WAIT_S = 0.001
# The longest single BLPOP; a longer wait is a series of them.
_WAIT_SLICE_S = 2.0
# How long a caller may wait for a free connection to wait on; more concurrent
# waiters than the pool holds is a caller-side overload, reported as such.
_POOL_WAIT_S = 2.0
RETRY_RESULTS_DOWN_S = 0.5
_ANSWER = LuaScript("answer.lua", __package__)


@dataclass(frozen=True, slots=True)
class Completion:
    """A request leaving its lane: its admission counters, its place among the
    lane's held requests (sorted set, member) and its envelope size, the
    in-flight slot it held (sorted set, member) when that lives on this Redis,
    and its message's acknowledgement (kombu's unacked index, its unacked
    hash, the delivery tag) when the broker is this Redis."""

    admission_key: str
    held: tuple[str, str]
    size: int
    inflight: tuple[str, str] | None = None
    ack: tuple[str, str, str] | None = None
    # The operations its message carried, as admission counted them (a batch's many).
    ops: int = 1


@contextmanager
def _backend_errors() -> Iterator[None]:
    """A caller's view of a Redis failure: retryable, and without Redis's detail."""
    try:
        yield
    except redis.RedisError:
        raise Unavailable(
            "the result backend is unreachable", retry_after=RETRY_RESULTS_DOWN_S
        ) from None


class ResultStore:
    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    @property
    def client(self) -> redis.Redis:
        """The store's Redis client (admission's books share it on RabbitMQ)."""
        return self._redis

    @classmethod
    def from_url(cls, url: str, *, max_waiters: int = 64, bounded: bool = False) -> ResultStore:
        """A store on ``url``; ``bounded`` for a client, whose every wait keeps to
        the caller's deadline (:mod:`dataservice.redis.bounded`) and is not retried by
        redis-py (its back-off would sleep past the deadline)."""
        # Waits are cut into slices, so the socket timeout only needs to outlast
        # one slice; a half-open connection then costs seconds, not a deadline.
        options = {
            "max_connections": max_waiters,
            "timeout": _POOL_WAIT_S,
            "socket_timeout": _WAIT_SLICE_S + 3,
            "socket_connect_timeout": 2,
            "health_check_interval": 30,
            **QUIET,
        }
        if not bounded:
            return cls(
                redis.Redis(
                    connection_pool=endpoints.pool(url, redis.BlockingConnectionPool, **options)
                )
            )
        pool = endpoints.pool(url, BoundedPool, connection_class(url), **options)
        return cls(redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0)))

    def put(
        self,
        caller: str,
        request_id: str,
        body: bytes,
        expires_at_ms: int,
        done: Completion | None = None,
        channel: str = "",
    ) -> None:
        """Leave an answer until ``expires_at_ms`` (Unix ms); a past expiry stores nothing.

        ``done`` gives the request's bytes back to its lane's admission in the
        same transaction, so the bound and the answer never disagree.
        ``channel``: the reply channel the request named; the answer joins the
        others there, and the list lives until the latest of them expires.
        """
        ttl_ms = expires_at_ms - time.time_ns() // 1_000_000
        if ttl_ms <= 0:
            if done is not None:
                self.complete(done)
            return
        key = reply_key(caller, channel) if channel else result_key(caller, request_id)
        if done is not None:
            self._finish(key, body, ttl_ms, done)
            return
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, body)
            # A relative expiry (the Redis server's clock may differ from ours),
            # set on a new list and only ever lengthened: a channel's earlier
            # answers may have later deadlines.
            pipe.pexpire(key, ttl_ms, nx=True)
            pipe.pexpire(key, ttl_ms, gt=True)
            pipe.execute()

    def complete(self, done: Completion) -> None:
        """Give a request's bytes back to admission when it gets no answer."""
        self._finish(done.admission_key, b"", 0, done)

    def _finish(self, key: str, body: bytes, ttl_ms: int, done: Completion) -> None:
        # One script rather than a MULTI of up to nine commands: the same
        # atomicity for a fraction of the client's work.
        inflight, member = done.inflight or (done.admission_key, "")
        index, unacked, tag = done.ack or (done.admission_key, done.admission_key, "")
        held, held_member = done.held
        _ANSWER(
            self._redis,
            [key, done.admission_key, inflight, index, unacked, held],
            [body, ttl_ms, done.size, member, tag, held_member, done.ops],
        )

    def wait(
        self, caller: str, request_id: str, timeout_s: float, *, patience_s: float = 0.0
    ) -> bytes | None:
        """Take the answer, waiting up to ``timeout_s``; None if it did not come.

        ``patience_s``: how long the caller would wait in all, when this wait is
        one slice of a longer one. The reply to the last BLPOP is then read
        within it rather than within ``timeout_s``: Redis ends a BLPOP's wait by
        its own clock, from when it runs the command, and an answer it pops
        just after the caller's socket gave up is gone with the connection
        (slices of 1 s lost one answer at a slice's end on a busy machine).
        """
        key = result_key(caller, request_id)
        until = time.monotonic() + timeout_s
        with _backend_errors(), within(max(timeout_s, patience_s) + SLACK_S):
            try:
                if timeout_s <= 0:
                    value = self._redis.lpop(key)
                    return value if isinstance(value, bytes) else None
                while (left := until - time.monotonic()) > 0:
                    popped = self._redis.blpop(
                        [key], timeout=max(min(left, _WAIT_SLICE_S), _MIN_WAIT_S)
                    )
                    if popped is not None:
                        value = popped[1]
                        return value if isinstance(value, bytes) else None
            except redis.TimeoutError:
                # Out of time, the wait simply ended without an answer; with
                # time left, the backend failed to answer a live call.
                if time.monotonic() < until:
                    raise
        return None

    def close(self) -> None:
        self._redis.close()
        self._redis.connection_pool.disconnect()
