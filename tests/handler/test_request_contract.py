"""Acceptance: nothing unauthenticated or disallowed reaches the cache or the database.

Messages are published straight onto the interactive queue with kombu, past
the client. For each, the worker must answer with the right code and count
the right reason, while the database's own statement counter for the
service's user stays put and Redis (watched with MONITOR) sees no command on
a cache, limit, replay or lock key.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import Client, ReadMode
from dataservice.broker.results import ResultStore
from dataservice.codec import decode_response
from dataservice.config.settings import Settings
from dataservice.errors import PermissionDenied, RequestError, Unauthenticated
from dataservice.proto import pb
from dataservice.redis.keys import REPLAY_PREFIX, WORKER_STATE_PREFIXES
from dataservice.security.callers import CallerKey, Secret
from tests.conftest import SERVICE_USER
from tests.harness.support import (
    RawPublisher,
    RedisWatch,
    caller_key,
    counter,
    now_ms,
    signed,
    statements_by,
)

pytestmark = pytest.mark.usefixtures("interactive_worker")

# Keys only the workers may touch; a rejected request must touch none of them.
FORBIDDEN_PREFIXES = WORKER_STATE_PREFIXES


def forbidden(commands: list[bytes]) -> list[bytes]:
    return [c for c in commands if any(f" {p}" in c.decode("latin-1") for p in FORBIDDEN_PREFIXES)]


@dataclass
class Published:
    request_id: str
    caller: str


@pytest.fixture(scope="module")
def results(settings: Settings) -> Iterator[ResultStore]:
    store = ResultStore.from_url(settings.result_backend_url)
    yield store
    store.close()


@pytest.fixture(scope="module")
def keys(settings: Settings) -> dict[str, CallerKey]:
    callers = ("tests", "tests-narrow", "tests-batch-only", "tests-stranger")
    return {caller: caller_key(settings, caller) for caller in callers}


def envelope(
    caller: str = "tests", *, deadline_s: float = 5.0, **operation: object
) -> pb.RequestEnvelope:
    if not operation:
        operation = {
            "read": pb.ReadRecordRequest(
                scope="t-contract", object_id="a", mode=pb.READ_MODE_PRIMARY
            )
        }
    return pb.RequestEnvelope(
        caller=caller,
        request_id=uuid.uuid4().hex,
        deadline_unix_ms=now_ms() + int(deadline_s * 1000),
        issued_at_unix_ms=now_ms(),
        **operation,  # type: ignore[arg-type]
    )


def tampered(message: pb.RequestEnvelope, key: CallerKey) -> bytes:
    body = pb.SignedRequest.FromString(signed(message, key))
    flipped = bytearray(body.envelope)
    flipped[-1] ^= 0x01
    body.envelope = bytes(flipped)
    return body.SerializeToString()


def unknown_key() -> CallerKey:
    return CallerKey("tests", "nobody-1", Secret(secrets.token_bytes(32)))


# name -> (build the body from the callers' keys and an envelope, expected error, reason)
Case = tuple[
    Callable[[dict[str, CallerKey]], tuple[pb.RequestEnvelope, bytes]], type[RequestError], str
]


def _case(
    caller: str,
    build: Callable[[pb.RequestEnvelope, dict[str, CallerKey]], bytes],
    **operation: object,
) -> Callable[[dict[str, CallerKey]], tuple[pb.RequestEnvelope, bytes]]:
    def make(keys: dict[str, CallerKey]) -> tuple[pb.RequestEnvelope, bytes]:
        message = envelope(caller, **operation)
        return message, build(message, keys)

    return make


NARROW_WRITE = {"write": pb.WriteRecordRequest(scope="narrow-a", object_id="a", payload=b"x")}
CASES: dict[str, Case] = {
    "unsigned": (_case("tests", lambda m, _: m.SerializeToString()), Unauthenticated, "unsigned"),
    "tampered (one byte flipped)": (
        _case("tests", lambda m, k: tampered(m, k["tests"])),
        Unauthenticated,
        "bad_signature",
    ),
    "signed by an unknown key": (
        _case("tests", lambda m, _: signed(m, unknown_key())),
        Unauthenticated,
        "unknown_key",
    ),
    "signed by another caller's key": (
        _case("tests", lambda m, k: signed(m, k["tests-narrow"])),
        Unauthenticated,
        "wrong_caller",
    ),
    "signed in the future": (
        _case(
            "tests",
            lambda m, k: (
                setattr(m, "issued_at_unix_ms", now_ms() + 60_000),
                signed(m, k["tests"]),
            )[1],
        ),
        Unauthenticated,
        "clock_skew",
    ),
    "disallowed operation": (
        _case(
            "tests-narrow",
            lambda m, k: signed(m, k["tests-narrow"]),
            idempotency_key="k1",
            **NARROW_WRITE,
        ),
        PermissionDenied,
        "operation_denied",
    ),
    "disallowed scope": (
        _case("tests-narrow", lambda m, k: signed(m, k["tests-narrow"])),
        PermissionDenied,
        "scope_denied",
    ),
    "disallowed lane": (
        _case("tests-batch-only", lambda m, k: signed(m, k["tests-batch-only"])),
        PermissionDenied,
        "lane_denied",
    ),
    "caller without a policy": (
        _case("tests-stranger", lambda m, k: signed(m, k["tests-stranger"])),
        PermissionDenied,
        "unknown_caller",
    ),
}

ANSWERED_TO = {"signed by another caller's key": "tests-narrow"}


def _rejections(reason: str) -> float:
    return counter("dataservice_rejections", lane="interactive", reason=reason)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rejected_before_cache_or_database(
    case: str,
    raw: RawPublisher,
    results: ResultStore,
    keys: dict[str, CallerKey],
    database: Engine,
    settings: Settings,
) -> None:
    build, expected, reason = CASES[case]
    message, body = build(keys)
    statements = statements_by(database, SERVICE_USER)
    before = _rejections(reason)
    watch = RedisWatch(settings.broker_url)
    try:
        raw.publish(body, message.request_id, message.deadline_unix_ms)
        # A verified signer is answered as itself, whatever the envelope claims.
        to = ANSWERED_TO.get(case, message.caller)
        answer = results.wait(to, message.request_id, 5.0)
    finally:
        commands = watch.close()
    assert answer is not None, "no answer"
    with pytest.raises(expected) as caught:
        decode_response(answer, message.request_id)
    assert caught.value.message
    assert _rejections(reason) == before + 1
    assert statements_by(database, SERVICE_USER) == statements
    assert forbidden(commands) == []


def test_a_replayed_request_is_refused_without_database_work(
    raw: RawPublisher,
    results: ResultStore,
    keys: dict[str, CallerKey],
    database: Engine,
    settings: Settings,
) -> None:
    message = envelope("tests")
    body = signed(message, keys["tests"])
    raw.publish(body, message.request_id, message.deadline_unix_ms)
    first = results.wait("tests", message.request_id, 5.0)
    assert first is not None
    with pytest.raises(RequestError) as caught:
        decode_response(first, message.request_id)
    assert caught.value.code.name == "NOT_FOUND"  # served: it was a real read

    statements = statements_by(database, SERVICE_USER)
    before = _rejections("replayed")
    watch = RedisWatch(settings.broker_url)
    try:
        raw.publish(body, message.request_id, message.deadline_unix_ms)
        eventually(lambda: _rejections("replayed") != before, timeout=5,
                   message="the replay to be refused")  # fmt: skip
    finally:
        commands = watch.close()
    # Refused and counted, but not answered: the id's answer belongs to the
    # first delivery, and a redelivered copy must not overtake it.
    assert _rejections("replayed") == before + 1
    assert results.wait("tests", message.request_id, 0.3) is None
    assert statements_by(database, SERVICE_USER) == statements
    # The replay check itself is the one limit key it may read; nothing of the cache.
    assert [c for c in forbidden(commands) if REPLAY_PREFIX.encode() not in c] == []


def test_an_expired_request_is_dropped_without_database_work(
    raw: RawPublisher,
    results: ResultStore,
    keys: dict[str, CallerKey],
    database: Engine,
    settings: Settings,
) -> None:
    message = envelope("tests")
    message.issued_at_unix_ms = now_ms() - 3000
    message.deadline_unix_ms = now_ms() - 1000
    statements = statements_by(database, SERVICE_USER)
    before = counter("dataservice_timeouts", lane="interactive", stage="queue")
    watch = RedisWatch(settings.broker_url)
    try:
        # The header says there is time (admission refuses what is visibly late);
        # the signed deadline, which is what counts, has passed.
        raw.publish(signed(message, keys["tests"]), message.request_id, now_ms() + 5000)
        eventually(
            lambda: counter("dataservice_timeouts", lane="interactive", stage="queue") != before,
            timeout=5, message="the worker to see the message",
        )  # fmt: skip
    finally:
        commands = watch.close()
    # Its caller gave up at the deadline: nobody is answered.
    assert results.wait("tests", message.request_id, 0.5) is None
    assert statements_by(database, SERVICE_USER) == statements
    assert forbidden(commands) == []


def test_an_allowed_caller_is_served(client: Client, scope: str) -> None:
    """The same path that refuses the cases above serves a correct request."""
    client.write(scope, "a", b"v1")
    assert client.read(scope, "a", mode=ReadMode.PRIMARY).payload == b"v1"
