"""The inline fast path (:mod:`dataservice.worker.fastpath`) against real worker processes.

Each worker runs :mod:`tests.harness.fastpath_app`, on each broker in turn (Redis db
12, then a RabbitMQ virtual host of its own, with the answers on Redis db 12):
a task whose inline handler answers ``inline`` bodies on the consumer thread
and declines others, which the task body answers from the pool. Every answer
says who gave it and whether the message was a redelivery.

Unacknowledged messages are counted on Redis (kombu's ``unacked`` hash). On
RabbitMQ nothing counts them exactly (its statistics lag by seconds), so
acknowledgement shows otherwise: a message left unacknowledged would hold one
of the worker's three prefetch slots for good, and whatever is
unacknowledged when a worker stops comes back to the queue, which the module
checks is empty once its worker has stopped.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from dataservice_tools.localservices import redis_reachable
from dataservice_tools.testkit.waits import eventually
from kombu import Connection

from dataservice.broker.rabbitmq import AmqpDepths
from dataservice.config.settings import AMQP_SCHEMES
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering, worker_environ
from tests.conftest import require
from tests.harness.fastpath_app import (
    HELD,
    QUEUE,
    TASK,
    make_app,
    node_name,
    release_key,
    reply_key,
    send,
)
from tests.harness.rabbit import BROKERS, fresh_vhost
from tests.harness.support import TaskEvents

OWN_REDIS_URL = "redis://127.0.0.1:6379/12"
ROOT = Path(__file__).resolve().parents[2]
ANSWER_TIMEOUT_S = 5
# kombu marks a message unacknowledged before the strategy sees it and clears
# it on the event loop's next turn after the answer: poll rather than assert once.
SETTLE_S = 5.0


def _start(
    log_dir: Path,
    name: str,
    url: str,
    queue: str,
    concurrency: int = 3,
    visibility_timeout_s: float = 3600,
) -> WorkerProcess:
    argv = [sys.executable, "-m", "tests.harness.fastpath_app", "--url", url]
    argv += ["--answers-url", OWN_REDIS_URL, "--queue", queue, "--concurrency", str(concurrency)]
    argv += ["--visibility-timeout", str(visibility_timeout_s)]
    environ = worker_environ()
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    return WorkerProcess(argv, environ, log_dir / f"{name}.log", name).start()


def publish(app: Celery, mode: str, queue: str = QUEUE, **options: Any) -> str:
    token = uuid.uuid4().hex
    send(app, f"{mode}:{token}".encode(), token, queue, **options)
    return token


def answer(
    broker: redis.Redis, token: str, timeout_s: float = ANSWER_TIMEOUT_S
) -> tuple[str, bool]:
    """Who answered ``token`` (``inline`` or ``pool``) and whether it was redelivered."""
    got = broker.blpop([reply_key(token)], timeout_s)
    assert got is not None, f"no answer to {token}"
    path, _, again = got[1].decode().partition(":")
    return path, again == "1"


class Queues:
    """The messages a test's broker holds: waiting in a queue, and (on Redis)
    delivered and not yet acknowledged."""

    def __init__(self, url: str, answers: redis.Redis) -> None:
        self.url = url
        self.on_rabbitmq = url.startswith(AMQP_SCHEMES)
        self._answers = answers

    def waiting(self, queue: str) -> int:
        if not self.on_rabbitmq:
            return int(self._answers.llen(queue))
        depths = AmqpDepths(self.url)
        try:
            return depths.depth(queue)
        finally:
            depths.close()

    def unacked(self) -> int | None:
        """None on RabbitMQ, which does not count them exactly."""
        return None if self.on_rabbitmq else int(self._answers.hlen("unacked"))

    def settled(self) -> bool:
        """Nothing unacknowledged, within a moment (where it is counted)."""
        return eventually(lambda: self.unacked() in (0, None), timeout=SETTLE_S, interval=0.02)

    def delete(self, queue: str) -> None:
        if not self.on_rabbitmq:
            self._answers.delete(queue)
            return
        with Connection(self.url) as connection:
            connection.default_channel.queue_delete(queue)


@pytest.fixture(scope="module")
def broker() -> Iterator[redis.Redis]:
    """The answers' Redis (on Redis, also the broker)."""
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(OWN_REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture(scope="module", params=BROKERS)
def queues(request: pytest.FixtureRequest, broker: redis.Redis) -> Queues:
    url = OWN_REDIS_URL if request.param == "redis" else fresh_vhost("dataservice-fastpath")
    return Queues(url, broker)


@pytest.fixture(scope="module")
def app(queues: Queues) -> Iterator[Celery]:
    app = make_app(queues.url)
    yield app
    app.close()


@pytest.fixture(scope="module")
def node(app: Celery, queues: Queues, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One worker for the module; the node name its control replies come from."""
    worker = _start(tmp_path_factory.mktemp("fastpath"), "fastpath", queues.url, QUEUE)
    try:
        wait_answering(app, [worker])
        yield node_name(worker.pid)
    finally:
        stop_all([worker])
    # Whatever it left unacknowledged came back when it stopped.
    assert queues.waiting(QUEUE) == 0


@pytest.mark.slow
def test_inline_messages_are_answered_on_the_consumer_thread_and_acknowledged(
    app: Celery, broker: redis.Redis, queues: Queues, node: str
) -> None:
    tokens = [publish(app, "inline") for _ in range(20)]
    assert [answer(broker, t) for t in tokens] == [("inline", False)] * 20
    assert queues.settled()
    assert queues.waiting(QUEUE) == 0


def test_declined_messages_are_answered_by_the_pool(
    app: Celery, broker: redis.Redis, queues: Queues, node: str
) -> None:
    tokens = [publish(app, "pool") for _ in range(10)]
    assert [answer(broker, t) for t in tokens] == [("pool", False)] * 10
    assert queues.settled()


def test_a_handler_that_raises_hands_the_message_to_the_pool(
    app: Celery, broker: redis.Redis, queues: Queues, node: str
) -> None:
    token = publish(app, "raise")
    assert answer(broker, token) == ("pool", False)
    assert queues.settled()


def test_messages_with_eta_or_expiry_go_through_celerys_own_strategy(
    app: Celery, broker: redis.Redis, node: str
) -> None:
    later = publish(app, "inline", countdown=0.2)
    expiring = publish(app, "inline", expires=60)
    assert answer(broker, later) == ("pool", False)
    assert answer(broker, expiring) == ("pool", False)


def test_a_rate_limit_set_at_run_time_takes_the_task_off_the_fast_path(
    app: Celery, broker: redis.Redis, node: str
) -> None:
    try:
        assert app.control.rate_limit(TASK, "1000/s", destination=[node], reply=True)
        assert answer(broker, publish(app, "inline")) == ("pool", False)
    finally:
        assert app.control.rate_limit(TASK, 0, destination=[node], reply=True)
    assert answer(broker, publish(app, "inline")) == ("inline", False)


def test_a_revoked_message_is_acknowledged_and_never_answered(
    app: Celery, broker: redis.Redis, queues: Queues, node: str
) -> None:
    revoked = uuid.uuid4().hex
    assert app.control.revoke(revoked, destination=[node], reply=True)
    send(app, f"inline:{revoked}".encode(), revoked)
    # One consumer thread takes messages in order: once the next one is
    # answered, the revoked one has been dealt with.
    assert answer(broker, publish(app, "inline")) == ("inline", False)
    assert broker.llen(reply_key(revoked)) == 0
    assert queues.settled()


def _total(app: Celery, node: str) -> int:
    stats = app.control.inspect(destination=[node], timeout=2).stats()
    assert stats
    assert node in stats
    return int(stats[node]["total"].get(TASK, 0))


def test_worker_totals_count_tasks_served_inline(
    app: Celery, broker: redis.Redis, node: str
) -> None:
    before = _total(app, node)
    tokens = [publish(app, "inline") for _ in range(5)] + [publish(app, "pool") for _ in range(3)]
    for token in tokens:
        answer(broker, token)
    assert _total(app, node) == before + 8


def test_control_commands_answer_while_inline_requests_flow(
    app: Celery, broker: redis.Redis, node: str
) -> None:
    stop = threading.Event()
    served = [0]
    failures: list[BaseException] = []

    def traffic() -> None:
        try:
            while not stop.is_set():
                assert answer(broker, publish(app, "inline")) == ("inline", False)
                served[0] += 1
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        assert eventually(lambda: served[0] >= 20, timeout=SETTLE_S, interval=0.02)
        for _ in range(5):
            before = served[0]
            queues = app.control.inspect(destination=[node], timeout=2).active_queues()
            assert queues
            assert [q["name"] for q in queues[node]] == [QUEUE]
            assert app.control.ping(destination=[node], timeout=1) == [{node: {"ok": "pong"}}]
            assert eventually(lambda: served[0] > before, timeout=SETTLE_S, interval=0.02)  # noqa: B023
    finally:
        stop.set()
        thread.join(ANSWER_TIMEOUT_S + 1)
    assert not failures


@pytest.mark.slow
def test_task_events_are_sent_for_inline_tasks_only_while_events_are_enabled(
    app: Celery, broker: redis.Redis, node: str
) -> None:
    events = TaskEvents(app)
    try:
        # Worker heartbeats are always on: the first one says the receiver listens.
        assert eventually(
            lambda: any(e["type"] == "worker-heartbeat" for e in list(events.seen)),
            timeout=10,
            interval=0.02,
        )
        quiet = publish(app, "inline")
        assert answer(broker, quiet) == ("inline", False)
        assert app.control.enable_events(destination=[node], reply=True)
        try:
            heard = publish(app, "inline")
            assert answer(broker, heard) == ("inline", False)
            assert eventually(
                lambda: "task-succeeded" in events.of(heard), timeout=SETTLE_S, interval=0.02
            )
        finally:
            app.control.disable_events(destination=[node], reply=True)
        assert events.of(heard) == ["task-received", "task-started", "task-succeeded"]
        received = next(e for e in events.seen if e.get("uuid") == heard)
        assert (received["name"], received["hostname"]) == (TASK, node)
        # Sent in order by one dispatcher: anything for the first would have come first.
        assert events.of(quiet) == []
    finally:
        events.close()


@pytest.fixture
def own_queue(broker: redis.Redis, queues: Queues) -> Iterator[str]:
    """A queue no other worker consumes, and the module's worker keys cleaned after."""
    queue = f"fastpath-{uuid.uuid4().hex[:8]}"
    yield queue
    queues.delete(queue)
    broker.delete(HELD)


def _held(broker: redis.Redis, *tokens: str) -> Callable[[], bool]:
    return lambda: set(tokens) <= {t.decode() for t in broker.lrange(HELD, 0, -1)}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_reservations_stay_within_the_pools_threads(
    app: Celery, broker: redis.Redis, queues: Queues, own_queue: str, tmp_path: Path
) -> None:
    worker = _start(tmp_path, "bounded", queues.url, own_queue, concurrency=2)
    try:
        wait_answering(app, [worker])
        holds = [publish(app, "hold-pool", own_queue) for _ in range(2)]
        assert eventually(_held(broker, *holds), timeout=SETTLE_S, interval=0.02)
        waiting = [publish(app, "inline", own_queue) for _ in range(3)]
        # Both threads busy fill the prefetch window: the consumer takes no
        # more, so even a message the handler could answer waits in the queue.
        time.sleep(1)
        assert queues.waiting(own_queue) == 3
        assert queues.unacked() in (2, None)
        for token in holds:
            broker.set(release_key(token), 1)
        assert [answer(broker, t) for t in holds] == [("pool", False)] * 2
        assert [answer(broker, t) for t in waiting] == [("inline", False)] * 3
        assert queues.settled()
    finally:
        stop_all([worker], 5)
    assert queues.waiting(own_queue) == 0


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_worker_killed_holding_unacknowledged_messages_loses_none(
    app: Celery, broker: redis.Redis, queues: Queues, own_queue: str, tmp_path: Path
) -> None:
    first = _start(tmp_path, "first", queues.url, own_queue, concurrency=2)
    second: WorkerProcess | None = None
    try:
        wait_answering(app, [first])
        held_in_pool = publish(app, "hold-pool", own_queue)
        assert eventually(_held(broker, held_in_pool), timeout=SETTLE_S, interval=0.02)
        # One thread busy: the other prefetch slot still serves inline answers.
        served = [publish(app, "inline", own_queue) for _ in range(2)]
        assert [answer(broker, t) for t in served] == [("inline", False)] * 2
        held_inline = publish(app, "hold-inline", own_queue)
        assert eventually(_held(broker, held_in_pool, held_inline), timeout=SETTLE_S, interval=0.02)
        queued = [publish(app, "inline", own_queue) for _ in range(2)]
        assert eventually(lambda: queues.unacked() in (2, None), timeout=SETTLE_S, interval=0.02)

        first.send_signal(signal.SIGKILL)
        assert first.wait(5) == -signal.SIGKILL
        if queues.on_rabbitmq:
            # The connection gone, RabbitMQ returns what it had delivered at once.
            assert eventually(
                lambda: queues.waiting(own_queue) == 4, timeout=SETTLE_S, interval=0.02
            )
        else:
            assert (queues.unacked(), queues.waiting(own_queue)) == (2, 2)

        # On Redis, only a worker with a short visibility timeout restores them.
        second = _start(
            tmp_path, "second", queues.url, own_queue, concurrency=2, visibility_timeout_s=2
        )
        answered = {t: answer(broker, t, 30) for t in (*queued, held_in_pool, held_inline)}
        assert [answered[t] for t in queued] == [("inline", False)] * 2
        assert answered[held_in_pool] == ("pool", True)
        assert answered[held_inline] == ("inline", True)
        assert queues.settled()
        assert queues.waiting(own_queue) == 0
        # At least once, and here exactly once: nothing answered twice.
        for token in (*served, *queued, held_in_pool, held_inline):
            assert broker.llen(reply_key(token)) == 0
    finally:
        stop_all([w for w in (first, second) if w is not None], 5)
