"""Acceptance: a worker killed with SIGKILL in the middle of 200 concurrent
idempotent writes loses no acknowledged write and applies none twice.

Two interactive worker processes serve the writes; one is killed once a
quarter of them have been acknowledged. Its in-flight transactions die with
its connections (the database rolls them back); its unacknowledged messages
are not redelivered before their deadlines. Afterwards every write is sent
again under its original idempotency key, as a caller who timed out would.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import redis_reachable
from sqlalchemy import Engine, text

from dataservice import Client, DataServiceError
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess
from dataservice.types import WriteResult
from tests.conftest import require
from tests.harness.support import lane_workers, on_redis

pytestmark = pytest.mark.fault

OWN_REDIS_URL = "redis://127.0.0.1:6379/9"
WRITES = 200
CALLERS = 16
KILL_AFTER = WRITES // 4


@pytest.fixture
def two_workers(
    settings: Settings, config: Config, database: Engine, tmp_path: Path
) -> Iterator[tuple[Settings, list[WorkerProcess]]]:
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    own = on_redis(settings, OWN_REDIS_URL)
    redis.Redis.from_url(OWN_REDIS_URL).flushdb()
    try:
        with lane_workers(own, config, LaneName.INTERACTIVE, tmp_path) as workers:
            yield own, workers
    finally:
        redis.Redis.from_url(OWN_REDIS_URL).flushdb()


def _revisions(database: Engine, scope: str) -> dict[str, tuple[int, bytes]]:
    with database.connect() as conn:
        rows = conn.execute(
            text("SELECT object_id, revision, payload FROM records WHERE scope = :s"), {"s": scope}
        )
        return {row[0]: (int(row[1]), bytes(row[2])) for row in rows}


def _keys_recorded(database: Engine, scope: str) -> int:
    with database.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT COUNT(*) FROM idempotency_keys"
                    " WHERE caller = 'tests' AND idem_key LIKE :prefix"
                ),
                {"prefix": f"{scope}-%"},
            ).scalar_one()
        )


@pytest.mark.timeout(120)
def test_sigkill_mid_writes_loses_no_acknowledged_write_and_applies_none_twice(
    two_workers: tuple[Settings, list[WorkerProcess]],
    config: Config,
    database: Engine,
    scope: str,
) -> None:
    settings, workers = two_workers
    acknowledged: dict[int, WriteResult] = {}
    failed: dict[int, str] = {}
    lock = threading.Lock()
    killed = threading.Event()

    def write(client: Client, n: int) -> None:
        try:
            result = client.write(
                scope, f"obj-{n}", f"payload-{n}".encode(), idempotency_key=f"{scope}-{n}",
                timeout=8,
            )  # fmt: skip
        except DataServiceError as exc:
            with lock:
                failed[n] = type(exc).__name__
            return
        with lock:
            acknowledged[n] = result
            if len(acknowledged) >= KILL_AFTER and not killed.is_set():
                killed.set()
                workers[0].send_signal(signal.SIGKILL)

    clients = [Client("tests", settings, config) for _ in range(CALLERS)]
    try:
        with ThreadPoolExecutor(CALLERS) as pool:
            for n in range(WRITES):
                pool.submit(write, clients[n % CALLERS], n)
    finally:
        for client in clients:
            client.close()
    assert killed.is_set()
    assert workers[0].wait(5) == -signal.SIGKILL
    assert len(acknowledged) + len(failed) == WRITES

    stored = _revisions(database, scope)
    for n, result in acknowledged.items():
        assert stored[f"obj-{n}"] == (1, f"payload-{n}".encode()), n
        assert (result.revision, result.created) == (1, True)
    # Applied at most once: every record at revision 1, and one recorded
    # outcome per applied write (an unacknowledged write may have applied).
    assert all(revision == 1 for revision, _ in stored.values())
    assert _keys_recorded(database, scope) == len(stored)

    # The callers retry everything under the same keys on the surviving worker.
    with Client("tests", settings, config) as client:
        for n in range(WRITES):
            again = client.write(
                scope, f"obj-{n}", f"payload-{n}".encode(), idempotency_key=f"{scope}-{n}",
                timeout=8,
            )  # fmt: skip
            assert (again.revision, again.created) == (1, True), n
    stored = _revisions(database, scope)
    assert len(stored) == WRITES
    assert all(revision == 1 for revision, _ in stored.values())
    assert _keys_recorded(database, scope) == WRITES
