"""What failures look like, on purpose: each drill provokes one, and checks
that the service answered it as documented.

- **Outside the allowlist**: a read of a scope the caller is not granted is
  refused ``PERMISSION_DENIED`` (``scope_denied``) before any cache or database work.
- **A batch backlog**: thousands of writes queued one per message, then a
  read whose deadline the queue cannot meet is refused at publish
  (``queue_too_long``) instead of timing out in the queue.
- **A locked record**: another transaction holds the record's row lock; a write
  with a 0.5 s timeout stops at its deadline (the statement timeout), not at
  the database's 50 s lock wait.
- **A connection killed mid-statement**: the same, with the waiting
  connection killed; then, the lock released, a retry under the same
  idempotency key applies the change exactly once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

from dataservice.client import Client, Handle
from dataservice.enums import ReadMode
from dataservice.errors import DataServiceError, ResourceExhausted
from dataservice.types import ReadOp, WriteOp

BACKLOG = 3000
_ONCE = b"applied once"
_LOCK_WAIT_FIND_S = 3.0


@dataclass(frozen=True, slots=True)
class Drill:
    name: str
    # Any of these is the documented answer.
    expected: tuple[str, ...]
    observed: str

    @property
    def ok(self) -> bool:
        return self.observed in self.expected


def _outcome(call: Callable[[], object]) -> str:
    """The error a call raised (its class, and reason if any), or ``OK``."""
    try:
        call()
    except DataServiceError as exc:
        reason = getattr(exc, "reason", "")
        return f"{type(exc).__name__} ({reason})" if reason else type(exc).__name__
    return "OK"


def outside_the_allowlist(client: Client) -> Drill:
    observed = _outcome(lambda: client.read("outside-the-demo", "any", timeout=1.0))
    return Drill("read outside the caller's scopes", ("PermissionDenied (scope_denied)",), observed)


def _submit_one_by_one(client: Client, ops: list[WriteOp]) -> list[Handle]:
    """Submit each in a message of its own: what the caller's rate refuses
    is sent again after the retry-after."""
    handles: list[Handle] = []
    while len(handles) < len(ops):
        try:
            handles.append(client.submit(ops[len(handles)], timeout=120))
        except ResourceExhausted as refused:
            time.sleep(refused.retry_after)
    return handles


def batch_backlog(client: Client, scope: str, run: str) -> Drill:
    """Queued faster than the lane drains, at the caller's own rate; by the
    end admission has measured the drain rate it refuses by.

    One operation per message: ``submit_many`` would pack the backlog into a
    few messages that the lane's threads take off the queue at once and commit
    in a few hundred milliseconds, which leaves no queue to refuse by."""
    ops = [WriteOp(scope, f"backlog-{run}-{n:05d}", b"backlog") for n in range(BACKLOG)]
    handles = _submit_one_by_one(client, ops)
    observed = _outcome(lambda: client.submit(ReadOp(scope, ops[0].object_id), timeout=0.3))
    for handle in handles:
        handle.result()
    return Drill(
        f"a read due in 0.3 s behind {BACKLOG} batch writes",
        # Refused by admission, or, once the client has seen the lane refuse
        # most of what it sent (its pacing), by the client's own throttle.
        ("ResourceExhausted (queue_too_long)", "ResourceExhausted (throttled)"),
        observed,
    )


class RowLock:
    """Another writer's transaction holding one record's row lock."""

    def __init__(self, database_url: str, scope: str, object_id: str) -> None:
        self._engine = create_engine(database_url, poolclass=NullPool)
        self._conn: Connection = self._engine.connect()
        self.connection_id = int(self._conn.execute(text("SELECT CONNECTION_ID()")).scalar_one())
        # SQLAlchemy's autobegin: the transaction that holds the lock began above.
        self._conn.execute(
            text("SELECT revision FROM records WHERE scope = :s AND object_id = :o FOR UPDATE"),
            {"s": scope, "o": object_id},
        )

    def waiting_connection(self) -> int | None:
        """The connection of this account running a statement that is not this
        lock's own (the demo's only one: the write waiting for the lock)."""
        with self._engine.connect() as conn:
            rows = conn.execute(text("SHOW PROCESSLIST")).all()
        for row in rows:
            if (
                row.Command == "Query"
                and row.Id != self.connection_id
                and row.Info != ("SHOW PROCESSLIST")
            ):
                return int(row.Id)
        return None

    def kill(self, connection_id: int) -> None:
        with self._engine.connect() as conn:
            conn.execute(text(f"KILL {int(connection_id)}"))

    def release(self) -> None:
        self._conn.rollback()
        self._conn.close()
        self._engine.dispose()


def locked_record(client: Client, database_url: str, scope: str, run: str) -> list[Drill]:
    object_id = f"locked-{run}"
    base = client.write(scope, object_id, b"before the lock").revision
    lock = RowLock(database_url, scope, object_id)
    key = f"demo-{run}-killed"
    try:
        timed_out = _outcome(lambda: client.write(scope, object_id, b"in time?", timeout=0.5))
        killed, retried = _killed_mid_statement(client, lock, scope, object_id, key)
    finally:
        lock.release()
    after = _outcome(lambda: client.write(scope, object_id, _ONCE, idempotency_key=key))
    record = client.read(scope, object_id, mode=ReadMode.PRIMARY)
    once = "OK" if after == "OK" and record.revision == base + 1 else f"revision {record.revision}"
    return [
        Drill("a write, timeout 0.5 s, on a locked record", ("DeadlineExceeded",), timed_out),
        # Whether the answer beats the caller's own deadline is a matter of
        # milliseconds; either way nothing was applied, and a retry may follow.
        Drill("its connection killed while it waits", ("DeadlineExceeded", "Unavailable"), killed),
        Drill("the retry under its idempotency key", ("OK",), once if retried else "not run"),
    ]


def _killed_mid_statement(
    client: Client, lock: RowLock, scope: str, object_id: str, key: str
) -> tuple[str, bool]:
    """Write under ``key``, kill the connection waiting for the lock: the
    caller hears of it at its deadline (the permit is held until the server's
    own bound has passed, so the answer comes too late to matter)."""
    done: Future[str] = Future()

    def write() -> None:
        done.set_result(
            _outcome(
                lambda: client.write(scope, object_id, _ONCE, idempotency_key=key, timeout=2.0)
            )
        )

    writer = threading.Thread(target=write, name="demo-killed-write")
    writer.start()
    victim = None
    stop = time.monotonic() + _LOCK_WAIT_FIND_S
    while victim is None and time.monotonic() < stop:
        time.sleep(0.05)
        victim = lock.waiting_connection()
    if victim is not None:
        lock.kill(victim)
    writer.join()
    return done.result(), victim is not None
