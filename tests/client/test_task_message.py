"""The client's prepared message is the one ``Celery.send_task`` would publish."""

from __future__ import annotations

import json
import uuid

import redis
from dataservice_tools.localservices import redis_reachable
from kombu.utils.json import dumps

from dataservice.broker.celery import SERIALIZER, TASK_NAME, celery_app
from dataservice.broker.message import task_message
from dataservice.compat.kombu import queue_entry
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.limits.admission import CALLER_HEADER, DEADLINE_HEADER, SIZE_HEADER
from tests.conftest import require
from tests.harness.support import on_redis

# No worker consumes this database (tests/limits/test_admission.py uses it alike).
UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/11"

# Fields that differ between any two messages, or between two publishers.
_PER_MESSAGE = {("properties", "delivery_tag"), ("properties", "reply_to"), ("headers", "origin")}


def _strip(message: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in message.items():
        if isinstance(value, dict):
            out[key] = {k: v for k, v in value.items() if (key, k) not in _PER_MESSAGE}
        else:
            out[key] = value
    return out


def test_the_prepared_message_equals_what_send_task_publishes(
    settings: Settings, config: Config
) -> None:
    require(redis_reachable(UNSERVED_REDIS_URL), "Redis at 127.0.0.1:6379")
    unserved = redis.Redis.from_url(UNSERVED_REDIS_URL)
    queue = config.lanes.interactive.queue
    unserved.delete(queue)
    body = b"\x00\x01 signed request bytes \xff"
    headers = {DEADLINE_HEADER: 1_900_000_000_000, CALLER_HEADER: "tests"}
    app = celery_app("task-message-probe", on_redis(settings, UNSERVED_REDIS_URL), config)
    try:
        with app.producer_or_acquire() as producer:
            app.send_task(
                TASK_NAME,
                args=(body,),
                producer=producer,
                task_id="r3quest",
                queue=queue,
                serializer=SERIALIZER,
                headers=headers,
                ignore_result=True,
                argsrepr=f"<RequestEnvelope {len(body)} bytes>",
                kwargsrepr="{}",
            )
    finally:
        app.close()
    published = json.loads(unserved.rpop(queue) or b"{}")
    unserved.close()
    prepared = task_message(body, "r3quest", queue, headers, reply_to="any")
    # Admission adds the envelope's size on the way in, whoever published.
    prepared["headers"][SIZE_HEADER] = len(body)
    assert _strip(prepared) == _strip(published)
    assert published["properties"]["delivery_tag"]
    assert (
        prepared["properties"]["delivery_tag"]
        != task_message(body, "r3quest", queue, headers, reply_to="any")["properties"][
            "delivery_tag"
        ]
    )


def test_each_message_is_tagged_with_a_fresh_uuid4_as_kombu_tags_it() -> None:
    tags = {
        task_message(b"body", "r3quest", "q", {}, reply_to="any")["properties"]["delivery_tag"]
        for _ in range(1000)
    }
    assert len(tags) == 1000
    for tag in tags:
        parsed = uuid.UUID(tag)
        assert str(parsed) == tag
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_the_queue_entry_is_kombus_json_of_the_message_byte_for_byte() -> None:
    headers = {DEADLINE_HEADER: 1_900_000_000_000, CALLER_HEADER: "tests", "x-ratio": 0.25}
    message = task_message(b"\x00\xff bytes", "r3quest", "q", headers, reply_to="any")
    message["headers"]["x-unicode"] = "caf\u00e9 \u2603"
    assert queue_entry(message) == dumps(message)
