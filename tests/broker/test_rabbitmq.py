"""The service on RabbitMQ: worker processes consuming the lanes' quorum
queues, callers publishing with confirms, answers and admission on Redis."""

from __future__ import annotations

import dataclasses
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import amqp
import pytest
import redis
from dataservice_tools.localservices import free_port
from kombu import Connection
from sqlalchemy import Engine

from dataservice import ReadOp, Record, ResourceExhausted, WriteOp
from dataservice.broker.celery import TASK_NAME
from dataservice.broker.results import ResultStore
from dataservice.codec import decode_response
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.health import liveness
from dataservice.ops.supervisor import Supervisor
from dataservice.proto import pb
from dataservice.redis.keys import admission_key, held_key
from tests.conftest import supervised
from tests.harness.clients import AnyClient, ClientKind, make_client
from tests.harness.rabbit import AMQP_REDIS_URL, depth, fresh_vhost, on_rabbitmq
from tests.harness.support import RawPublisher, bounded_admission, caller_key, now_ms, signed

# No worker consumes these: whatever is admitted stays queued.
UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/12"
BOUND = 5


def primary_read(scope: str, object_id: str) -> pb.RequestEnvelope:
    """The envelope of a ``PRIMARY`` read by ``tests``, due in 5 s."""
    return pb.RequestEnvelope(
        caller="tests",
        request_id=uuid.uuid4().hex,
        deadline_unix_ms=now_ms() + 5000,
        issued_at_unix_ms=now_ms(),
        read=pb.ReadRecordRequest(scope=scope, object_id=object_id, mode=pb.READ_MODE_PRIMARY),
    )


@pytest.fixture(scope="module")
def amqp_settings(settings: Settings) -> Settings:
    return dataclasses.replace(
        settings,
        broker_url=fresh_vhost("dataservice-tests"),
        result_backend_url=AMQP_REDIS_URL,
        redis_url=AMQP_REDIS_URL,
    )


@pytest.fixture(scope="module")
def amqp_workers(
    amqp_settings: Settings,
    config: Config,
    database: Engine,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Supervisor]:
    with supervised(amqp_settings, config, tmp_path_factory.mktemp("amqp-worker-logs")) as started:
        yield started


@pytest.mark.slow
def test_a_write_and_cached_reads_travel_through_rabbitmq(
    amqp_workers: Supervisor,
    amqp_settings: Settings,
    config: Config,
    scope: str,
    client_kind: ClientKind,
) -> None:
    with make_client(client_kind, "tests", amqp_settings, config) as client:
        client.write(scope, "a", b"hello", timeout=5)
        for _ in range(20):
            assert client.read(scope, "a", timeout=5).payload == b"hello"
        handles = client.submit_many([WriteOp(scope, f"b{n}", b"batch") for n in range(50)])
        assert all(handle.result(10).revision == 1 for handle in handles)
    assert depth(amqp_settings, config.lanes.interactive.queue) == 0


def test_a_caller_without_this_package_is_served_on_rabbitmq(
    amqp_workers: Supervisor, amqp_settings: Settings, config: Config, scope: str
) -> None:
    """A caller that follows docs/protocol.md with kombu alone: a signed
    envelope published to the lane's exchange, no admission, no expiration;
    its answer waits under its result key."""
    with make_client("sync", "tests", amqp_settings, config) as client:
        client.write(scope, "from-afar", b"payload", timeout=5)
    message = primary_read(scope, "from-afar")
    raw = RawPublisher(amqp_settings, config)
    results = ResultStore.from_url(amqp_settings.result_backend_url)
    try:
        body = signed(message, caller_key(amqp_settings, "tests"))
        raw.publish(body, message.request_id, message.deadline_unix_ms)
        answer = results.wait("tests", message.request_id, 5.0)
    finally:
        results.close()
        raw.close()
    assert answer is not None, "no answer"
    record = decode_response(answer, message.request_id)
    assert isinstance(record, Record)
    assert (record.object_id, record.payload) == ("from-afar", b"payload")


def _until_refused(client: AnyClient, most: int) -> tuple[int, ResourceExhausted]:
    """Submit reads until one is refused: how many went before it, and the refusal."""
    for n in range(most):
        try:
            client.submit(ReadOp("s", f"again{n}"), timeout=60)
        except ResourceExhausted as refusal:
            return n, refusal
    raise AssertionError(f"{most} submitted, none refused")


def test_the_workers_declare_the_lanes_quorum_queues_and_no_delayed_delivery_ones(
    amqp_workers: Supervisor, config: Config
) -> None:
    queues = _queues("dataservice-tests")
    lanes = {config.lanes.interactive.queue, config.lanes.batch.queue}
    assert {name: kind for name, kind in queues.items() if name in lanes} == dict.fromkeys(
        lanes, "quorum"
    )
    assert not [name for name in queues if name.startswith("celery_delayed")]


def _queues(vhost: str) -> dict[str, str]:
    """The queues of ``vhost`` and their types, as RabbitMQ lists them."""
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "-p", vhost, "--no-table-headers", "name", "type"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return dict(line.split("\t")[:2] for line in listed.splitlines() if "\t" in line)


@pytest.fixture
def unserved(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, Config, redis.Redis]]:
    """RabbitMQ with nobody consuming, and a lane bound of ``BOUND`` messages."""
    with bounded_admission(
        settings,
        UNSERVED_REDIS_URL,
        tmp_path,
        batch={"max_messages": BOUND, "max_bytes": 1 << 24},
    ) as (on_redis, config, books):
        yield on_rabbitmq(on_redis, config, "dataservice-unserved"), config, books


def test_a_publish_rabbitmq_refuses_reaches_the_caller_retryably_and_leaves_the_books(
    unserved: tuple[Settings, Config, redis.Redis], client_kind: ClientKind
) -> None:
    """Admission's books lost (as in a Redis restart) while the queue keeps
    its backlog: RabbitMQ's own bound refuses, and the caller hears
    ``RESOURCE_EXHAUSTED`` with a retry-after."""
    settings, config, books = unserved
    queue = config.lanes.batch.queue
    with make_client(client_kind, "tests", settings, config) as client:
        for n in range(BOUND):
            client.submit(ReadOp("s", f"k{n}"), timeout=60)
        with pytest.raises(ResourceExhausted) as caught:
            client.submit(ReadOp("s", "one-more"), timeout=60)
        assert caught.value.reason == "queue_full"
        books.flushdb()
        accepted, refusal = _until_refused(client, BOUND)
        assert refusal.reason == "queue_full"
        assert refusal.retry_after > 0
    # RabbitMQ's bound counts what is ready and refuses the publish that finds
    # the queue over it: at most one beyond the bound.
    assert BOUND <= depth(settings, queue) <= BOUND + 1
    assert accepted == depth(settings, queue) - BOUND
    # The refused publish left the books: only what the queue took is held.
    assert books.zcard(held_key(queue)) == accepted
    assert int(books.hget(admission_key(queue), "refused:queue_full") or 0) == 1


@pytest.mark.slow
def test_liveness_asks_rabbitmq_itself(amqp_settings: Settings) -> None:
    (live,) = liveness(amqp_settings, [], max_age_s=60, timeout_s=2)
    assert live.ok, live.detail
    assert "guest" not in live.detail
    gone = dataclasses.replace(
        amqp_settings, broker_url=f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    )
    (dead,) = liveness(gone, [], max_age_s=60, timeout_s=2)
    assert not dead.ok
    assert "ConnectionRefusedError" in dead.detail


@pytest.mark.parametrize(
    ("content_type", "content_encoding"),
    [
        (None, None),
        (None, "binary"),
        ("application/data", "binary"),
        ("text/plain", "binary"),
        ("application/x-python-serialize", "binary"),
    ],
)
def test_a_task_message_in_no_accepted_content_type_is_dropped_and_the_worker_serves_on(
    amqp_workers: Supervisor,
    amqp_settings: Settings,
    config: Config,
    scope: str,
    content_type: str | None,
    content_encoding: str | None,
) -> None:
    """Any AMQP publisher can send a task message whose content type the
    workers do not accept, or none at all (kombu takes that for raw bytes):
    it is dropped, not delivered again, and the worker that took it serves
    the next request."""
    queue = config.lanes.interactive.queue
    given = {"content_type": content_type, "content_encoding": content_encoding}
    properties = {name: value for name, value in given.items() if value is not None}
    # A request the workers would serve, but for its content type.
    message = primary_read(scope, "x")
    body = signed(message, caller_key(amqp_settings, "tests"))
    with Connection(amqp_settings.broker_url) as connection:
        connection.default_channel.basic_publish(
            amqp.Message(
                body,
                application_headers={"task": TASK_NAME, "id": message.request_id},
                **properties,
            ),
            exchange=queue,
            routing_key=queue,
        )
    with make_client("sync", "tests", amqp_settings, config) as client:
        client.write(scope, "after", b"served", timeout=5)
        assert client.read(scope, "after", timeout=5).payload == b"served"
    assert depth(amqp_settings, queue) == 0
    assert all(pool.worker is not None and pool.worker.running for pool in amqp_workers.pools)
