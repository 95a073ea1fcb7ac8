"""Acceptance: a lane's queue is bounded by messages and bytes, under concurrent
producers, and a request that cannot start in time is refused up front."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import kombu.exceptions
import pytest
import redis
from dataservice_tools.localservices import redis_reachable
from dataservice_tools.testkit.waits import eventually

from dataservice import Client, ReadOp, ResourceExhausted, WriteOp
from dataservice.broker import queue_depths
from dataservice.broker.celery import SERIALIZER, TASK_NAME, celery_app
from dataservice.broker.results import Completion, ResultStore
from dataservice.client.publisher import refusal_error
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.limits import admission
from dataservice.limits.admission import (
    DEADLINE_HEADER,
    HELD_GRACE_ELSEWHERE_MS,
    HELD_GRACE_MS,
    SERVICE_STALE_MS,
    AdmissionRefused,
    books_expiry_ms,
    lane_admission_bounds,
    publish_service_times,
)
from dataservice.observe.metrics import QUEUES, REGISTRY, QueueWatch
from dataservice.redis.keys import admission_key, held_key
from tests.conftest import require
from tests.harness.clients import ClientKind, make_client
from tests.harness.rabbit import BROKERS, depth, on_rabbitmq
from tests.harness.support import bounded_admission, publish_concurrently

# No worker consumes this database: whatever is admitted stays queued.
UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/11"
# The settings, configuration and Redis of a lane nobody serves.
Bounded = tuple[Settings, Config, redis.Redis]
HELD_GRACE_S = HELD_GRACE_MS / 1000
MAX_MESSAGES = 100


def _unserved(settings: Settings, tmp_path: Path) -> AbstractContextManager[Bounded]:
    require(redis_reachable(UNSERVED_REDIS_URL), "Redis at 127.0.0.1:6379")
    return bounded_admission(
        settings,
        UNSERVED_REDIS_URL,
        tmp_path,
        interactive={"max_messages": MAX_MESSAGES, "max_bytes": 1 << 24},
        batch={"max_messages": 10_000, "max_bytes": 3 * 70_000},
    )


@pytest.fixture
def bounded(settings: Settings, tmp_path: Path) -> Iterator[Bounded]:
    with _unserved(settings, tmp_path) as bounded:
        yield bounded


@pytest.fixture(params=BROKERS)
def on_either(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path
) -> Iterator[Bounded]:
    """As ``bounded``, on each broker in turn: on RabbitMQ the queues are its
    own and the Redis holds admission's books alone."""
    with _unserved(settings, tmp_path) as (redis_settings, config, books):
        if request.param == "amqp":
            yield on_rabbitmq(redis_settings, config, "dataservice-admission"), config, books
        else:
            yield redis_settings, config, books


def _redis_ms(books: redis.Redis) -> int:
    """Redis's own clock, the one admission scores its held requests by."""
    seconds, micros = books.time()
    return seconds * 1000 + micros // 1000


def _deadline(seconds: float) -> int:
    return int((time.time() + seconds) * 1000)


def test_concurrent_producers_never_overshoot_the_message_bound(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, _ = on_either
    producers, each = 16, 20
    outcomes = publish_concurrently(settings, config, producers, each)
    assert depth(settings, config.lanes.interactive.queue) == MAX_MESSAGES
    assert outcomes.count("queued") == MAX_MESSAGES
    assert outcomes.count("queue_full") == producers * each - MAX_MESSAGES
    assert set(outcomes) == {"queued", "queue_full"}


def test_a_full_lane_refuses_fast_and_retryably(
    client_kind: ClientKind, bounded: tuple[Settings, Config, redis.Redis]
) -> None:
    settings, config, broker = bounded
    with make_client(client_kind, "tests", settings, config) as client:
        transport = Transport(settings, config)
        for _ in range(MAX_MESSAGES):
            transport.publish(b"x", request_id=uuid.uuid4().hex, lane=LaneName.INTERACTIVE,
                              deadline_ms=_deadline(30))  # fmt: skip
        transport.close()
        timeout_s = 5.0
        start = time.monotonic()
        with pytest.raises(ResourceExhausted) as caught:
            client.read("s", "x", timeout=timeout_s)
    # Refused at publish, not at the deadline: a small share of it on any machine.
    assert time.monotonic() - start < timeout_s / 5, "a refusal must not wait for the deadline"
    assert caught.value.retry_after > 0
    assert broker.llen(config.lanes.interactive.queue) == MAX_MESSAGES


def test_a_stock_celery_sender_refused_by_the_lane_is_told_at_publish(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    """``send_task`` with the service's Celery settings into a full lane: on
    Redis admission's refusal is raised from the publish as the clients' own
    error, and nothing is queued; on RabbitMQ a stock sender has no admission,
    and the queue's own bound nacks the publish (a quorum queue takes one
    message past it first), which kombu raises."""
    settings, config, _ = on_either
    queue = config.lanes.interactive.queue
    transport = Transport(settings, config)
    for _ in range(MAX_MESSAGES):
        transport.publish(b"x", request_id=uuid.uuid4().hex, lane=LaneName.INTERACTIVE,
                          deadline_ms=_deadline(30))  # fmt: skip
    transport.close()
    app = celery_app("stock-sender", settings, config)

    def send() -> None:
        app.send_task(
            TASK_NAME,
            args=(b"signed request bytes",),
            queue=queue,
            serializer=SERIALIZER,
            headers={DEADLINE_HEADER: _deadline(30)},
            retry=False,
        )

    try:
        if settings.broker_is_amqp:
            send()  # the one a quorum queue takes past its bound
            with pytest.raises(kombu.exceptions.OperationalError):
                send()
            assert depth(settings, queue) == MAX_MESSAGES + 1
            return
        with pytest.raises(ResourceExhausted) as caught:
            send()
    finally:
        app.close()
    assert caught.value.reason == "queue_full"
    assert caught.value.retry_after > 0
    assert depth(settings, queue) == MAX_MESSAGES


def test_a_client_refused_again_and_again_holds_itself_back(
    client_kind: ClientKind, bounded: tuple[Settings, Config, redis.Redis]
) -> None:
    """The adaptive throttle, shared by both clients: once the lane refuses most
    of what a client sends, the client refuses a share of its calls itself
    (``throttled``), and those never reach the broker."""
    settings, config, broker = bounded
    transport = Transport(settings, config)
    for _ in range(MAX_MESSAGES):
        transport.publish(b"x", request_id=uuid.uuid4().hex, lane=LaneName.INTERACTIVE,
                          deadline_ms=_deadline(30))  # fmt: skip
    transport.close()
    stats = admission_key(config.lanes.interactive.queue)
    offered_before = int(broker.hget(stats, "offered") or 0)
    reasons = []
    with make_client(client_kind, "tests", settings, config) as client:
        for _ in range(60):
            with pytest.raises(ResourceExhausted) as caught:
                client.read("s", "x", timeout=5)
            reasons.append(caught.value.reason)
    offered = int(broker.hget(stats, "offered") or 0) - offered_before
    assert set(reasons) == {"queue_full", "throttled"}, reasons
    # Only what the client did not hold back reached admission, once each.
    assert offered == reasons.count("queue_full")


def test_the_byte_bound_refuses_and_a_partial_batch_says_what_was_accepted(
    client_kind: ClientKind, bounded: tuple[Settings, Config, redis.Redis]
) -> None:
    from dataservice import WriteOp

    settings, config, broker = bounded
    big = b"\x07" * config.limits.max_payload_bytes
    with make_client(client_kind, "tests", settings, config) as client:
        ops = [WriteOp("s", f"big{n}", big) for n in range(5)]
        with pytest.raises(ResourceExhausted, match="bytes") as caught:
            client.submit_many(ops, timeout=60)
    # 3 x 70,000 bytes hold three envelopes of 64 KiB payload, not four: the
    # first batch message carries three (the lane's bytes bound its messages
    # too), the second is refused whole.
    assert len(caught.value.accepted) == 3
    assert broker.llen(config.lanes.batch.queue) == 1
    queued = int(broker.hget(admission_key(config.lanes.batch.queue), "bytes") or 0)
    assert 3 * len(big) < queued <= 3 * 70_000


def test_a_request_that_cannot_start_before_its_deadline_is_refused(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = on_either
    queue = config.lanes.batch.queue
    with Client("tests", settings, config) as client:
        client.submit_many([ReadOp("s", f"k{n}") for n in range(50)], timeout=600)
        # The lane drains 10 messages a second (as measured by admission): the
        # 51st waits about 5 s, so a 1 s deadline cannot be met, a 60 s one can.
        now = _deadline(0)
        broker.hset(admission_key(queue), mapping={"rate": 10, "rate_at": now, "busy_at": now})
        with pytest.raises(ResourceExhausted, match="deadline") as caught:
            client.submit(ReadOp("s", "late"), timeout=1)
        assert 3.5 <= caught.value.retry_after <= 4.5
        client.submit(ReadOp("s", "patient"), timeout=60)
    assert depth(settings, queue) == 51


def test_a_request_that_could_start_but_not_be_served_in_time_is_refused(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = on_either
    key = admission_key(config.lanes.batch.queue)
    with Client("tests", settings, config) as client:
        client.submit_many([ReadOp("s", f"k{n}") for n in range(10)], timeout=600)
        # 10 ahead at 5 a second: 2 s of queue, inside 2.1 s ...
        now = _deadline(0)
        broker.hset(key, mapping={"rate": 5, "rate_at": now, "busy_at": now})
        client.submit(ReadOp("s", "fits"), timeout=2.1)
        # ... but not once a read is known to take 400 ms after its dequeue.
        # (On RabbitMQ the queue is not seen: of the 11 held, 2 are taken to
        # be running, 5 a second for 400 ms each, and 9 to wait: 1.8 s, and
        # the read's own 400 ms.)
        lane = lane_admission_bounds(config)[config.lanes.batch.queue]
        publish_service_times(broker, lane, {"read": 400.0}, {"read": 400.0})
        with pytest.raises(ResourceExhausted) as caught:
            client.submit(ReadOp("s", "too-slow"), timeout=2.1)
        assert caught.value.reason == "queue_too_long"
        assert 0.05 <= caught.value.retry_after <= 0.6
        # A read's time says nothing about a write: the queue alone decides.
        client.submit(WriteOp("s", "w", b"x"), timeout=3)
        # An estimate the workers stopped renewing is not relied on.
        broker.hset(key, "service_at", _deadline(0) - SERVICE_STALE_MS - 1000)
        client.submit(ReadOp("s", "stale"), timeout=3)
    assert depth(settings, config.lanes.batch.queue) == 13


def test_what_the_workers_hold_beyond_what_they_serve_counts_as_waiting(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    """A batch worker has more threads than permits: the messages it holds
    while they wait for a permit wait as much as the queue does. Taken for
    running (by the p90 of the time once dequeued, which their wait is part
    of), they would leave a request that cannot be served in time admitted."""
    settings, config, broker = on_either
    queue = config.lanes.batch.queue
    key = admission_key(queue)
    with Client("tests", settings, config) as client:
        client.submit_many([ReadOp("s", f"held{n}") for n in range(10)], timeout=600)
        if not settings.broker_is_amqp:
            for _ in range(8):  # in the workers' hands, as their prefetch takes them
                broker.rpop(queue)
        now = _deadline(0)
        broker.hset(key, mapping={"rate": 5, "rate_at": now, "busy_at": now})
        # In hand: 5 a second for 1 s on average (running, or waiting for a
        # permit); so 5 of the 10 still wait, 1 s at 5 a second, and the
        # read's own p90 of 2 s after its dequeue: 3 s.
        lane = lane_admission_bounds(config)[config.lanes.batch.queue]
        publish_service_times(broker, lane, {"read": 2000.0}, {"read": 1000.0})
        with pytest.raises(ResourceExhausted) as caught:
            client.submit(ReadOp("s", "too-soon"), timeout=2.6)
        assert caught.value.reason == "queue_too_long"
        client.submit(ReadOp("s", "in-time"), timeout=3.5)
    assert broker.zcard(held_key(queue)) == 11


@pytest.mark.usefixtures("interactive_worker")
def test_workers_say_how_long_answered_requests_take(
    client: Client, redis_client: redis.Redis, config: Config
) -> None:
    key = admission_key(config.lanes.interactive.queue)
    started_ms = time.time() * 1000
    client.write("admission", "timed", b"z" * 100)
    for _ in range(5):
        client.read("admission", "timed")
    # Earlier tests' requests may have said so already: wait for what these did.
    eventually(
        lambda: int(redis_client.hget(key, "service_at") or 0) >= started_ms - 1000,
        timeout=5, interval=0.05, message="the workers to say something of these requests",
    )  # fmt: skip
    read_ms = float(redis_client.hget(key, "service:read") or -1)
    assert 0 < read_ms < 1000
    # And their mean, which says how many the workers hold at once.
    assert 0 < float(redis_client.hget(key, "mean:read") or -1) <= read_ms
    assert float(redis_client.hget(key, "service:write") or -1) > 0
    said_at = int(redis_client.hget(key, "service_at") or 0)
    assert abs(said_at - time.time() * 1000) < 5000


@pytest.mark.usefixtures("interactive_worker")
def test_answered_requests_give_their_bytes_back(
    client: Client, redis_client: redis.Redis, config: Config, transport: Transport
) -> None:
    key = admission_key(config.lanes.interactive.queue)
    for n in range(10):
        client.write("admission", f"k{n}", b"y" * 1000)
    # Garbage passes admission (it is only bytes); the worker drops it, and
    # counts it done, since it names nobody to answer.
    done = int(redis_client.hget(key, "done") or 0)
    rid = uuid.uuid4().hex
    transport.publish(b"\xff" * 500, request_id=rid, lane=LaneName.INTERACTIVE,
                      deadline_ms=_deadline(5))  # fmt: skip
    eventually(lambda: int(redis_client.hget(key, "done") or 0) >= done + 1, timeout=5)
    assert int(redis_client.hget(key, "done") or 0) == done + 1
    assert int(redis_client.hget(key, "bytes") or 0) == 0


def test_a_request_already_past_its_deadline_is_not_admitted(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, _ = on_either
    transport = Transport(settings, config)
    try:
        with pytest.raises(AdmissionRefused) as caught:
            transport.publish(b"x", request_id=uuid.uuid4().hex, lane=LaneName.BATCH,
                              deadline_ms=_deadline(-1))  # fmt: skip
    finally:
        transport.close()
    assert caught.value.reason == "queue_too_long"
    assert depth(settings, config.lanes.batch.queue) == 0


def test_a_negative_byte_balance_is_never_room_beyond_the_bound(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    from dataservice import WriteOp

    settings, config, broker = on_either
    # As after a completion counted twice: the balance went below zero.
    broker.hset(admission_key(config.lanes.batch.queue), "bytes", -10_000_000)
    big = b"\x07" * config.limits.max_payload_bytes
    with Client("tests", settings, config) as client, pytest.raises(ResourceExhausted):
        client.submit_many([WriteOp("s", f"big{n}", big) for n in range(5)], timeout=60)
    # One message of three, as the byte bound allows; the second refused.
    assert depth(settings, config.lanes.batch.queue) == 1


def test_a_caller_over_its_rate_is_refused_before_the_queue(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    """Publish pacing: admission applies the caller's rate (as the workers'
    gate will), so a well-behaved caller's excess never takes queue space."""
    settings, config, _ = on_either
    policy = config.callers["tests-limited"]  # burst 5
    transport = Transport(settings, config)
    try:
        outcomes = []
        for _ in range(policy.burst + 3):
            try:
                transport.publish(b"x", request_id=uuid.uuid4().hex, lane=LaneName.INTERACTIVE,
                                  deadline_ms=_deadline(5), caller="tests-limited")  # fmt: skip
                outcomes.append("queued")
            except AdmissionRefused as refusal:
                outcomes.append(refusal.reason)
                error = refusal_error(refusal)
                assert error.reason == "rate_limited"
                assert 0 < error.retry_after <= 1 / policy.rate_per_s + 0.01
        # Unpaced messages (no caller named) only meet the queue's bounds.
        transport.publish(b"x", request_id=uuid.uuid4().hex, lane=LaneName.INTERACTIVE,
                          deadline_ms=_deadline(5))  # fmt: skip
    finally:
        transport.close()
    assert outcomes == ["queued"] * policy.burst + ["rate_limited"] * 3
    assert depth(settings, config.lanes.interactive.queue) == policy.burst + 1


def test_refusals_at_publish_are_counted_by_reason_and_scraped_from_the_broker(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, books = on_either
    outcomes = publish_concurrently(settings, config, 4, 40)
    refused = outcomes.count("queue_full")
    assert refused == 4 * 40 - MAX_MESSAGES
    depths = queue_depths(settings) if settings.broker_is_amqp else None
    queues = {lane.value: config.lanes[lane].queue for lane in LaneName}
    watch = QueueWatch(books, queues, depths)
    QUEUES.watch(watch)
    try:
        sample = REGISTRY.get_sample_value
        interactive = {"lane": "interactive"}
        assert sample("dataservice_queue_messages", interactive) == MAX_MESSAGES
        assert sample("dataservice_queue_bytes", interactive) > 0
        assert sample("dataservice_queue_messages", {"lane": "batch"}) == 0
        full = {"lane": "interactive", "reason": "queue_full"}
        assert sample("dataservice_admission_refusals_total", full) == refused
        assert (
            sample(
                "dataservice_admission_refusals_total", {"lane": "batch", "reason": "queue_full"}
            )
            == 0
        )
    finally:
        QUEUES.unwatch(watch)
        if depths is not None:
            depths.close()
    # Unwatched, the queues are left out rather than reported as empty.
    assert REGISTRY.get_sample_value("dataservice_queue_messages", {"lane": "interactive"}) is None


@pytest.fixture
def targeted(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, Config, redis.Redis]]:
    """The batch lane with a standing-queue target of 500 ms; nothing consumes it."""
    require(redis_reachable(UNSERVED_REDIS_URL), "Redis at 127.0.0.1:6379")
    with bounded_admission(
        settings,
        UNSERVED_REDIS_URL,
        tmp_path,
        batch={"max_messages": 10_000, "max_bytes": 1 << 24, "target_wait_ms": 500},
    ) as bounded:
        yield bounded


def answered(broker: redis.Redis, queue: str, keep: int) -> None:
    """As if workers took all but ``keep`` of the queue's messages and answered them."""
    taken = broker.llen(queue) - keep
    broker.ltrim(queue, 0, keep - 1)
    broker.hincrby(admission_key(queue), "done", taken)


def test_a_standing_queue_is_held_to_its_target_wait_and_a_burst_is_not(
    targeted: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = targeted
    key = admission_key(config.lanes.batch.queue)
    with Client("tests", settings, config) as client:
        client.submit_many([ReadOp("s", f"k{n}") for n in range(20)], timeout=600)
        # 20 ahead at 10 a second (measured busy just now): 2 s of queue, four
        # times the target ...
        now = _deadline(0)
        broker.hset(
            key,
            mapping={"rate": 10, "rate_at": now, "busy_at": now, "empty_at": now},
        )
        # ... yet the queue was empty a moment ago: a burst, admitted up to its deadline.
        client.submit(ReadOp("s", "burst"), timeout=60)
        # The same queue, not empty for a second: it stands, and past its target
        # what would join it is refused at once, with the time to drain to three
        # quarters of the target (21 ahead: 2.1 s, less 0.375 s).
        broker.hset(key, "empty_at", _deadline(-1))
        with pytest.raises(ResourceExhausted) as caught:
            client.submit(ReadOp("s", "standing"), timeout=60)
        assert caught.value.reason == "queue_too_long"
        assert 1.6 <= caught.value.retry_after <= 2.0
        # Drained to within the target (4 ahead at 10 a second) but not within
        # three quarters of it: shedding goes on, so an overload's end leaves room.
        answered(broker, config.lanes.batch.queue, keep=4)
        with pytest.raises(ResourceExhausted):
            client.submit(ReadOp("s", "still-shedding"), timeout=60)
        # Within three quarters of the target (2 ahead), it admits again, and goes on
        # admitting up to the target (3 ahead).
        answered(broker, config.lanes.batch.queue, keep=2)
        client.submit(ReadOp("s", "short"), timeout=60)
        client.submit(ReadOp("s", "again"), timeout=60)
    assert broker.llen(config.lanes.batch.queue) == 4
    # Every publish was seen by the broker's script, the refused ones included.
    assert int(broker.hget(key, "offered") or 0) == 20 + 1 + 1 + 1 + 2


def test_at_the_capacity_a_standing_queue_past_its_target_is_left_to_the_deadline(
    targeted: tuple[Settings, Config, redis.Redis],
) -> None:
    """The standing queue of the test above, but no more arriving than the lane
    drains: what an overload left behind at the capacity neither grows nor
    drains, and only the deadline bounds it."""
    settings, config, broker = targeted
    key = admission_key(config.lanes.batch.queue)
    with Client("tests", settings, config) as client:
        client.submit_many([ReadOp("s", f"k{n}") for n in range(20)], timeout=600)
        now = _deadline(0)
        # 20 ahead at 10 a second (2 s, four times the target), standing for a
        # second; 4 arrivals decayed over 500 ms, 5 with the next: 10 a second.
        standing = {"rate": 10, "rate_at": now, "busy_at": now, "empty_at": now - 1000}
        broker.hset(key, mapping={**standing, "arrivals": 4, "arrivals_at": now})
        client.submit(ReadOp("s", "at-capacity"), timeout=60)
        broker.hset(key, mapping={"arrivals": 4, "arrivals_at": _deadline(0)})
        with pytest.raises(ResourceExhausted) as caught:
            client.submit(ReadOp("s", "too-late"), timeout=1)
        assert caught.value.reason == "queue_too_long"
        # Arriving faster than that (6 a second more), it is an overload again.
        broker.hset(key, mapping={"arrivals": 7, "arrivals_at": _deadline(0)})
        with pytest.raises(ResourceExhausted):
            client.submit(ReadOp("s", "overloaded"), timeout=60)
    assert broker.llen(config.lanes.batch.queue) == 21


def test_a_burst_into_a_lane_not_measured_busy_lately_queues_up_to_its_deadline(
    targeted: tuple[Settings, Config, redis.Redis],
) -> None:
    """The same standing queue, but the rate (a floor, from a quiet lane) was
    last measured busy 5 s ago: the target does not apply, the deadline does."""
    settings, config, broker = targeted
    key = admission_key(config.lanes.batch.queue)
    with Client("tests", settings, config) as client:
        client.submit_many([ReadOp("s", f"k{n}") for n in range(20)], timeout=600)
        now = _deadline(0)
        broker.hset(
            key,
            mapping={"rate": 10, "rate_at": now, "busy_at": now - 5000, "empty_at": now - 1000},
        )
        client.submit(ReadOp("s", "burst"), timeout=60)
        with pytest.raises(ResourceExhausted) as caught:
            client.submit(ReadOp("s", "too-late"), timeout=1)
        assert caught.value.reason == "queue_too_long"
    assert broker.llen(config.lanes.batch.queue) == 21


def test_what_the_workers_prefetched_waits_too(
    targeted: tuple[Settings, Config, redis.Redis],
) -> None:
    """The list is empty, but 25 admitted requests are not done: at 10 a second
    and 1 s each, 10 run and the rest wait in the workers' prefetch (held to as
    many again as run: 10, and one more), so a request with 1.5 s left cannot
    finish and is refused; the list alone would have let it in."""
    settings, config, broker = targeted
    key = admission_key(config.lanes.batch.queue)
    held = held_key(config.lanes.batch.queue)
    now = _deadline(0)
    broker.hset(
        key,
        mapping={"rate": 10, "rate_at": now, "busy_at": now, "admitted": 25, "done": 0,
                 "done_at": 0, "service:read": 1000, "service_at": now},
    )  # fmt: skip
    broker.zadd(held, {f"r{n}:100": now + 60_000 for n in range(25)})
    with Client("tests", settings, config) as client:
        with pytest.raises(ResourceExhausted) as caught:
            client.submit(ReadOp("s", "behind-the-prefetch"), timeout=1.5)
        assert caught.value.reason == "queue_too_long"
        # Answered all but what runs: nothing waits, and it is admitted.
        for n in range(15):
            ResultStore(broker).complete(Completion(key, (held, f"r{n}:100"), 100))
        client.submit(ReadOp("s", "nothing-waits"), timeout=1.5)
    assert broker.llen(config.lanes.batch.queue) == 1


def test_a_window_with_the_list_empty_only_raises_the_drain_rate(
    targeted: tuple[Settings, Config, redis.Redis],
) -> None:
    """After a stall the measured rate is low; while the workers keep up, the
    list stays empty, and what they drained (20 in 1.1 s) is a floor to raise
    it to. A lower figure from such a window would not lower it."""
    settings, config, broker = targeted
    key = admission_key(config.lanes.batch.queue)
    now = _deadline(0)
    broker.hset(key, mapping={"rate": 2, "rate_at": now - 1100, "done_at": 0, "done": 20})
    with Client("tests", settings, config) as client:
        client.submit(ReadOp("s", "after-the-stall"), timeout=60)
        assert 16 <= float(broker.hget(key, "rate") or 0) <= 20
        broker.hset(key, mapping={"rate_at": _deadline(0) - 1100, "done_at": 20, "done": 21})
        broker.ltrim(config.lanes.batch.queue, 1, 0)
        client.submit(ReadOp("s", "quiet"), timeout=60)
    assert 16 <= float(broker.hget(key, "rate") or 0) <= 20


def test_a_drain_rate_only_ever_measured_with_the_list_empty_refuses_nothing(
    bounded: tuple[Settings, Config, redis.Redis],
) -> None:
    """A floor (what a quiet lane drained) is not what the lane can drain: a
    burst of cache hits into a lane that had served a few slow reads a second
    was refused against it. Until a window measures the lane busy, the count
    and byte bounds alone hold the burst."""
    settings, config, broker = bounded
    key = admission_key(config.lanes.batch.queue)
    with Client("tests", settings, config) as client:
        client.submit_many([ReadOp("s", f"k{n}") for n in range(50)], timeout=600)
        broker.hset(key, mapping={"rate": 10, "rate_at": _deadline(0)})
        client.submit(ReadOp("s", "behind-a-floor"), timeout=1)
        broker.hset(key, "busy_at", _deadline(0))
        with pytest.raises(ResourceExhausted) as caught:
            client.submit(ReadOp("s", "behind-a-measured-rate"), timeout=1)
        assert caught.value.reason == "queue_too_long"
    assert broker.llen(config.lanes.batch.queue) == 51


def test_the_first_measuring_window_opens_at_the_first_completion(
    targeted: tuple[Settings, Config, redis.Redis],
) -> None:
    """A Redis that restarted empty: publishes arrive while the workers are
    still reconnecting. No window opens until a worker completes a request, so
    none measures the workers' absence as a slow lane."""
    settings, config, broker = targeted
    queue = config.lanes.batch.queue
    key, held = admission_key(queue), held_key(queue)
    with Client("tests", settings, config) as client:
        client.submit(ReadOp("s", "before-the-workers"), timeout=60)
        assert broker.hget(key, "rate_at") is None
        [member] = broker.zrange(held, 0, -1)
        size = int(member.rsplit(b":", 1)[1])
        ResultStore(broker).complete(Completion(key, (held, member.decode()), size))
        opened = broker.hmget(key, ["rate_at", "done_at"])
        assert opened[0] is not None
        assert opened[1] == b"1"
        # A second completion leaves the window where it opened.
        ResultStore(broker).complete(Completion(key, (held, "gone:1"), 1))
        assert broker.hmget(key, ["rate_at", "done_at"]) == opened


def test_an_answer_to_a_request_admitted_before_a_restart_opens_no_window(
    targeted: tuple[Settings, Config, redis.Redis],
) -> None:
    """The pool threads that held requests through a restart answer them as
    soon as Redis is back, before the workers' consumers have reconnected: a
    window opened by such an answer would measure the consumers' absence as a
    slow lane. Only a request this Redis admitted, once done, opens it."""
    settings, config, broker = targeted
    queue = config.lanes.batch.queue
    key, held = admission_key(queue), held_key(queue)
    with Client("tests", settings, config) as client:
        client.submit(ReadOp("s", "after-the-restart"), timeout=60)
        ResultStore(broker).complete(Completion(key, (held, "before-the-restart:1"), 1))
        assert broker.hget(key, "rate_at") is None
        [member] = broker.zrange(held, 0, -1)
        size = int(member.rsplit(b":", 1)[1])
        ResultStore(broker).complete(Completion(key, (held, member.decode()), size))
        assert broker.hmget(key, ["done", "done_at"]) == [b"2", b"2"]
        assert broker.hget(key, "rate_at") is not None


def test_without_measurements_the_bounds_alone_decide_as_before(
    targeted: tuple[Settings, Config, redis.Redis],
) -> None:
    """A cold start: no drain rate and no service time yet, so neither the
    deadline estimate nor the target refuses anything, however long the queue."""
    settings, config, broker = targeted
    key = admission_key(config.lanes.batch.queue)
    with Client("tests", settings, config) as client:
        client.submit_many([ReadOp("s", f"k{n}") for n in range(200)], timeout=600)
        broker.hset(key, "empty_at", _deadline(-60))
        client.submit(ReadOp("s", "late-joiner"), timeout=1)
    assert broker.llen(config.lanes.batch.queue) == 201
    assert broker.hget(key, "rate") is None


def test_completions_a_restarted_redis_never_admitted_leave_the_counts_at_rest(
    bounded: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = bounded
    queue = config.lanes.batch.queue
    key, held = admission_key(queue), held_key(queue)

    def completion(member: bytes) -> Completion:
        return Completion(key, (held, member.decode()), int(member.rsplit(b":", 1)[1]))

    with Client("tests", settings, config) as client:
        for n in range(2):  # two messages (one submit_many would pack them in one)
            client.submit(WriteOp("s", f"w{n}", b"x" * 1000), timeout=60)
        before = broker.zrange(held, 0, -1)
        assert len(before) == 2
        # Redis restarts empty; the workers finish the two requests they held.
        broker.flushdb()
        results = ResultStore(broker)
        for member in before:
            results.complete(completion(member))
        assert (int(broker.hget(key, "bytes") or 0), broker.zcard(held)) == (0, 0)
        assert int(broker.hget(key, "done") or 0) == 2  # the drain rate still sees them
        # What it admits from then on is counted from there, and given back once.
        client.submit(WriteOp("s", "after", b"x" * 1000), timeout=60)
        [member] = broker.zrange(held, 0, -1)
        assert int(broker.hget(key, "bytes") or 0) == completion(member).size
        for _ in range(2):
            results.complete(completion(member))
        assert (int(broker.hget(key, "bytes") or 0), broker.zcard(held)) == (0, 0)


@pytest.mark.fault
def test_a_request_lost_on_the_way_stops_counting_after_its_deadline(
    bounded: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = bounded
    queue = config.lanes.batch.queue
    key, held = admission_key(queue), held_key(queue)
    with Client("tests", settings, config) as client:
        client.submit(WriteOp("s", "lost", b"x" * 1000), timeout=0.5)
        # Taken off the list by a connection that never delivered it.
        assert broker.rpop(queue) is not None
        assert broker.zcard(held) == 1
        [(_, lapses_at)] = broker.zrange(held, 0, -1, withscores=True)
        # Its deadline and the grace (HELD_GRACE_MS) pass on Redis's clock.
        eventually(
            lambda: _redis_ms(broker) > lapses_at, timeout=0.5 + HELD_GRACE_S + 5,
            interval=0.05, message="the lost request's deadline and grace to pass",
        )  # fmt: skip
        kept = client.submit(WriteOp("s", "kept", b"x" * 1000), timeout=60)
    # The lost one lapsed with its bytes: what is held is the one kept.
    [member] = broker.zrange(held, 0, -1)
    request_id, size = member.decode().rsplit(":", 1)
    assert request_id == kept.request_id
    assert int(broker.hget(key, "bytes") or 0) == int(size)


def test_a_request_expired_on_rabbitmq_stops_counting_at_once(
    on_either: tuple[Settings, Config, redis.Redis],
) -> None:
    """On RabbitMQ a message expires at its deadline, unseen by any worker:
    its place in admission's books goes with it, not 5 s later."""
    settings, config, books = on_either
    queue = config.lanes.batch.queue
    with Client("tests", settings, config) as client:
        client.submit(WriteOp("s", "expires", b"x" * 1000), timeout=0.5)
        assert books.zcard(held_key(queue)) == 1
        # The deadline as admission scored it, then the short grace past it.
        [(_, lapses_at)] = books.zrange(held_key(queue), 0, -1, withscores=True)
        grace_ms = HELD_GRACE_ELSEWHERE_MS if settings.broker_is_amqp else HELD_GRACE_MS
        due = lapses_at - grace_ms + HELD_GRACE_ELSEWHERE_MS
        eventually(lambda: _redis_ms(books) > due, timeout=0.5 + HELD_GRACE_ELSEWHERE_MS / 1000 + 5,
                   interval=0.05, message="the deadline and the short grace to pass")  # fmt: skip
        if settings.broker_is_amqp:
            eventually(lambda: depth(settings, queue) == 0, timeout=5,
                       message="RabbitMQ to drop the expired message")  # fmt: skip
        client.submit(WriteOp("s", "next", b"x" * 1000), timeout=60)
    expected = 1 if settings.broker_is_amqp else 2
    assert books.zcard(held_key(queue)) == expected
    assert depth(settings, queue) == expected


def test_the_held_grace_is_the_admission_scripts() -> None:
    script = (Path(admission.__file__).parent / "admit.lua").read_text()
    assert f"local HELD_GRACE_MS = {HELD_GRACE_MS}\n" in script
    assert f"local HELD_GRACE_ELSEWHERE_MS = {HELD_GRACE_ELSEWHERE_MS}\n" in script


def test_a_held_set_a_publish_created_gets_an_expiry_when_the_workers_next_speak(
    bounded: tuple[Settings, Config, redis.Redis],
) -> None:
    """admit.lua renews its books' expiry a quarter-period at a time: a held
    set created in between (its last request done, a new one admitted) has
    none until the workers say their service times, every second they answer."""
    settings, config, broker = bounded
    lane = lane_admission_bounds(config)[config.lanes.batch.queue]
    with Client("tests", settings, config) as client:
        client.submit(ReadOp("s", "first"), timeout=60)
        assert 0 < broker.pttl(lane.held_key) <= books_expiry_ms(lane)
        broker.delete(lane.held_key)  # its last request done
        client.submit(ReadOp("s", "second"), timeout=60)
        assert broker.pttl(lane.held_key) == -1
        publish_service_times(broker, lane, {"read": 1.0}, {"read": 1.0})
        assert 0 < broker.pttl(lane.held_key) <= books_expiry_ms(lane)
        assert 0 < broker.pttl(lane.stats_key) <= books_expiry_ms(lane)


def test_a_held_count_that_drifted_is_counted_again_at_the_next_look(
    bounded: tuple[Settings, Config, redis.Redis],
) -> None:
    """The books count the held set's requests without reading it at every
    publish: a count that drifted from it (the set lost apart from the hash)
    is counted again once the earliest held request may have lapsed."""
    settings, config, broker = bounded
    lane = lane_admission_bounds(config)[config.lanes.batch.queue]
    with Client("tests", settings, config) as client:
        client.submit(ReadOp("s", "first"), timeout=60)
        assert broker.hget(lane.stats_key, "held") == b"1"
        broker.delete(lane.held_key)
        broker.hset(lane.stats_key, mapping={"held": 5, "lapse_at": _redis_ms(broker) - 1})
        client.submit(ReadOp("s", "second"), timeout=60)
    assert broker.zcard(lane.held_key) == 1
    assert broker.hget(lane.stats_key, "held") == b"1"
