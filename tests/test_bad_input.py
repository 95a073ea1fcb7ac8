"""Acceptance: bad input is answered INVALID_ARGUMENT, changes nothing, and the
worker keeps serving. Envelopes are published straight onto the queue, past
the client's own validation."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import Engine

from dataservice import Client, InvalidArgument, ReadMode
from dataservice.client import decode_response
from dataservice.config import Config, LaneName, Settings
from dataservice.proto import pb
from dataservice.transport import Transport
from dataservice.wire import TASK_NAME, celery_settings
from tests.conftest import SERVICE_USER
from tests.support import row_count, statements_by, table_checksum

pytestmark = pytest.mark.usefixtures("interactive_worker")


def _deadline(seconds: float = 5.0) -> int:
    return int((time.time() + seconds) * 1000)


def _envelope(request_id: str, **operation: Any) -> pb.RequestEnvelope:
    return pb.RequestEnvelope(
        caller="tests", request_id=request_id, deadline_unix_ms=_deadline(), **operation
    )


def _encoded(envelope: pb.RequestEnvelope) -> bytes:
    return envelope.SerializeToString()


def _unknown_operation(rid: str) -> bytes:
    # Field 20 is no operation this schema knows: a newer client's, say.
    unknown_field = b"\xa2\x01\x03abc"
    return _encoded(_envelope(rid)) + unknown_field


# Each builds a body for (configuration, the message's request id).
BAD_BODIES: dict[str, Callable[[Config, str], bytes]] = {
    "garbage bytes": lambda _, __: b"\xff\xfe\x00garbage\x17\x99",
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
    app = Celery("json-publisher", set_as_current=False)
    app.conf.update(celery_settings(settings, config))
    yield app
    app.close()


def _ask(transport: Transport, build: Callable[[str], bytes]) -> None:
    request_id = uuid.uuid4().hex
    body = build(request_id)
    transport.publish(
        body, request_id=request_id, lane=LaneName.INTERACTIVE, deadline_ms=_deadline()
    )
    answer = transport.results.wait(request_id, 5.0)
    assert answer is not None, "the worker did not answer"
    decode_response(answer, request_id)


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_envelope_is_invalid_argument_and_changes_nothing(
    case: str, transport: Transport, config: Config, database: Engine, client: Client
) -> None:
    client.write("s", "a", b"before")
    rows, checksum = row_count(database), table_checksum(database)
    statements = statements_by(database, SERVICE_USER)
    with pytest.raises(InvalidArgument) as caught:
        _ask(transport, lambda rid: BAD_BODIES[case](config, rid))
    assert caught.value.message
    assert "Traceback" not in caught.value.message
    # Rejected before any SQL: the service ran no statement for it.
    assert statements_by(database, SERVICE_USER) == statements
    assert (row_count(database), table_checksum(database)) == (rows, checksum)
    # The worker is still serving.
    assert client.read("s", "a", mode=ReadMode.PRIMARY).payload == b"before"


def test_task_message_in_json_is_invalid_argument(
    json_publisher: Celery, transport: Transport, config: Config
) -> None:
    request_id = uuid.uuid4().hex
    json_publisher.send_task(
        TASK_NAME, args=["not an envelope"], task_id=request_id,
        queue=config.lanes.interactive.queue, serializer="json",
    )  # fmt: skip
    answer = transport.results.wait(request_id, 5.0)
    assert answer is not None
    with pytest.raises(InvalidArgument):
        decode_response(answer, request_id)


def test_pickle_is_never_accepted(config: Config) -> None:
    from dataservice.wire import celery_settings as shared

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
    transport: Transport, database: Engine
) -> None:
    before = statements_by(database, SERVICE_USER)
    request_id = uuid.uuid4().hex
    late = _envelope(
        request_id, read=pb.ReadRecordRequest(scope="s", object_id="a", mode=pb.READ_MODE_PRIMARY)
    )
    late.deadline_unix_ms = _deadline(-1)
    transport.publish(
        late.SerializeToString(), request_id=request_id, lane=LaneName.INTERACTIVE,
        deadline_ms=_deadline(5),
    )  # fmt: skip
    # Nobody waits for a late answer, so none is written.
    assert transport.results.wait(request_id, 1.0) is None
    assert statements_by(database, SERVICE_USER) == before
