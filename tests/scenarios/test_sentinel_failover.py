"""A cell on a Sentinel-managed Redis: the broker, the answers, the limits and
the cache all reached by ``sentinel://`` URLs, and the primary SIGKILLed
while callers write.

By design each call then ends by its deadline (answered, or told with a typed
error: ``Unavailable``, ``RequestLost``, ``DeadlineExceeded``), the workers
and the callers find the promoted replica through the Sentinel by
themselves, and no write is applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dataservice_tools.localservices.sentinel import SentinelGroup
from sqlalchemy import Engine, text

from dataservice import (
    AsyncClient,
    Client,
    DataServiceError,
    DeadlineExceeded,
    Handle,
    ReadMode,
    Unavailable,
    WriteOp,
)
from dataservice.broker.celery import celery_app
from dataservice.broker.failover import CHECK_EVERY_S
from dataservice.client.handle import EPOCH_CHECK_S, LOST_AFTER_S
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from tests.harness.support import on_redis

pytestmark = [pytest.mark.fault, pytest.mark.timeout(240)]

CALLERS = 4
# Calls a second, all callers together, for RUN_S.
RATE = 200
RUN_S = 20.0
TIMEOUT_S = 2.0
# How long a call may take past its timeout: its thread's scheduling on a
# loaded machine, and the last reply on its way.
LATE_S = 0.5
BEFORE_KILL_S = 3.0
# A call's timeout while no Sentinel answers.
QUICK_S = 0.5
# At least this long after the promotion, however long it took.
AFTER_PROMOTION_S = 8.0
# The cell serves again this soon after the Sentinel names the new primary.
SERVES_AGAIN_S = 5.0


@pytest.fixture
def cell(tmp_path: Path) -> Iterator[SentinelGroup]:
    with SentinelGroup(tmp_path / "cell", sentinels=3) as group:
        yield group


@pytest.fixture
def workers(
    settings: Settings, config: Config, database: Engine, cell: SentinelGroup, tmp_path: Path
) -> Iterator[dict[LaneName, WorkerProcess]]:
    """A worker per lane, every URL the cell's Sentinel's."""
    on_cell = on_redis(settings, cell.url())
    (tmp_path / "logs").mkdir()
    started = {
        lane: WorkerProcess.for_lane(on_cell, lane, tmp_path / "logs" / f"{lane.value}.log").start()
        for lane in LaneName
    }
    control = celery_app("sentinel-control", on_cell, config)
    try:
        wait_answering(control, list(started.values()), 60.0)
        yield started
    finally:
        control.close()
        for worker in started.values():
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGCONT)
        stop_all(started.values())


@pytest.fixture
def served(settings: Settings, cell: SentinelGroup, workers: object) -> Settings:
    return on_redis(settings, cell.url())


def test_every_part_of_the_service_reaches_its_redis_through_the_sentinels(
    served: Settings, config: Config
) -> None:
    scope = f"t-{uuid.uuid4().hex[:12]}"
    with Client("tests", served, config) as client:
        client.write(scope, "a", b"first", idempotency_key=f"{scope}-a")
        assert client.read(scope, "a", mode=ReadMode.PRIMARY).payload == b"first"
        # Filled on the first, served from the cache on the second.
        assert client.read(scope, "a").payload == b"first"
        assert client.read(scope, "a").payload == b"first"
        handles = client.submit_many(
            [WriteOp(scope, f"b{n}", b"batch", idempotency_key=f"{scope}-b{n}") for n in range(5)]
        )
        assert [h.result().revision for h in handles] == [1] * 5

    async def awaited() -> bytes:
        async with AsyncClient("tests", served, config) as client:
            record = await client.read(scope, "b0", mode=ReadMode.PRIMARY)
            return record.payload

    assert asyncio.run(awaited()) == b"batch"


def test_with_no_sentinel_answering_a_call_ends_by_its_deadline(
    settings: Settings, config: Config, cell: SentinelGroup
) -> None:
    """Every Sentinel takes the question and answers none: a call's search for
    the primary keeps to its deadline, where asking the three in turn would
    take a second each."""
    on_cell = on_redis(settings, cell.url())
    with cell.sentinels_stopped(), Client("tests", on_cell, config) as client:
        started = time.monotonic()
        with pytest.raises((Unavailable, DeadlineExceeded)):
            client.read("t", "x", mode=ReadMode.PRIMARY, timeout=QUICK_S)
        took = time.monotonic() - started
    assert took <= QUICK_S + LATE_S, took


@dataclass(frozen=True, slots=True)
class Call:
    started: float
    ended: float
    outcome: str


class Writers:
    """``CALLERS`` threads, each its own ``Client``, writing new records (each
    under its own idempotency key) at ``RATE`` calls a second in all, until
    stopped; a call that takes longer than its turn delays the next."""

    def __init__(self, settings: Settings, config: Config, scope: str) -> None:
        self.calls: list[Call] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._args = (settings, config, scope)
        self._threads = [
            threading.Thread(target=self._write, args=(i,), daemon=True) for i in range(CALLERS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> list[Call]:
        self._stop.set()
        for thread in self._threads:
            thread.join(TIMEOUT_S + 10)
        assert not any(thread.is_alive() for thread in self._threads)
        return self.calls

    def _write(self, index: int) -> None:
        settings, config, scope = self._args
        interval = CALLERS / RATE
        with Client("tests", settings, config) as client:
            n = 0
            turn = time.monotonic()
            while not self._stop.is_set():
                turn += interval
                n += 1
                key = f"{scope}-{index}-{n}"
                started = time.monotonic()
                try:
                    client.write(scope, key, b"x", idempotency_key=key, timeout=TIMEOUT_S)
                    outcome = "ok"
                except DataServiceError as exc:
                    outcome = type(exc).__name__
                with self._lock:
                    self.calls.append(Call(started, time.monotonic(), outcome))
                self._stop.wait(max(turn - time.monotonic(), 0.0))


def test_a_failover_ends_every_call_by_its_deadline_and_the_cell_serves_again(
    served: Settings, config: Config, cell: SentinelGroup, database: Engine
) -> None:
    scope = f"t-{uuid.uuid4().hex[:12]}"
    writers = Writers(served, config, scope)
    started_at = time.monotonic()
    writers.start()
    time.sleep(BEFORE_KILL_S)
    old_port = cell.primary_port()
    assert old_port is not None
    killed_at = time.monotonic()
    cell.kill_primary()
    cell.wait_promoted(old_port)
    promoted_at = time.monotonic()
    time.sleep(max(AFTER_PROMOTION_S, started_at + RUN_S - promoted_at))
    calls = writers.stop()
    # The rate held, but for the failover's own moments.
    assert len(calls) >= RATE * (time.monotonic() - started_at) * 0.8

    outcomes = Counter(call.outcome for call in calls)
    late = [call for call in calls if call.ended - call.started > TIMEOUT_S + LATE_S]
    assert not late, f"calls past their deadline: {late[:5]} of {outcomes}"
    assert set(outcomes) <= {"ok", "Unavailable", "RequestLost", "DeadlineExceeded"}, outcomes
    before = [call for call in calls if call.ended < killed_at]
    assert before
    assert all(call.outcome == "ok" for call in before)
    again = [call for call in calls if call.started > promoted_at and call.outcome == "ok"]
    assert again, f"no call answered after the promotion: {outcomes}"
    assert again[0].ended - promoted_at < SERVES_AGAIN_S
    # Every call after the first one answered again is answered.
    after = [call for call in calls if call.started > again[0].ended]
    assert after
    assert all(call.outcome == "ok" for call in after), outcomes

    # No write applied twice: each key's row has its first revision.
    with database.connect() as connection:
        rows = connection.execute(
            text("SELECT revision FROM records WHERE scope = :s"), {"s": scope}
        )
        revisions = Counter(revision for (revision,) in rows)
    assert set(revisions) == {1}
    assert sum(revisions.values()) >= outcomes["ok"]


LOST = 20
# Far beyond the test: only a loss report, never the deadline, ends a wait.
LOST_TIMEOUT_S = 120.0
# Promotion, a keeper's beat, a caller's look at the epoch and the grace.
REPORTED_WITHIN_S = LOST_AFTER_S + EPOCH_CHECK_S + CHECK_EVERY_S + 10.0


def settle(handle: Handle) -> str:
    try:
        handle.result()
    except DataServiceError as exc:
        return type(exc).__name__
    return "ok"


def test_requests_a_failover_lost_are_reported_lost_and_applied_once_when_sent_again(
    served: Settings,
    config: Config,
    cell: SentinelGroup,
    workers: dict[LaneName, WorkerProcess],
    database: Engine,
) -> None:
    scope = f"t-{uuid.uuid4().hex[:12]}"
    ops = [WriteOp(scope, f"w{n}", b"x", idempotency_key=f"{scope}-{n}") for n in range(LOST)]
    batch = workers[LaneName.BATCH]
    with Client("tests", served, config) as client:
        # The epoch (set by the first request admitted) is on the replica too:
        # the promoted replica carries it.
        assert client.write(scope, "first", b"x").revision == 1
        cell.wait_replicated()
        old_port = cell.primary_port()
        assert old_port is not None
        # Queued on the primary alone: the batch worker takes none of them,
        # and the replica never receives them.
        os.kill(batch.pid, signal.SIGSTOP)
        with cell.replication_held():
            handles = [client.submit(op, timeout=LOST_TIMEOUT_S) for op in ops]
            cell.kill_primary()
        cell.wait_promoted(old_port)
        promoted_at = time.monotonic()
        os.kill(batch.pid, signal.SIGCONT)
        outcomes = Counter(settle(handle) for handle in handles)
        reported_in = time.monotonic() - promoted_at
        # The worker's blocked take may have held one before it stopped: that
        # one is answered; the rest are gone with the primary.
        assert set(outcomes) <= {"ok", "RequestLost"}, outcomes
        assert outcomes["RequestLost"] >= LOST - 2, outcomes
        assert reported_in < REPORTED_WITHIN_S
        # Sent again under their keys, each is applied once.
        again = client.submit_many(ops, timeout=30)
        assert [handle.result().revision for handle in again] == [1] * LOST
    with database.connect() as connection:
        rows = connection.execute(
            text("SELECT revision FROM records WHERE scope = :s"), {"s": scope}
        )
        assert sorted(revision for (revision,) in rows) == [1] * (LOST + 1)
