"""Acceptance (faults never stretch a deadline): a Redis restart in the middle
of a batch backlog.

The service's Redis keeps nothing on disk, so a restart loses the queue. One
worker per lane serves a Redis of the test's own (broker, answers, limits and
cache), 100 ms in the database per operation, and writes are submitted one
message each, far more than the lane drains before Redis is killed and started
again, empty, on the same port. By design every accepted request is then
either answered or reported lost (``RequestLost``, after the grace in which a
worker that held it may still answer): none waits out its deadline, none is
dropped in silence. Sent again under the handle's idempotency key, every lost
write is applied once: none twice, even one that was applied before its
answer was lost.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from dataservice_tools.localservices import PrivateRedis
from sqlalchemy import Engine, create_engine, text

from dataservice import (
    Client,
    Handle,
    RequestLost,
    ResourceExhausted,
    Unavailable,
    WriteOp,
    WriteResult,
)
from dataservice.broker.celery import celery_app
from dataservice.client.handle import LOST_AFTER_S
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from tests.harness.support import on_redis, with_changes

WRITES = 300
# Taken before the restart: the lane drains about 30 a second.
ANSWERED_BEFORE = 20
DELAY_MS = 100
# The batch's deadline: far beyond how long the test may take, so that only a
# loss report, never the deadline, can end a wait for a lost request.
TIMEOUT_S = 600.0
# After the restart, every handle is settled within this long.
SETTLED_S = LOST_AFTER_S + 10.0

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture
def served(
    settings: Settings,
    config: Config,
    database: Engine,
    private_redis: PrivateRedis,
    tmp_path: Path,
) -> Iterator[Settings]:
    slow = with_changes(
        settings, tmp_path / "queues.yml", {("database", "injected_delay_ms"): DELAY_MS}
    )
    on_private = on_redis(slow, private_redis.url)
    (tmp_path / "logs").mkdir()
    workers = [
        WorkerProcess.for_lane(on_private, lane, tmp_path / "logs" / f"{lane.value}.log").start()
        for lane in LaneName
    ]
    control = celery_app("lost-control", on_private, config)
    try:
        wait_answering(control, workers, 60.0)
        yield on_private
    finally:
        control.close()
        stop_all(workers)


def resend(client: Client, ops: list[WriteOp]) -> list[Handle]:
    """``ops`` on the batch lane as a batch job would send them: what admission
    refuses for now (the restarted Redis's drain rate is still being learned)
    goes again after the retry-after it gave."""
    handles: list[Handle] = []
    deadline = time.monotonic() + 60
    while len(handles) < len(ops):
        try:
            handles += client.submit_many(ops[len(handles) :], timeout=TIMEOUT_S)
        except ResourceExhausted as exc:
            assert time.monotonic() < deadline, "admission kept refusing the resends"
            handles += [h for h in exc.accepted if isinstance(h, Handle)]
            time.sleep(max(exc.retry_after, 0.05))
    return handles


def settle(handle: Handle, until: float) -> str:
    """The handle's outcome: ``ok`` or the error's name. A result backend that
    does not answer for a moment (Redis starting again) is asked again."""
    while True:
        try:
            result = handle.result()
        except Unavailable as exc:
            if isinstance(exc, RequestLost):
                return "lost"
            if time.monotonic() > until:
                return "unavailable"
            time.sleep(0.1)
            continue
        except Exception as exc:
            return type(exc).__name__
        assert isinstance(result, WriteResult)
        return "ok"


@pytest.mark.fault
def test_a_restart_mid_backlog_answers_or_reports_every_accepted_request(
    served: Settings, config: Config, private_redis: PrivateRedis
) -> None:
    scope = f"t-{uuid.uuid4().hex[:12]}"
    ops = [
        WriteOp(scope, f"w{n}", f"payload {n}".encode(), idempotency_key=f"{scope}-{n}")
        for n in range(WRITES)
    ]
    with Client("tests", served, config) as client:
        # A message each, as callers sending one write at a time would: a
        # backlog that drains one operation at a time (submit_many would pack
        # them into one message, answered as a whole).
        handles = [client.submit(op, timeout=TIMEOUT_S) for op in ops]
        assert len({h.epoch for h in handles}) == 1
        assert handles[0].epoch
        # Let the lane answer some of them, then lose the rest with Redis.
        before = [settle(h, time.monotonic() + 30) for h in handles[:ANSWERED_BEFORE]]
        assert set(before) == {"ok"}
        private_redis.signal(signal.SIGKILL)
        private_redis.start()
        restarted = time.monotonic()

        outcomes = [settle(h, restarted + SETTLED_S) for h in handles[ANSWERED_BEFORE:]]
        settled_in = time.monotonic() - restarted
        counts = Counter(outcomes)
        assert set(counts) <= {"ok", "lost"}, counts
        assert counts["lost"] > 0, counts
        assert settled_in <= SETTLED_S, (settled_in, counts)

        # Sent again under their keys, the lost writes are applied once.
        lost = [
            op
            for op, outcome in zip(ops[ANSWERED_BEFORE:], outcomes, strict=True)
            if outcome == "lost"
        ]
        again = resend(client, lost)
        assert all(
            h.idempotency_key == op.idempotency_key for h, op in zip(again, lost, strict=True)
        )
        assert all(h.result().revision == 1 for h in again)  # type: ignore[union-attr]
    engine = create_engine(served.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT object_id, revision, payload FROM records WHERE scope = :s"),
                {"s": scope},
            ).all()
    finally:
        engine.dispose()
    assert sorted((r[0], r[1], bytes(r[2])) for r in rows) == sorted(
        (op.object_id, 1, op.payload) for op in ops
    )
    print(f"after the restart: {dict(counts)}, settled {settled_in:.1f} s after the restart")
