"""Acceptance: bad input to admission gets a typed error and holds nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import Engine

from dataservice import Client, InvalidArgument
from dataservice.client.transport import Transport
from dataservice.codec import decode_response
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, StatusCode
from dataservice.handler import RequestHandler
from dataservice.handler.database import Database
from dataservice.handler.durations import RecentDurations
from dataservice.limits.permits import LanePermits
from dataservice.proto import pb
from dataservice.redis.keys import admission_key
from dataservice.security.callers import CallerKey
from dataservice.store import RecordStore, create_store_engine
from tests.harness.support import caller_key, handler_for, signed


@pytest.fixture
def parts(
    settings: Settings, config: Config, database: Engine
) -> Iterator[tuple[RequestHandler, Database]]:
    engine = create_store_engine(settings.database_url, 2, config.database)
    store = RecordStore(engine, max_statement_ms=config.database.max_statement_ms)
    handler, way_in, limits = handler_for(settings, config, LaneName.INTERACTIVE, store)
    yield handler, way_in
    limits.close()
    engine.dispose()


@pytest.fixture
def handler(parts: tuple[RequestHandler, Database]) -> RequestHandler:
    return parts[0]


@pytest.fixture
def permits(parts: tuple[RequestHandler, Database]) -> LanePermits:
    """The permits the handler's operations take."""
    return parts[1].permits


@pytest.fixture(scope="module")
def key(settings: Settings) -> CallerKey:
    return caller_key(settings)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _write(key: CallerKey, deadline_ms: int, payload: bytes) -> tuple[str, bytes]:
    request_id = uuid.uuid4().hex
    envelope = pb.RequestEnvelope(
        caller="tests",
        request_id=request_id,
        deadline_unix_ms=deadline_ms,
        issued_at_unix_ms=_now_ms(),
        idempotency_key=request_id,
        write=pb.WriteRecordRequest(scope="admission", object_id="k", payload=payload),
    )
    return request_id, signed(envelope, key)


def _code(
    handler: RequestHandler, key: CallerKey, deadline_ms: int, payload: bytes = b"x"
) -> StatusCode | None:
    request_id, body = _write(key, deadline_ms, payload)
    reply = handler.handle(request_id, body)
    return None if reply is None else reply.code


def test_bad_deadlines_and_payloads_get_typed_errors_and_hold_no_permit(
    handler: RequestHandler, permits: LanePermits, config: Config, key: CallerKey
) -> None:
    limit = config.limits.max_payload_bytes
    cases = {
        "negative deadline": (-5, b"x", StatusCode.INVALID_ARGUMENT),
        "zero deadline": (0, b"x", StatusCode.INVALID_ARGUMENT),
        "absurd deadline (year 2500)": (16_725_225_600_000, b"x", StatusCode.INVALID_ARGUMENT),
        "beyond the lane maximum": (
            _now_ms() + config.lanes.interactive.max_deadline_ms + 60_000,
            b"x",
            StatusCode.INVALID_ARGUMENT,
        ),
        "payload over the bound": (
            _now_ms() + 2000,
            b"x" * (limit + 1),
            StatusCode.INVALID_ARGUMENT,
        ),
    }
    for name, (deadline, payload, expected) in cases.items():
        assert _code(handler, key, deadline, payload) is expected, name
    too_little_time = _code(handler, key, _now_ms() + 3)
    assert too_little_time is StatusCode.DEADLINE_EXCEEDED
    assert permits.snapshot().acquired_total == 0
    # A deadline already past is dropped unanswered, also without a permit.
    assert _code(handler, key, _now_ms() - 1) is None
    assert permits.snapshot().acquired_total == 0

    assert _code(handler, key, _now_ms() + 2000, b"x" * limit) is StatusCode.OK
    snapshot = permits.snapshot()
    assert (snapshot.acquired_total, snapshot.released_total, snapshot.in_use) == (1, 1, 0)


@pytest.mark.usefixtures("interactive_worker")
def test_rejected_requests_hold_no_queue_slot_or_bytes(
    client: Client,
    transport: Transport,
    redis_client: redis.Redis,
    config: Config,
    key: CallerKey,
) -> None:
    queue = config.lanes.interactive.queue
    stats = admission_key(queue)
    # Refused by the client: nothing is published.
    with pytest.raises(InvalidArgument):
        client.write("admission", "k", b"x", timeout=-1)
    with pytest.raises(InvalidArgument):
        client.write("admission", "k", b"x" * (config.limits.max_payload_bytes + 1))
    # Published straight to the queue, refused by the worker: bytes come back.
    for deadline in (-5, 16_725_225_600_000):
        request_id, body = _write(key, deadline, b"x")
        transport.publish(body, request_id=request_id, lane=LaneName.INTERACTIVE,
                          deadline_ms=_now_ms() + 2000)  # fmt: skip
        answer = transport.results.wait("tests", request_id, 5.0)
        assert answer is not None
        with pytest.raises(InvalidArgument):
            decode_response(answer, request_id)
    assert redis_client.llen(queue) == 0
    assert int(redis_client.hget(stats, "bytes") or 0) == 0


@pytest.mark.usefixtures("interactive_worker")
def test_a_request_dropped_as_late_gives_its_bytes_back(
    transport: Transport, redis_client: redis.Redis, config: Config, key: CallerKey
) -> None:
    stats = admission_key(config.lanes.interactive.queue)
    # Late by the time a worker sees it: dropped unanswered, and still counted as done.
    request_id, body = _write(key, _now_ms() - 1, b"late")
    done_before = int(redis_client.hget(stats, "done") or 0)
    transport.publish(body, request_id=request_id, lane=LaneName.INTERACTIVE,
                      deadline_ms=_now_ms() + 2000)  # fmt: skip
    assert transport.results.wait("tests", request_id, 1.0) is None
    assert int(redis_client.hget(stats, "done") or 0) == done_before + 1
    assert int(redis_client.hget(stats, "bytes") or 0) == 0


def test_a_request_with_less_time_than_its_operation_needs_never_reaches_the_database(
    parts: tuple[RequestHandler, Database], key: CallerKey
) -> None:
    from dataservice.enums import OperationClass

    handler, database = parts
    # Writes have recently taken about 400 ms in the database.
    for _ in range(20):
        database.durations.record(OperationClass.POINT_WRITE, 400.0)
    assert _code(handler, key, _now_ms() + 200) is StatusCode.DEADLINE_EXCEEDED
    assert database.permits.snapshot().acquired_total == 0
    assert _code(handler, key, _now_ms() + 2000) is StatusCode.OK


def test_an_old_estimate_that_nothing_renews_no_longer_refuses(
    parts: tuple[RequestHandler, Database], key: CallerKey
) -> None:
    """A few slow writes once (a reconnect, a stall) must not refuse every later
    request for good: only successes renew the estimate, so it expires."""
    from dataservice.enums import OperationClass
    from dataservice.handler.durations import MAX_AGE_S

    handler, database = parts
    now = [0.0]
    durations: RecentDurations[OperationClass] = RecentDurations(clock=lambda: now[0])
    database.durations = durations
    for _ in range(20):
        durations.record(OperationClass.POINT_WRITE, 5000.0)
    assert _code(handler, key, _now_ms() + 2000) is StatusCode.DEADLINE_EXCEEDED
    now[0] += MAX_AGE_S + 0.1
    assert _code(handler, key, _now_ms() + 2000) is StatusCode.OK
    assert database.permits.snapshot().acquired_total == 1
