"""Acceptance: bad input is answered INVALID_ARGUMENT, changes nothing, and the
worker keeps serving. Envelopes are published straight onto the queue, past
the client's own validation, correctly signed: what is wrong is inside.

A body that is not even a signed request names nobody to answer; it is
counted (``dataservice_rejections_total{reason="malformed"}``) and dropped."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import Client, InvalidArgument, ReadMode
from dataservice.broker.celery import TASK_NAME, celery_app
from dataservice.client.transport import Transport
from dataservice.codec import decode_response
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.proto import pb
from dataservice.redis.keys import admission_key
from dataservice.security.auth import sign
from dataservice.security.callers import CallerKey
from tests.conftest import SERVICE_USER
from tests.harness.support import (
    caller_key,
    counter,
    now_ms,
    row_count,
    signed,
    statements_by,
    table_checksum,
)

pytestmark = pytest.mark.usefixtures("interactive_worker")


def _deadline(seconds: float = 5.0) -> int:
    return int((time.time() + seconds) * 1000)


def _envelope(request_id: str, **operation: Any) -> pb.RequestEnvelope:
    return pb.RequestEnvelope(
        caller="tests",
        request_id=request_id,
        deadline_unix_ms=_deadline(),
        issued_at_unix_ms=now_ms(),
        **operation,
    )


def _encoded(envelope: pb.RequestEnvelope) -> bytes:
    return envelope.SerializeToString()


def _unknown_operation(rid: str) -> bytes:
    # Field 20 is no operation this schema knows: a newer client's, say.
    unknown_field = b"\xa2\x01\x03abc"
    return _encoded(_envelope(rid)) + unknown_field


# Not a signed request at all: nobody to answer.
UNREADABLE_BODIES: dict[str, Callable[[Config], bytes]] = {
    "garbage bytes": lambda _: b"\xff\xfe\x00garbage\x17\x99",
    "oversized body": lambda config: b"\x0a" + b"\x00" * (config.limits.max_request_bytes + 512),
}

# Each builds an envelope's bytes for (configuration, the message's request id).
BAD_BODIES: dict[str, Callable[[Config, str], bytes]] = {
    "unspecified read mode": lambda _, rid: _encoded(
        _envelope(rid, read=pb.ReadRecordRequest(scope="s", object_id="a"))
    ),
    "unknown read mode": lambda _, rid: _encoded(
        _envelope(rid, read=pb.ReadRecordRequest(scope="s", object_id="a", mode=99))  # type: ignore[arg-type]
    ),
    "oversized payload": lambda config, rid: _encoded(
        _envelope(
            rid,
            write=pb.WriteRecordRequest(
                scope="s", object_id="big", payload=b"x" * (config.limits.max_payload_bytes + 1)
            ),
        )
    ),
    "oversized envelope": lambda config, _: b"\x0a" + b"\x00" * config.limits.max_request_bytes,
    "write without idempotency key": lambda _, rid: _encoded(
        _envelope(rid, write=pb.WriteRecordRequest(scope="s", object_id="a", payload=b"x"))
    ),
    "missing object id": lambda _, rid: _encoded(
        _envelope(rid, write=pb.WriteRecordRequest(scope="s", payload=b"x"))
    ),
    "unknown operation": lambda _, rid: _unknown_operation(rid),
    "no operation": lambda _, rid: _encoded(_envelope(rid)),
    "request id other than the message id": lambda _, rid: _encoded(
        _envelope(rid[::-1], read=pb.ReadRecordRequest(scope="s", object_id="a", mode=1))  # type: ignore[arg-type]
    ),
}


@pytest.fixture
def json_publisher(settings: Settings, config: Config) -> Iterator[Celery]:
    app = celery_app("json-publisher", settings, config)
    yield app
    app.close()


def _ask(transport: Transport, build: Callable[[str], bytes]) -> None:
    request_id = uuid.uuid4().hex
    body = build(request_id)
    transport.publish(
        body, request_id=request_id, lane=LaneName.INTERACTIVE, deadline_ms=_deadline()
    )
    answer = transport.results.wait("tests", request_id, 5.0)
    assert answer is not None, "the worker did not answer"
    decode_response(answer, request_id)


@pytest.fixture(scope="module")
def key(settings: Settings) -> CallerKey:
    return caller_key(settings)


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_envelope_is_invalid_argument_and_changes_nothing(
    case: str,
    transport: Transport,
    config: Config,
    database: Engine,
    client: Client,
    key: CallerKey,
) -> None:
    client.write("s", "a", b"before")
    rows, checksum = row_count(database), table_checksum(database)
    statements = statements_by(database, SERVICE_USER)
    with pytest.raises(InvalidArgument) as caught:
        _ask(transport, lambda rid: sign(BAD_BODIES[case](config, rid), key))
    assert caught.value.message
    assert "Traceback" not in caught.value.message
    # Rejected before any SQL: the service ran no statement for it.
    assert statements_by(database, SERVICE_USER) == statements
    assert (row_count(database), table_checksum(database)) == (rows, checksum)
    # The worker is still serving.
    assert client.read("s", "a", mode=ReadMode.PRIMARY).payload == b"before"


def _malformed_count() -> float:
    return counter("dataservice_rejections", lane="interactive", reason="malformed")


@pytest.mark.parametrize("case", sorted(UNREADABLE_BODIES))
def test_unreadable_body_is_counted_and_changes_nothing(
    case: str, transport: Transport, config: Config, database: Engine, client: Client
) -> None:
    client.write("s", "a", b"before")
    rows, checksum = row_count(database), table_checksum(database)
    statements = statements_by(database, SERVICE_USER)
    before = _malformed_count()
    request_id = uuid.uuid4().hex
    transport.publish(
        UNREADABLE_BODIES[case](config), request_id=request_id, lane=LaneName.INTERACTIVE,
        deadline_ms=_deadline(),
    )  # fmt: skip
    eventually(lambda: _malformed_count() == before + 1, timeout=5.0)
    assert statements_by(database, SERVICE_USER) == statements
    assert (row_count(database), table_checksum(database)) == (rows, checksum)
    assert client.read("s", "a", mode=ReadMode.PRIMARY).payload == b"before"


def test_task_message_in_json_is_counted_and_dropped(
    json_publisher: Celery, transport: Transport, config: Config, redis_client: redis.Redis
) -> None:
    stats = admission_key(config.lanes.interactive.queue)
    before = _malformed_count()
    request_id = uuid.uuid4().hex
    json_publisher.send_task(
        TASK_NAME, args=["not an envelope"], task_id=request_id,
        queue=config.lanes.interactive.queue, serializer="json",
    )  # fmt: skip
    eventually(lambda: _malformed_count() == before + 1, timeout=5.0)
    # Admission counted the JSON body's bytes; exactly those come back.
    eventually(lambda: int(redis_client.hget(stats, "bytes") or 0) == 0, timeout=5.0)


def test_pickle_is_never_accepted(config: Config) -> None:
    from dataservice.broker.celery import celery_settings as shared

    accepted = shared(Settings(), config)["accept_content"]
    assert not any("pickle" in content for content in accepted)


def test_client_rejects_bad_input_before_sending(client: Client, config: Config) -> None:
    with pytest.raises(InvalidArgument, match="payload"):
        client.write("s", "a", b"x" * (config.limits.max_payload_bytes + 1))
    with pytest.raises(InvalidArgument, match="object_id"):
        client.read("s", "")
    with pytest.raises(InvalidArgument, match="scope"):
        client.list("Not A Scope")
    with pytest.raises(InvalidArgument):
        client.read("s", "a", timeout=-1)


def test_payload_at_the_limit_is_stored(client: Client, config: Config, scope: str) -> None:
    payload = b"\x01" * config.limits.max_payload_bytes
    assert client.write(scope, "max", payload).created
    assert client.read(scope, "max").payload == payload


def test_late_request_is_dropped_without_database_work(
    transport: Transport, database: Engine, key: CallerKey
) -> None:
    before = statements_by(database, SERVICE_USER)
    request_id = uuid.uuid4().hex
    late = _envelope(
        request_id, read=pb.ReadRecordRequest(scope="s", object_id="a", mode=pb.READ_MODE_PRIMARY)
    )
    late.deadline_unix_ms = _deadline(-1)
    late.issued_at_unix_ms = _deadline(-2)
    transport.publish(
        signed(late, key), request_id=request_id, lane=LaneName.INTERACTIVE,
        deadline_ms=_deadline(5),
    )  # fmt: skip
    # Nobody waits for a late answer, so none is written.
    assert transport.results.wait("tests", request_id, 1.0) is None
    assert statements_by(database, SERVICE_USER) == before
