"""One contract for the brokers, run against each (Redis, RabbitMQ): what the
service needs of a broker (:class:`dataservice.broker.base.Broker`), asked
the same way of both. A new broker passes these before anything else."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from dataservice_tools.localservices import redis_reachable

from dataservice.broker import Broker, broker_for
from dataservice.broker.celery import celery_settings
from dataservice.client.async_transport import AsyncTransport
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import InvalidArgument, Unavailable
from dataservice.limits.admission import AdmissionRefused
from dataservice.refusals import Reason
from tests.conftest import require
from tests.harness.rabbit import BROKERS, on_rabbitmq
from tests.harness.support import bounded_admission, now_ms, publish_one

# No worker consumes this database: whatever is admitted stays queued.
UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/11"
MAX_MESSAGES = 10

Lane = tuple[Settings, Config, Broker]


@pytest.fixture(params=BROKERS)
def lane(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Iterator[Lane]:
    """An interactive lane of :data:`MAX_MESSAGES` that nobody serves, on each
    broker in turn (on RabbitMQ its queues are fresh, admission's books in Redis)."""
    require(redis_reachable(UNSERVED_REDIS_URL), "Redis at 127.0.0.1:6379")
    with bounded_admission(
        settings,
        UNSERVED_REDIS_URL,
        tmp_path,
        interactive={"max_messages": MAX_MESSAGES, "max_bytes": 1 << 20},
    ) as (on_redis, config, _):
        chosen = on_redis
        if request.param == "amqp":
            chosen = on_rabbitmq(on_redis, config, "dataservice-contract")
        yield chosen, config, broker_for(chosen)


def _publish(settings: Settings, config: Config, n: int) -> list[str]:
    transport = Transport(settings, config)
    try:
        return [publish_one(transport) for _ in range(n)]
    finally:
        transport.close()


async def _publish_async(settings: Settings, config: Config, n: int) -> list[str]:
    wire = AsyncTransport(settings, config, caller="tests")
    outcomes = []
    try:
        for _ in range(n):
            item = (b"y" * 100, uuid.uuid4().hex, now_ms() + 30_000, "read", 1)
            try:
                await wire.publish_many([item], lane=LaneName.INTERACTIVE)
            except AdmissionRefused as refusal:
                outcomes.append(str(refusal.reason))
            else:
                outcomes.append("queued")
    finally:
        await wire.aclose()
    return outcomes


def test_what_is_admitted_waits_in_its_lane_and_is_counted(lane: Lane) -> None:
    settings, config, broker = lane
    queue = config.lanes.interactive.queue
    assert _publish(settings, config, 3) == ["queued"] * 3
    depths = broker.depths()
    try:
        assert depths.depth(queue) == 3
        assert depths.depth(config.lanes.batch.queue) == 0
    finally:
        depths.close()
    peek = broker.peek(queue, 2)
    assert peek.total == 3
    if peek.entries is not None:
        # Shown, oldest first, as stored: kombu's message around the body.
        assert len(peek.entries) == 2
        assert all(json.loads(entry)["properties"]["body_encoding"] for entry in peek.entries)


def test_both_publishers_fill_a_lane_to_its_bound_and_are_refused_with_a_reason(
    lane: Lane,
) -> None:
    settings, config, broker = lane
    half = MAX_MESSAGES // 2
    assert _publish(settings, config, half) == ["queued"] * half
    outcomes = asyncio.run(_publish_async(settings, config, MAX_MESSAGES - half + 1))
    assert outcomes == ["queued"] * (MAX_MESSAGES - half) + [Reason.QUEUE_FULL.value]
    assert _publish(settings, config, 1) == [Reason.QUEUE_FULL.value]
    depths = broker.depths()
    try:
        assert depths.depth(config.lanes.interactive.queue) == MAX_MESSAGES
    finally:
        depths.close()


def test_a_broker_with_an_epoch_says_it_and_one_without_says_none(lane: Lane) -> None:
    settings, config, broker = lane
    assert _publish(settings, config, 1) == ["queued"]
    transport = Transport(settings, config)
    try:
        with transport._pool.acquire(block=True, timeout=2) as connection:
            said = broker.epoch(connection)
    finally:
        transport.close()

    async def ask() -> str | None:
        publisher = broker.async_publisher(config)
        try:
            return await publisher.epoch()
        finally:
            await publisher.aclose()

    if broker.has_epoch:
        assert said
        assert asyncio.run(ask()) == said
    else:
        assert said is None
        assert asyncio.run(ask()) is None


def _gone(settings: Settings) -> Settings:
    """``settings`` with the broker moved where nothing listens."""
    rest = settings.broker_url.partition("://")[2]
    host = rest.split("@")[-1].split("/")[0]
    return dataclasses.replace(
        settings, broker_url=settings.broker_url.replace(host, "127.0.0.1:1", 1)
    )


def test_a_broker_says_whether_it_answers_and_where_it_is_without_credentials(
    lane: Lane,
) -> None:
    settings, _, broker = lane
    assert broker.unreachable(2.0) == ""
    where = broker.where()
    assert broker.name in where
    assert "guest" not in where
    assert "@" not in where
    assert broker_for(_gone(settings)).unreachable(1.0) != ""


def test_a_publish_to_a_broker_that_is_gone_is_unavailable_on_both_publishers(
    lane: Lane,
) -> None:
    settings, config, _ = lane
    gone = _gone(settings)
    transport = Transport(gone, config)
    try:
        with pytest.raises(Unavailable):
            publish_one(transport)
    finally:
        transport.close()
    with pytest.raises(Unavailable):
        asyncio.run(_publish_async(gone, config, 1))


def test_the_celery_settings_name_both_lanes_and_the_broker(lane: Lane) -> None:
    settings, config, _ = lane
    conf = celery_settings(settings, config)
    assert {queue.name for queue in conf["task_queues"]} == {
        config.lanes.interactive.queue,
        config.lanes.batch.queue,
    }
    assert conf["broker_url"].split("://")[0] == settings.broker_url.split("://")[0]
    assert conf["task_acks_late"] is True


def test_a_broker_url_of_no_known_broker_is_refused(settings: Settings) -> None:
    with pytest.raises(InvalidArgument, match="redis://"):
        broker_for(dataclasses.replace(settings, broker_url="sqs://queue.example/"))
