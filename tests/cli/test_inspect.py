"""``dataservice inspect``: waiting messages decoded without a payload byte
unless asked by a reader of the callers file; a record's cache entries
without their bodies. Real Redis (a db no worker serves), the real command."""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import redis_reachable

from dataservice.cache.formats import CODECS, frame
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import CacheFormat
from dataservice.ops.processes import dataservice_argv, worker_environ
from dataservice.proto import pb
from dataservice.redis.keys import record_key, tombstone_key
from dataservice.types import ReadOp, WriteOp
from tests.conftest import require
from tests.harness.rabbit import depth, on_rabbitmq
from tests.harness.support import on_redis

UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/11"
# Recognisable in any spelling: raw, hex or base64.
MARKER = b"PAYLOAD-MARKER-\x00\xfe-" + uuid.uuid4().hex.encode()
SECRET_ID = f"secret-id-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def unserved(settings: Settings) -> Iterator[Settings]:
    require(redis_reachable(UNSERVED_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(UNSERVED_REDIS_URL)
    client.flushdb()
    yield on_redis(settings, UNSERVED_REDIS_URL)
    client.flushdb()
    client.close()


def _inspect(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        dataservice_argv("inspect", *args),
        env=worker_environ(settings),
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _spellings(data: bytes) -> list[str]:
    return [
        data.decode("latin-1"),
        repr(data)[2:-1],
        data.hex(),
        base64.b64encode(data).decode(),
        "PAYLOAD-MARKER",
    ]


@pytest.mark.slow
def test_waiting_messages_are_decoded_without_a_payload_byte(
    unserved: Settings, config: Config
) -> None:
    client = Client("demo", unserved, config)
    submitted = time.monotonic()
    try:
        client.submit(WriteOp("demo", SECRET_ID, MARKER), timeout=600)
        client.submit(ReadOp("demo", "plain"), timeout=600)
    finally:
        client.close()
    for args in (("queue", "batch"), ("queue", "batch", "--json")):
        shown = _inspect(unserved, *args)
        assert shown.returncode == 0, shown.stderr
        for spelling in [*_spellings(MARKER), SECRET_ID]:
            assert spelling not in shown.stdout + shown.stderr, (args, spelling)
    document = json.loads(_inspect(unserved, "queue", "batch", "--json").stdout)
    # Each inspection is a process of its own: seconds each on a busy machine.
    since_ms = (time.monotonic() - submitted) * 1000
    assert document["waiting"] == 2
    write, read = document["shown"]
    assert (write["operation"], write["caller"], write["scope"]) == ("write", "demo", "demo")
    assert write["payload_bytes"] == len(MARKER)
    assert 600_000 - since_ms - 1_000 < write["deadline_left_ms"] <= 600_000
    assert 0 <= write["age_ms"] <= since_ms + 1_000
    assert read["operation"] == "read"
    # Nothing was taken from the queue.
    assert redis.Redis.from_url(UNSERVED_REDIS_URL).llen("batch") == 2

    shown = _inspect(unserved, "queue", "batch", "--show-payload")
    assert shown.returncode == 0, shown.stderr
    assert "PAYLOAD-MARKER" in shown.stdout
    assert SECRET_ID in shown.stdout

    # Who cannot read the callers file sees no payload, and is told why.
    nobody = dataclasses.replace(unserved, callers_file=Path("/nonexistent/callers.yml"))
    refused = _inspect(nobody, "queue", "batch", "--show-payload")
    assert refused.returncode == 2
    assert "callers file" in refused.stderr
    assert "PAYLOAD-MARKER" not in refused.stdout + refused.stderr


def test_on_rabbitmq_the_waiting_messages_are_counted_and_none_taken(
    unserved: Settings, config: Config
) -> None:
    amqp = on_rabbitmq(unserved, config, "dataservice-inspect")
    client = Client("demo", amqp, config)
    try:
        client.submit(WriteOp("demo", SECRET_ID, MARKER), timeout=600)
        client.submit(ReadOp("demo", "plain"), timeout=600)
    finally:
        client.close()
    shown = _inspect(amqp, "queue", "batch", "--show-payload")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("batch: 2 waiting (RabbitMQ: counted, not shown;")
    assert "PAYLOAD-MARKER" not in shown.stdout + shown.stderr
    document = json.loads(_inspect(amqp, "queue", "batch", "--json").stdout)
    assert document == {"queue": "batch", "waiting": 2, "shown": []}
    assert depth(amqp, "batch") == 2


def test_a_records_cache_entries_are_shown_without_their_bodies(unserved: Settings) -> None:
    client = redis.Redis.from_url(UNSERVED_REDIS_URL)
    record = pb.Record(object_id="r1", revision=7, payload=MARKER)
    client.set(record_key("v1", "demo", "r1", 1), frame(7, CODECS[CacheFormat.V1].encode(record)))
    client.set(
        record_key("v2", "demo", "r1", 1),
        frame(7, CODECS[CacheFormat.V2].encode(record)),
        px=60_000,
    )
    client.set(tombstone_key("demo", "r1"), 7, px=30_000)
    shown = _inspect(unserved, "cache", "demo", "r1")
    assert shown.returncode == 0, shown.stderr
    for spelling in _spellings(MARKER):
        assert spelling not in shown.stdout
    document = json.loads(_inspect(unserved, "cache", "demo", "r1", "--json").stdout)
    by_key = {entry["key"]: entry for entry in document["entries"]}
    v1, v2 = by_key["record:v1:demo:r1#1"], by_key["record:v2:demo:r1#1"]
    assert (v1["revision"], v1["ttl_ms"]) == (7, None)
    assert v2["revision"] == 7
    assert 50_000 < v2["ttl_ms"] <= 60_000
    assert by_key["record:v2:demo:r1#2"]["revision"] is None
    tomb = by_key["record:tomb:demo:r1"]
    assert tomb["revision"] == 7
    assert 20_000 < tomb["ttl_ms"] <= 30_000
    bad = _inspect(unserved, "cache", "demo", "no spaces allowed")
    assert bad.returncode == 2
    client.close()


def test_an_unreachable_redis_or_rabbitmq_is_one_clear_line_and_exit_1(settings: Settings) -> None:
    nowhere = "redis://127.0.0.1:1/0"
    gone = dataclasses.replace(
        settings, broker_url=nowhere, result_backend_url=nowhere, redis_url=nowhere
    )
    no_rabbit = dataclasses.replace(gone, broker_url="amqp://guest:guest@127.0.0.1:1//")
    for where, args in ((gone, ("queue", "batch")), (gone, ("cache", "demo", "r1")),
                        (no_rabbit, ("queue", "batch"))):  # fmt: skip
        shown = _inspect(where, *args)
        assert shown.returncode == 1, shown
        assert shown.stderr.startswith("error: "), shown.stderr
        assert "Traceback" not in shown.stderr
