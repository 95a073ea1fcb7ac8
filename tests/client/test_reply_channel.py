"""Answers on a reply channel: a signed request that names one (``reply_channel``)
is answered on ``ds:reply:<caller>:<channel>`` beside the caller's other
answers there, each under its own request id; one that names none is answered
under its own key as before (docs/protocol.md, "How answers travel").

Real Redis, MariaDB and an in-process interactive worker; the requests are
published with kombu alone, as a caller in another language would.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from dataservice_tools.testkit.waits import eventually

from dataservice import Client
from dataservice.config.settings import Settings
from dataservice.proto import pb
from dataservice.redis.keys import reply_key, result_key
from dataservice.security.callers import CallerKey
from tests.harness.support import RawPublisher, caller_key, now_ms, signed

pytestmark = pytest.mark.usefixtures("interactive_worker")

CALLER = "tests"


@pytest.fixture(scope="module")
def answers(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.result_backend_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def key(settings: Settings) -> CallerKey:
    return caller_key(settings, CALLER)


def _read(
    scope: str,
    object_id: str,
    channel: str,
    *,
    mode: int = pb.READ_MODE_PRIMARY,
    deadline_s: float = 5.0,
) -> pb.RequestEnvelope:
    return pb.RequestEnvelope(
        caller=CALLER,
        request_id=uuid.uuid4().hex,
        deadline_unix_ms=now_ms() + int(deadline_s * 1000),
        issued_at_unix_ms=now_ms(),
        reply_channel=channel,
        read=pb.ReadRecordRequest(scope=scope, object_id=object_id, mode=mode),  # type: ignore[arg-type]
    )


def _send(raw: RawPublisher, key: CallerKey, envelope: pb.RequestEnvelope) -> None:
    raw.publish(signed(envelope, key), envelope.request_id, envelope.deadline_unix_ms)


def _collect(answers: redis.Redis, channel: str, count: int) -> dict[str, pb.ResponseEnvelope]:
    got: dict[str, pb.ResponseEnvelope] = {}
    until = time.monotonic() + 15
    while len(got) < count and time.monotonic() < until:
        popped = answers.blpop([reply_key(CALLER, channel)], timeout=1)
        if popped is not None:
            response = pb.ResponseEnvelope.FromString(popped[1])
            got[response.request_id] = response
    return got


def test_answers_arrive_on_the_named_channel_each_under_its_own_request_id(
    raw: RawPublisher, key: CallerKey, answers: redis.Redis, client: Client, scope: str
) -> None:
    client.write(scope, "present", b"here")
    channel = uuid.uuid4().hex
    sent = {
        "present": _read(scope, "present", channel),
        "missing": _read(scope, "missing", channel),
        "cached": _read(scope, "present", channel, mode=pb.READ_MODE_ALLOW_CACHED),
        "cached again": _read(scope, "present", channel, mode=pb.READ_MODE_ALLOW_CACHED),
    }
    for envelope in sent.values():
        _send(raw, key, envelope)

    got = _collect(answers, channel, len(sent))

    assert set(got) == {e.request_id for e in sent.values()}
    for name in ("present", "cached", "cached again"):
        answer = got[sent[name].request_id]
        assert answer.status.code == pb.STATUS_CODE_OK, name
        assert answer.read.record.payload == b"here", name
    assert got[sent["missing"].request_id].status.code == pb.STATUS_CODE_NOT_FOUND
    # Nothing waits under the requests' own keys.
    assert answers.exists(*(result_key(CALLER, e.request_id) for e in sent.values())) == 0


def test_a_later_answer_with_a_shorter_deadline_never_shortens_the_channels_life(
    raw: RawPublisher, key: CallerKey, answers: redis.Redis, scope: str
) -> None:
    channel = uuid.uuid4().hex
    _send(raw, key, _read(scope, "long", channel, deadline_s=20.0))
    _send(raw, key, _read(scope, "short", channel, deadline_s=3.0))
    channel_key = reply_key(CALLER, channel)
    eventually(lambda: answers.llen(channel_key) >= 2, timeout=10, interval=0.02)
    assert answers.llen(channel_key) == 2
    # The first answer's deadline (20 s) plus the grace, not the second's (3 s).
    assert answers.pttl(channel_key) > 15_000


def test_a_malformed_channel_is_refused_under_the_requests_own_key(
    raw: RawPublisher, key: CallerKey, answers: redis.Redis, scope: str
) -> None:
    envelope = _read(scope, "x", "not:a-channel")
    _send(raw, key, envelope)
    popped = answers.blpop([result_key(CALLER, envelope.request_id)], timeout=10)
    assert popped is not None
    answer = pb.ResponseEnvelope.FromString(popped[1])
    assert answer.status.code == pb.STATUS_CODE_INVALID_ARGUMENT
    assert "reply_channel" in answer.status.message
    assert answers.exists(reply_key(CALLER, "not:a-channel")) == 0
