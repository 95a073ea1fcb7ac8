"""Acceptance: a write whose database connection is lost mid-statement is
answered UNAVAILABLE (retryable), the client retries it under its idempotency
key, and the change is applied exactly once.

The record's row is locked from a root session, so the service's write waits
inside its transaction; the test then KILLs the service's connection, as a
failover, a proxy or an operator would, and releases the lock.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, text

from dataservice import Client
from dataservice.types import WriteResult
from tests.conftest import SERVICE_USER
from tests.harness.support import counter

pytestmark = pytest.mark.usefixtures("interactive_worker")

_WAITING_WRITE = text(
    "SELECT ID FROM information_schema.PROCESSLIST"
    " WHERE USER = :user AND COMMAND = 'Query' AND INFO LIKE '%INSERT INTO records%'"
)


def _waiting_write(database: Engine, timeout_s: float) -> int:
    """The id of the service's connection whose write is waiting on the lock."""

    def waiting() -> int | None:
        with database.connect() as conn:
            found = conn.execute(_WAITING_WRITE, {"user": SERVICE_USER}).scalar()
        return None if found is None else int(found)  # a connection id is never 0

    return eventually(waiting, timeout=timeout_s, interval=0.02,
                      message="the service's write to reach the database")  # fmt: skip


@pytest.mark.fault
def test_a_write_lost_mid_statement_is_retried_and_applied_once(
    client: Client, database: Engine, scope: str
) -> None:
    assert client.write(scope, "r", b"before", timeout=5).revision == 1
    unavailable = counter(
        "dataservice_requests", lane="interactive", operation="write", code="UNAVAILABLE"
    )
    outcome: Future[WriteResult] = Future()
    key = f"{scope}-key"

    def write() -> None:
        try:
            outcome.set_result(client.write(scope, "r", b"after", idempotency_key=key, timeout=15))
        except Exception as exc:
            outcome.set_exception(exc)

    with database.connect() as locker:
        locker.execute(text("START TRANSACTION"))
        locker.execute(
            text("SELECT revision FROM records WHERE scope = :s AND object_id = 'r' FOR UPDATE"),
            {"s": scope},
        )
        writer = threading.Thread(target=write)
        writer.start()
        victim = _waiting_write(database, timeout_s=5)
        with database.connect() as killer:
            killer.execute(text(f"KILL CONNECTION {victim}"))
        locker.execute(text("ROLLBACK"))
    writer.join(20)

    result = outcome.result(timeout=0)
    assert result.revision == 2
    with database.connect() as conn:
        row = conn.execute(
            text("SELECT revision, payload FROM records WHERE scope = :s AND object_id = 'r'"),
            {"s": scope},
        ).one()
        outcomes = conn.execute(
            text("SELECT COUNT(*) FROM idempotency_keys WHERE caller = 'tests' AND idem_key = :k"),
            {"k": key},
        ).scalar_one()
    assert (int(row[0]), bytes(row[1])) == (2, b"after")
    assert outcomes == 1
    # The first attempt was answered UNAVAILABLE, and the client tried again.
    assert (
        counter("dataservice_requests", lane="interactive", operation="write", code="UNAVAILABLE")
        == unavailable + 1
    )
