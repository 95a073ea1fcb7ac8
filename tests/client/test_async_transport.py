"""The asyncio client's wire: it queues what the sync client's broker channel
queues, byte for byte but for the ids, through the same admission."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dataservice.client.async_transport import AsyncTransport
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import InvalidArgument
from dataservice.limits.admission import AdmissionRefused
from tests.harness.support import bounded_admission, now_ms

# No worker consumes this database: whatever is admitted stays queued.
UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/11"


@pytest.fixture
def unserved(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, Config, redis.Redis]]:
    bounds = {"max_messages": 3, "max_bytes": 1 << 20}
    with bounded_admission(settings, UNSERVED_REDIS_URL, tmp_path, interactive=bounds) as bounded:
        yield bounded


def _without_ids(raw: bytes, request_id: str) -> dict[str, Any]:
    message: dict[str, Any] = json.loads(raw.replace(request_id.encode(), b"<id>"))
    message["properties"].pop("delivery_tag")
    message["properties"].pop("reply_to")
    return message


def test_both_transports_queue_the_same_message(
    unserved: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = unserved
    queue = config.lanes.interactive.queue
    deadline = now_ms() + 20_000
    sync_id, async_id = uuid.uuid4().hex, uuid.uuid4().hex
    item = (b"signed request", "", deadline, "read", 1)

    transport = Transport(settings, config)
    transport.publish_many(
        [(*item[:1], sync_id, *item[2:])], lane=LaneName.INTERACTIVE, caller="tests"
    )
    transport.close()

    async def publish() -> None:
        wire = AsyncTransport(settings, config, caller="tests")
        await wire.publish_many(
            [(*item[:1], async_id, *item[2:])], lane=LaneName.INTERACTIVE, caller="tests"
        )
        await wire.aclose()

    asyncio.run(publish())
    # kombu pushes with LPUSH and pops from the right: the sync one is last.
    newer, older = broker.lrange(queue, 0, -1)
    assert _without_ids(newer, async_id) == _without_ids(older, sync_id)
    assert json.loads(older)["headers"]["id"] == sync_id


def test_the_async_transport_is_refused_as_the_sync_one_and_waits_for_nothing(
    unserved: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = unserved

    async def publish() -> tuple[int, int]:
        wire = AsyncTransport(settings, config, caller="tests")
        try:
            items = [(b"x", uuid.uuid4().hex, now_ms() + 20_000, "read", 1) for _ in range(5)]
            with pytest.raises(AdmissionRefused) as refused:
                await wire.publish_many(items, lane=LaneName.INTERACTIVE, caller="tests")
            return refused.value.sent, wire.replies.waiting
        finally:
            await wire.aclose()

    sent, waiting = asyncio.run(publish())
    assert sent == 3
    assert broker.llen(config.lanes.interactive.queue) == 3
    # The refused ones are not waited for; the three queued ones are.
    assert waiting == 3


def test_the_async_client_needs_a_redis_or_rabbitmq_broker(
    settings: Settings, config: Config
) -> None:
    sqs = dataclasses.replace(settings, broker_url="sqs://queue.example/")
    with pytest.raises(InvalidArgument, match="redis://, rediss://"):
        AsyncTransport(sqs, config, caller="tests")


def test_a_publish_cancelled_before_it_went_is_never_sent(
    unserved: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = unserved

    async def publish() -> int:
        wire = AsyncTransport(settings, config, caller="tests")
        try:
            item = (b"x", uuid.uuid4().hex, now_ms() + 20_000, "read", 1)
            sending = asyncio.ensure_future(
                wire.publish_many([item], lane=LaneName.INTERACTIVE, caller="tests")
            )
            await asyncio.sleep(0)  # handed to the publishing task, not yet sent
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
            # Published now, it would be; it is not.
            ok = (b"y", uuid.uuid4().hex, now_ms() + 20_000, "read", 1)
            await wire.publish_many([ok], lane=LaneName.INTERACTIVE, caller="tests")
            return wire.replies.waiting
        finally:
            await wire.aclose()

    waiting = asyncio.run(publish())
    queued = broker.lrange(config.lanes.interactive.queue, 0, -1)
    assert [json.loads(m)["body"] for m in queued] == ["eQ=="]  # base64 of b"y"
    assert waiting == 1


def test_concurrent_publishes_share_round_trips(
    unserved: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = unserved

    async def publish() -> int:
        wire = AsyncTransport(settings, config, caller="tests")
        try:
            items = [(b"z", uuid.uuid4().hex, now_ms() + 20_000, "write", 1) for _ in range(60)]
            await asyncio.gather(
                *(wire.publish_many([i], lane=LaneName.BATCH, caller="tests") for i in items)
            )
            return wire._publisher._books.calls.round_trips  # type: ignore[attr-defined]
        finally:
            await wire.aclose()

    round_trips = asyncio.run(publish())
    assert broker.llen(config.lanes.batch.queue) == 60
    # The first alone, the rest together as they gathered meanwhile.
    assert round_trips <= 3, round_trips
