"""A client's reply channel (``dataservice/client/inbox.py``): one reader, one
connection, each answer handed to the call that waits for it. Real Redis; the
last test has a real worker answer requests that name the channel."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from dataservice_tools.testkit.sockets import own_local_ports

from dataservice import ReadMode
from dataservice.client.inbox import FIRST_LOOK_S, SLICE_S, Arrival, Inbox, request_id_of
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import Unauthenticated, Unavailable
from dataservice.proto import pb
from dataservice.redis.keys import reply_key, result_key
from dataservice.security.callers import CallerKey, Secret
from tests.harness.clients import ClientKind, make_client
from tests.harness.support import (
    RawPublisher,
    blocked_clients_of_this_process,
    caller_key,
    now_ms,
    signed,
)

CALLER = "tests"


def _answer(request_id: str, payload: bytes = b"") -> bytes:
    record = pb.Record(object_id="o", revision=1, payload=payload)
    return pb.ResponseEnvelope(
        request_id=request_id,
        status=pb.Status(code=pb.STATUS_CODE_OK),
        read=pb.ReadRecordResponse(record=record),
    ).SerializeToString()


@pytest.fixture
def inbox(settings: Settings) -> Iterator[Inbox]:
    box = Inbox(settings.result_backend_url, CALLER)
    yield box
    box.close()


@pytest.fixture
def results(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.result_backend_url)
    yield client
    client.close()


@pytest.mark.parametrize("request_id", ["a", "x" * 64, uuid.uuid4().hex])
def test_the_request_id_is_read_from_the_answers_bytes(request_id: str) -> None:
    assert request_id_of(_answer(request_id, b"\x0a\x05payload")) == request_id
    assert request_id_of(b"not protobuf at all\xff") == ""


def test_an_arrival_wakes_every_thread_waiting_for_it_and_stays_set() -> None:
    arrival = Arrival()
    assert not arrival.is_set()
    assert not arrival.wait(0.0)
    assert not arrival.wait(0.01)
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(arrival.wait(5.0))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    arrival.set()
    for waiter in waiters:
        waiter.join(5.0)
    assert woken == [True, True, True]
    assert arrival.is_set()
    assert arrival.wait(0.0)


def test_each_answer_goes_to_the_call_that_waits_for_it_whatever_their_order(
    settings: Settings, results: redis.Redis
) -> None:
    already_open = own_local_ports()
    inbox = Inbox(settings.result_backend_url, CALLER)
    try:
        _answered_in_any_order(inbox, results, already_open)
    finally:
        inbox.close()


def _answered_in_any_order(inbox: Inbox, results: redis.Redis, already_open: set[int]) -> None:
    ids = [uuid.uuid4().hex for _ in range(50)]
    for request_id in ids:
        inbox.expect(request_id, 10)
    got: dict[str, bytes | None] = {}

    def wait(request_id: str) -> None:
        got[request_id] = inbox.wait(request_id, 10)

    threads = [threading.Thread(target=wait, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    for request_id in reversed(ids):
        results.rpush(reply_key(CALLER, inbox.channel), _answer(request_id, request_id.encode()))
    for thread in threads:
        thread.join(15)

    assert {i: request_id_of(b or b"") for i, b in got.items()} == {i: i for i in ids}
    assert inbox.dropped == 0
    # One connection of this process read them all.
    assert blocked_clients_of_this_process(results, "blmpop", already_open) == 1


def test_an_answer_nobody_waits_for_is_dropped_and_counted(
    inbox: Inbox, results: redis.Redis
) -> None:
    mine = uuid.uuid4().hex
    inbox.expect(mine, 10)
    channel = reply_key(CALLER, inbox.channel)
    results.rpush(channel, _answer("someone-else"), _answer(mine))
    assert inbox.wait(mine, 5) is not None
    assert inbox.dropped == 1
    # Taken once: a second answer under the same id has no slot left.
    results.rpush(channel, _answer(mine))
    assert inbox.wait(mine, 0.2) is None


def test_a_wait_that_times_out_keeps_its_slot_for_a_later_wait(
    inbox: Inbox, results: redis.Redis
) -> None:
    request_id = uuid.uuid4().hex
    inbox.expect(request_id, 10)
    assert inbox.wait(request_id, 0.1) is None
    results.rpush(reply_key(CALLER, inbox.channel), _answer(request_id, b"late"))
    body = inbox.wait(request_id, 5)
    assert body is not None
    assert request_id_of(body) == request_id


def test_a_slot_nobody_collects_lapses(inbox: Inbox) -> None:
    inbox.expect(uuid.uuid4().hex, 0.1)
    assert inbox.waiting == 1
    # The reader sweeps once a slice (0.5 s), with or without answers.
    time.sleep(1.5)
    assert inbox.waiting == 0


def test_a_channel_that_cannot_be_read_answers_its_waits_unavailable() -> None:
    # Nothing listens on port 1.
    box = Inbox("redis://127.0.0.1:1/0", CALLER)
    try:
        request_id = uuid.uuid4().hex
        box.expect(request_id, 10)
        started = time.monotonic()
        with pytest.raises(Unavailable):
            box.wait(request_id, 5)
        assert time.monotonic() - started < 2
    finally:
        box.close()


@pytest.mark.usefixtures("interactive_worker")
def test_a_worker_answers_requests_naming_the_channel_through_the_inbox(
    inbox: Inbox, settings: Settings, raw: RawPublisher
) -> None:
    key = caller_key(settings, CALLER)
    sent = []
    for n in range(20):
        envelope = pb.RequestEnvelope(
            caller=CALLER,
            request_id=uuid.uuid4().hex,
            deadline_unix_ms=now_ms() + 5000,
            reply_channel=inbox.channel,
            read=pb.ReadRecordRequest(
                scope="t-inbox", object_id=f"missing-{n}", mode=pb.READ_MODE_PRIMARY
            ),
        )
        inbox.expect(envelope.request_id, 7)
        raw.publish(signed(envelope, key), envelope.request_id, envelope.deadline_unix_ms)
        sent.append(envelope.request_id)
    for request_id in sent:
        body = inbox.wait(request_id, 10)
        assert body is not None, request_id
        answer = pb.ResponseEnvelope.FromString(body)
        assert (answer.request_id, answer.status.code) == (request_id, pb.STATUS_CODE_NOT_FOUND)


def test_an_answer_under_the_requests_own_key_is_found_by_a_look(
    inbox: Inbox, results: redis.Redis
) -> None:
    request_id = uuid.uuid4().hex
    inbox.expect(request_id, 10)
    # As a refusal before the signature was checked is written: not on the channel.
    results.rpush(result_key(CALLER, request_id), _answer(request_id))
    body = inbox.wait(request_id, FIRST_LOOK_S + 2 * SLICE_S + 1)
    assert request_id_of(body or b"") == request_id
    assert inbox.slots.looked_up == 1
    assert not results.exists(result_key(CALLER, request_id))


@pytest.mark.usefixtures("interactive_worker")
def test_a_client_with_a_wrong_key_hears_unauthenticated_well_before_its_deadline(
    client_kind: ClientKind, settings: Settings, config: Config
) -> None:
    wrong = CallerKey(CALLER, caller_key(settings, CALLER).key_id, Secret(b"\x01" * 32))
    with make_client(client_kind, CALLER, settings, config, key=wrong) as client:
        with pytest.raises(Unauthenticated):
            client.read("t-inbox", "anything", mode=ReadMode.PRIMARY, timeout=20)
        # The refusal came under the request's own key and a look found it.
        assert client._transport.replies.slots.looked_up == 1
