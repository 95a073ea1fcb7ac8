"""How long a request waits for a database permit (``lanes.<lane>.permit_wait_ms``).

The batch lane waits as long as the request's deadline allows: an admitted
operation is served, or runs out of time; it is never refused for want of a
permit. The interactive lane waits its short wait, then refuses, retryably and
with a reason. The permits are the real ones, held by other threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from dataservice_tools.localservices import redis_reachable
from sqlalchemy import Engine

from dataservice import Client
from dataservice.config.model import UNTIL_DEADLINE, Config, PermitWait, parse_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, OperationClass, StatusCode
from dataservice.handler.database import Database
from dataservice.handler.failures import TooLittleTime, verdict
from dataservice.limits.permits import LanePermits, PermitUnavailable
from dataservice.refusals import Reason
from dataservice.store import Bounds
from dataservice.types import WriteOp, WriteResult
from tests.conftest import SHIPPED_CONFIG, require
from tests.harness.support import now_ms, on_redis, scraped, with_changes, worker_process

INTERACTIVE_WAIT_MS = 100


def _lane(permit_wait_ms: PermitWait) -> LanePermits:
    data: dict[str, Any] = yaml.safe_load(SHIPPED_CONFIG.read_text())
    data["lanes"]["batch"].update(
        permits=1,
        classes={"point_read": 1, "point_write": 1, "bounded_list": 1},
        permit_wait_ms=permit_wait_ms,
    )
    return LanePermits(parse_config(data).lanes.batch)


@contextmanager
def held_for(permits: LanePermits, seconds: float) -> Iterator[None]:
    """The lane's one permit, held by another thread for ``seconds``."""
    taken = threading.Event()

    def hold() -> None:
        with permits.acquire(OperationClass.POINT_WRITE, 1.0):
            taken.set()
            time.sleep(seconds)

    holder = threading.Thread(target=hold)
    holder.start()
    assert taken.wait(5)
    try:
        yield
    finally:
        holder.join()


def test_a_batch_operation_waits_for_its_permit_past_the_interactive_wait() -> None:
    permits = _lane(UNTIL_DEADLINE)
    database = Database(permits, UNTIL_DEADLINE)
    started = time.monotonic()
    with held_for(permits, 0.8):
        answer = database.run(OperationClass.POINT_WRITE, now_ms() + 5000, lambda _: "served")
    assert answer == "served"
    assert time.monotonic() - started >= 0.7
    assert permits.snapshot().refused_total == 0


def test_a_wait_its_deadline_ends_is_out_of_time_not_a_refusal() -> None:
    permits = _lane(UNTIL_DEADLINE)
    with held_for(permits, 0.6), pytest.raises(TooLittleTime) as ended:
        Database(permits, UNTIL_DEADLINE).run(
            OperationClass.POINT_WRITE, now_ms() + 300, lambda _: "never"
        )
    answer = verdict(ended.value)
    assert answer.code is StatusCode.DEADLINE_EXCEEDED
    assert answer.reason is None


def test_an_interactive_request_is_refused_after_its_wait_and_says_why() -> None:
    permits = _lane(INTERACTIVE_WAIT_MS)
    with held_for(permits, 0.6):
        with pytest.raises(PermitUnavailable) as refused:
            Database(permits, INTERACTIVE_WAIT_MS).run(
                OperationClass.POINT_WRITE, now_ms() + 2000, lambda _: "never"
            )
        # Refused after its own wait, while the other still held the permit.
        assert permits.snapshot().in_use == 1
    answer = verdict(refused.value)
    assert (answer.code, answer.reason) == (StatusCode.RESOURCE_EXHAUSTED, Reason.NO_PERMIT)
    assert answer.retry_after_ms > 0


def test_a_transaction_bound_counts_from_its_permit_not_from_its_wait() -> None:
    permits = _lane(UNTIL_DEADLINE)
    given: list[tuple[Bounds, int]] = []
    with held_for(permits, 0.6):
        asked = now_ms()
        Database(permits, UNTIL_DEADLINE).run(
            OperationClass.POINT_WRITE,
            asked + 10_000,
            lambda bounds: given.append((bounds, now_ms())),
            hold_ms=300,
        )
    ((bound, at_ms),) = given
    assert bound.deadline_ms is not None
    # It waited for the permit, and its 300 ms started once it had it, not
    # when it asked.
    assert at_ms - asked >= 500
    assert bound.deadline_ms - at_ms >= 290


# A batch replica whose every operation spends DELAY_MS in the database:
# with 8 writes at once on its 3 permits, the last ones wait two rounds of
# it for a permit, longer than the interactive lane's permit wait.
DELAY_MS = 400
WRITES = 8
OWN_REDIS_URL = "redis://127.0.0.1:6379/9"


@pytest.fixture
def slow(settings: Settings, database: Engine, tmp_path: Path) -> Iterator[Settings]:
    """The service on a Redis database of its own, every operation DELAY_MS in the database."""
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(OWN_REDIS_URL)
    client.flushdb()
    yield with_changes(
        on_redis(settings, OWN_REDIS_URL),
        tmp_path / "queues.yml",
        {("database", "injected_delay_ms"): DELAY_MS},
    )
    client.flushdb()
    client.close()


@pytest.mark.slow
def test_a_batch_replica_serves_every_admitted_operation_that_waits_for_a_permit(
    slow: Settings, config: Config, tmp_path: Path
) -> None:
    lane = config.lanes.batch
    assert lane.permit_wait_ms == UNTIL_DEADLINE
    waited_ms = (WRITES // lane.permits) * DELAY_MS
    assert waited_ms > config.lanes.interactive.permit_wait_ms  # type: ignore[operator]
    with (
        worker_process(slow, config, LaneName.BATCH, tmp_path / "batch.log") as (_, port),
        Client("tests", slow, config) as client,
    ):
        started = time.monotonic()
        handles = [
            client.submit(WriteOp("permit-wait", f"w{n}", b"x"), timeout=30) for n in range(WRITES)
        ]
        answers = client.results(handles)
        elapsed_ms = (time.monotonic() - started) * 1000
        refused = scraped(port, "dataservice_rejections", lane="batch", reason="no_permit")
    assert all(isinstance(a, WriteResult) for a in answers), answers
    assert elapsed_ms >= waited_ms
    assert refused == 0
