"""Acceptance: bad input to admission gets a typed error and holds nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from dataservice.config import Config, LaneName, Settings
from dataservice.permits import LanePermits
from dataservice.proto import pb
from dataservice.service import RequestHandler
from dataservice.status import StatusCode
from dataservice.store import RecordStore, create_store_engine


@pytest.fixture
def handler(settings: Settings, config: Config, database: Engine) -> Iterator[RequestHandler]:
    engine = create_store_engine(settings.database_url, 2, config.database)
    lane = config.lanes[LaneName.INTERACTIVE]
    yield RequestHandler(config, lane, RecordStore(engine), LanePermits(lane))
    engine.dispose()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _write(deadline_ms: int, payload: bytes) -> tuple[str, bytes]:
    request_id = uuid.uuid4().hex
    envelope = pb.RequestEnvelope(
        caller="tests",
        request_id=request_id,
        deadline_unix_ms=deadline_ms,
        idempotency_key=request_id,
        write=pb.WriteRecordRequest(scope="admission", object_id="k", payload=payload),
    )
    return request_id, envelope.SerializeToString()


def _code(handler: RequestHandler, deadline_ms: int, payload: bytes = b"x") -> StatusCode | None:
    request_id, body = _write(deadline_ms, payload)
    reply = handler.handle(request_id, body)
    return None if reply is None else reply.code


def test_bad_deadlines_and_payloads_get_typed_errors_and_hold_no_permit(
    handler: RequestHandler, config: Config
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
        "too little time to run": (_now_ms() + 2, b"x", StatusCode.DEADLINE_EXCEEDED),
    }
    for name, (deadline, payload, expected) in cases.items():
        assert _code(handler, deadline, payload) is expected, name
    assert handler.permits.snapshot().acquired_total == 0
    # A deadline already past is dropped unanswered, also without a permit.
    assert _code(handler, _now_ms() - 1) is None
    assert handler.permits.snapshot().acquired_total == 0

    assert _code(handler, _now_ms() + 2000, b"x" * limit) is StatusCode.OK
    snapshot = handler.permits.snapshot()
    assert (snapshot.acquired_total, snapshot.released_total, snapshot.in_use) == (1, 1, 0)
