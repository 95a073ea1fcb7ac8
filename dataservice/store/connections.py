"""What happens to a connection on its way in and out of the pool.

- **Ramp**: new connections per process pass a token bucket
  (``database.connect_burst``, then ``database.connect_rate_per_s``), with a
  random phase per wait, so a restarted database, or one whose connections were
  all killed, sees a bounded reconnect ramp from every replica instead of a
  synchronized storm. A request waits for a token only until the last instant
  its operation could still run (``CONNECT_BY``): one that would get its
  connection too late is refused at once and leaves the token to one that can
  use it. Otherwise, with callers whose timeout is the pool's own wait, every
  token went to a request that then ran out of time, its new connection was
  discarded with the statement, and the pool never refilled: the reconnect
  loop of a proxy whose borrow wait equals its callers' timeout.
- **Gate**: no new connection while the process has a connection in custody
  (:mod:`dataservice.store.custody`): one the pool let go of that the server
  has not yet confirmed gone. A request waits for the gate, as for the ramp,
  only until its ``CONNECT_BY``.
- **Identity**: each connection learns its server-side id and the server's
  boot time once, so permits can name the connection they use, be matched
  against the process list, and a discarded connection can be confirmed gone.
- **Statement timeout**: a statement runs with the time its request has left,
  enforced by the server (MariaDB ``SET STATEMENT max_statement_time=... FOR``,
  MySQL's ``MAX_EXECUTION_TIME`` hint on SELECTs). Neither leaves anything on
  the session.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.pool import ConnectionPoolEntry

from dataservice.refusals import Refusal
from dataservice.store.custody import CONNECTION_ID, ORIGIN, Custody, attach, identify

DEADLINE_OPTION = "dataservice_deadline_ms"
# The least time worth starting a statement with: a primary-key statement and
# its round trip take well under this on a healthy database.
MIN_STATEMENT_MS = 5
# Server errors that mean "the statement ran out of its time".
STATEMENT_TIMEOUT_CODES = frozenset({1969, 3024})
# The last instant (Unix ms) at which the operation checking a connection out
# could still use a new one; None: no bound but the ramp's own wait. Set by
# the session around its checkout, read by the ramp on the same thread.
CONNECT_BY: ContextVar[int | None] = ContextVar("dataservice_connect_by", default=None)


class StatementTimeout(Refusal):
    """A statement ran, or would have run, past its request's remaining time."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ConnectRateLimited(Refusal):
    """Opening another connection now would exceed this process's reconnect ramp."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(
            f"connection ramp exhausted; retry in {retry_after:.3f} s",
            retry_after_ms=max(1, int(retry_after * 1000)),
        )
        self.retry_after = retry_after


class ConnectionsInDoubt(ConnectRateLimited):
    """A new connection would stand beside one the server has not yet
    confirmed gone (:mod:`dataservice.store.custody`): the process is
    reconnecting, as when its ramp is exhausted."""

    def __init__(self, retry_after: float = 0.25) -> None:
        super().__init__(retry_after)
        self.message = "connections in custody: the database has not confirmed they are gone"
        self.args = (self.message,)


class ConnectRamp:
    """A token bucket for new connections, shared by one process's pool."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = clock()
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()

    def take(self, max_wait_s: float) -> None:
        """Take one token, waiting up to ``max_wait_s``; else raise ConnectRateLimited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            wait = (1 - self._tokens) / self.rate
            if wait > max_wait_s:
                raise ConnectRateLimited(wait)
            # Reserve the token now (the balance goes negative) so that waiters
            # queue up in order and the rate holds however many threads wait.
            self._tokens -= 1
        # Jitter spreads replicas that lost their connections at the same
        # instant; it only ever lengthens a wait, so the rate bound holds.
        self._sleep(wait + random.uniform(0, min(0.5 / self.rate, max_wait_s - wait)))


def install(
    engine: Engine, ramp: ConnectRamp, custody: Custody, max_wait_s: float, max_statement_ms: int
) -> None:
    """Attach the gate, the ramp, the identity lookup, custody of discarded
    connections and the statement timeout to ``engine``.

    Each statement's timeout is computed when it is sent, from the request's
    absolute deadline (the ``DEADLINE_OPTION`` execution option), capped at
    ``max_statement_ms``; one that could no longer get ``MIN_STATEMENT_MS`` is
    not sent at all.
    """
    attach(engine, custody)

    @event.listens_for(engine, "do_connect")
    def _gate_and_ramp(dialect: Any, record: Any, cargs: Any, cparams: Any) -> None:
        connect_by = CONNECT_BY.get()
        wait_s = max_wait_s
        if connect_by is not None:
            wait_s = max(0.0, min(max_wait_s, (connect_by - now_ms()) / 1000))
        started = time.monotonic()
        if not custody.wait_clear(wait_s):
            raise ConnectionsInDoubt
        ramp.take(max(0.0, wait_s - (time.monotonic() - started)))

    @event.listens_for(engine, "connect")
    def _identify(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info[CONNECTION_ID], record.info[ORIGIN] = identify(dbapi_connection)
        custody.open_admin()

    @event.listens_for(engine, "close")
    def _discarded(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        custody.discarded(record.info.get(CONNECTION_ID), record.info.get(ORIGIN))

    @event.listens_for(engine, "engine_disposed")
    def _disposed(engine: Engine) -> None:
        custody.close()

    @event.listens_for(engine, "before_cursor_execute", retval=True)
    def _bound(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> tuple[str, Any]:
        deadline_ms = context.execution_options.get(DEADLINE_OPTION) if context else None
        if deadline_ms is None:
            return statement, parameters
        bounded = bounded_statement(
            statement, deadline_ms, max_statement_ms, mariadb=conn.dialect.is_mariadb
        )
        return bounded, parameters


def statement_bound_ms(deadline_ms: int, max_statement_ms: int) -> int:
    """How long a statement sent now may run: what the request has left until
    ``deadline_ms`` (Unix ms), at most ``max_statement_ms``. Raises
    :class:`StatementTimeout` when that is less than ``MIN_STATEMENT_MS``."""
    timeout_ms = min(deadline_ms - now_ms(), max_statement_ms)
    if timeout_ms < MIN_STATEMENT_MS:
        raise StatementTimeout
    return timeout_ms


def bounded_statement(
    statement: str, deadline_ms: int, max_statement_ms: int, *, mariadb: bool
) -> str:
    """``statement`` with its server-side timeout: what the request has left
    until ``deadline_ms`` (Unix ms), at most ``max_statement_ms``. Raises
    :class:`StatementTimeout` when that is less than ``MIN_STATEMENT_MS``."""
    timeout_ms = statement_bound_ms(deadline_ms, max_statement_ms)
    if mariadb:
        return f"SET STATEMENT max_statement_time={timeout_ms / 1000:.3f} FOR {statement}"
    if statement.startswith("SELECT"):
        return f"SELECT /*+ MAX_EXECUTION_TIME({int(timeout_ms)}) */{statement[6:]}"
    return statement
