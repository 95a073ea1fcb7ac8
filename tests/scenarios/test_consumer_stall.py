"""A worker's consumer thread never waits long on Redis: with its result
Redis stalled while it answers refusals there, it still answers ``inspect
ping`` and keeps touching its alive file. A real worker process; the stall is
a proxy in front of the result Redis that stops forwarding."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import redis_reachable

from dataservice.broker.celery import celery_app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.proto import pb
from dataservice.security.callers import CallerKey, Secret
from tests.conftest import require
from tests.harness.support import (
    RawPublisher,
    StallingProxy,
    caller_key,
    now_ms,
    on_redis,
    signed,
    worker_process,
)

pytestmark = pytest.mark.fault

OWN_REDIS_URL = "redis://127.0.0.1:6379/10"
STALLED_S = 6.0


@pytest.fixture
def stalled_results(settings: Settings) -> Iterator[tuple[Settings, StallingProxy]]:
    """Settings whose result backend is the same Redis database reached
    through a proxy (answers and admission's counts stay where they belong)."""
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    own = redis.Redis.from_url(OWN_REDIS_URL)
    own.flushdb()
    proxy = StallingProxy(6379)
    through = f"redis://127.0.0.1:{proxy.port}/10"
    try:
        yield (
            dataclasses.replace(on_redis(settings, OWN_REDIS_URL), result_backend_url=through),
            proxy,
        )
    finally:
        proxy.close()
        own.flushdb()
        own.close()


@pytest.mark.timeout(90)
def test_a_stalled_result_redis_holds_neither_ping_nor_the_alive_file(
    stalled_results: tuple[Settings, StallingProxy], config: Config, tmp_path: Path
) -> None:
    settings, proxy = stalled_results
    alive = tmp_path / "alive"
    log = tmp_path / "worker.log"
    wrong = CallerKey("tests", caller_key(settings).key_id, Secret(b"\x02" * 32))
    with worker_process(
        settings, config, LaneName.INTERACTIVE, log, "--alive-file", str(alive)
    ) as (worker, _):
        control = celery_app("test-control", settings, config)
        publisher = RawPublisher(settings, config)
        try:
            assert control.control.ping(timeout=2.0)
            proxy.stall()
            # Refusals, each answered on the consumer thread, into the stall.
            for _ in range(6):
                envelope = pb.RequestEnvelope(
                    caller="tests",
                    request_id=uuid.uuid4().hex,
                    deadline_unix_ms=now_ms() + 20_000,
                    read=pb.ReadRecordRequest(scope="s", object_id="o", mode=pb.READ_MODE_PRIMARY),
                )
                publisher.publish(signed(envelope, wrong), envelope.request_id, now_ms() + 20_000)
            pings = []
            touched = []
            until = time.monotonic() + STALLED_S
            while time.monotonic() < until:
                started = time.monotonic()
                pings.append((control.control.ping(timeout=2.0), time.monotonic() - started))
                touched.append(time.time() - alive.stat().st_mtime)
                time.sleep(0.5)
            proxy.resume()
        finally:
            publisher.close()
            control.close()
    # Every ping answered while the result Redis stood still, and the loop
    # kept touching its alive file (every second).
    assert all(replies for replies, _ in pings), pings
    assert max(touched) < 3.0, touched
    worker.check_alive()
