"""Acceptance (slow database): permits are held for as long as the database
works for a request, and all return to zero afterwards. Checked against the
server's own process list, not the service's counters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from celery import Celery
from dataservice_tools.localservices import redis_reachable
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import (
    Client,
    DataServiceError,
    DeadlineExceeded,
    ResourceExhausted,
    Unavailable,
)
from dataservice.broker.celery import celery_app
from dataservice.compat.celery import broadcast_request
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, OperationClass
from dataservice.limits.permits import PERMITS_COMMAND, LanePermits
from dataservice.ops.supervisor import Supervisor
from dataservice.store import Bounds, RecordStore, create_store_engine
from dataservice.store.connections import StatementTimeout, now_ms
from tests.conftest import SERVICE_USER, require
from tests.harness.support import connection_ids, on_redis, running_statements

SLOW_REDIS_URL = "redis://127.0.0.1:6379/13"
DELAY_MS = 150


@pytest.fixture(scope="module")
def slow_settings(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    data: dict[str, Any] = yaml.safe_load(settings.config_path.read_text())
    data["database"]["injected_delay_ms"] = DELAY_MS
    path: Path = tmp_path_factory.mktemp("slow") / "queues.yml"
    path.write_text(yaml.safe_dump(data))
    return on_redis(settings, SLOW_REDIS_URL, path)


@pytest.fixture(scope="module")
def slow_worker(
    slow_settings: Settings, database: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Celery]:
    """One interactive replica whose every operation spends DELAY_MS in the database."""
    require(redis_reachable(SLOW_REDIS_URL), "Redis at 127.0.0.1:6379")
    redis.Redis.from_url(SLOW_REDIS_URL).flushdb()
    config = load_config(slow_settings.config_path)
    supervisor = Supervisor(
        slow_settings, config, tmp_path_factory.mktemp("slow-logs"), lanes=(LaneName.INTERACTIVE,)
    )
    supervisor.start()
    control = celery_app("permit-gauge", slow_settings, config)
    try:
        supervisor.wait_ready()
        yield control
    finally:
        control.close()
        supervisor.stop()


def _gauge(control: Celery) -> tuple[int, set[int]]:
    ask = control.control.inspect(timeout=1.0, limit=1)
    replies = broadcast_request(ask, PERMITS_COMMAND) or {}
    in_use = sum(r["in_use"] for r in replies.values())
    held = {c for r in replies.values() for c in r["connection_ids"]}
    assert replies, "the replica did not answer the permit gauge"
    return in_use, held


class PermitChecker(threading.Thread):
    """Compares the process list with the permit gauge, as often as it can.

    A statement with the same query id before and after a gauge reading ran
    throughout it, so the permit of its connection must have been held.
    """

    def __init__(self, control: Celery, database: Engine) -> None:
        super().__init__()
        self.control, self.database = control, database
        self.stop = threading.Event()
        self.samples = self.seen_running = 0
        self.violations: list[tuple[int, int]] = []

    def run(self) -> None:
        while not self.stop.is_set():
            before = running_statements(self.database, SERVICE_USER)
            _, held = _gauge(self.control)
            after = running_statements(self.database, SERVICE_USER)
            self.violations += [s for s in before & after if s[0] not in held]
            self.samples += 1
            self.seen_running += len(before)


def _drive(settings: Settings, config: Config, requests: int) -> dict[str, int]:
    """Concurrent writes; half have a deadline shorter than the injected delay."""
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def call(client: Client, n: int) -> None:
        try:
            client.write("slow", f"k{n % 5}", b"x", timeout=0.1 if n % 2 else 3.0)
            kind = "ok"
        except (DeadlineExceeded, ResourceExhausted) as exc:
            kind = type(exc).__name__
        except Unavailable as exc:
            # A timed-out statement's connection is discarded; replacing many
            # at once meets the reconnect ramp, which refuses, retryably.
            kind = "ramp" if "reconnecting" in exc.message else f"other:{exc.message}"
        except DataServiceError as exc:
            kind = f"other:{type(exc).__name__}"
        with lock:
            outcomes[kind] = outcomes.get(kind, 0) + 1

    with Client("tests", settings, config) as client:
        callers = [threading.Thread(target=call, args=(client, n)) for n in range(requests)]
        for t in callers:
            t.start()
            time.sleep(0.01)
        for t in callers:
            t.join()
    return outcomes


@pytest.mark.timeout(120)
def test_no_permit_is_released_while_its_statement_runs_and_all_return(
    slow_worker: Celery, slow_settings: Settings, database: Engine
) -> None:
    checker = PermitChecker(slow_worker, database)
    checker.start()
    try:
        outcomes = _drive(slow_settings, load_config(slow_settings.config_path), 60)
    finally:
        checker.stop.set()
        checker.join()
    print(f"\noutcomes {outcomes}; {checker.samples} checks saw {checker.seen_running} statements")

    assert not checker.violations, f"permits released while statements ran: {checker.violations}"
    assert checker.samples >= 10
    assert checker.seen_running > 0, "the check never saw the database at work"
    assert outcomes.get("ok", 0) > 0
    assert outcomes.get("DeadlineExceeded", 0) > 0, outcomes
    assert not any(k.startswith("other") for k in outcomes), outcomes
    # Afterwards: no permit held, nothing running for the service.
    eventually(
        lambda: _gauge(slow_worker)[0] == 0 and not running_statements(database, SERVICE_USER),
        timeout=10, interval=0.1, message="every permit back and no statement running",
    )  # fmt: skip
    assert _gauge(slow_worker)[0] == 0
    assert not running_statements(database, SERVICE_USER)


def test_a_timed_out_statement_leaves_with_its_connection(
    settings: Settings, config: Config, database: Engine
) -> None:
    engine = create_store_engine(settings.database_url, 1, config.database)
    limit = config.database.max_statement_ms
    slow = RecordStore(engine, max_statement_ms=limit, injected_delay_ms=300)
    permits = LanePermits(config.lanes.interactive)

    try:
        with permits.acquire(OperationClass.POINT_READ, 1.0) as permit:
            with pytest.raises(StatementTimeout):
                slow.read("s", "a", Bounds(permit, deadline_ms=now_ms() + 50))
            killed = permit.connection_id
        assert killed is not None
        assert permits.snapshot().in_use == 0
        # The server no longer has the connection, and the pool made a new one.
        assert killed not in connection_ids(database, SERVICE_USER)
        fresh = RecordStore(engine, max_statement_ms=limit)
        with permits.acquire(OperationClass.POINT_READ, 1.0) as permit:
            fresh.read("s", "a", Bounds(permit, deadline_ms=now_ms() + 1000))
            assert permit.connection_id not in (None, killed)
    finally:
        engine.dispose()
