"""Acceptance: a request that waited out its deadline in the queue does no
database work and leaves no answer behind; a client retries a retryable
answer a bounded number of times, with jitter, and never past its deadline.

Both use real workers started here, on a Redis database of their own, after
the requests were queued (the first) or pointing at a database that refuses
connections (the second).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from sqlalchemy import Engine

from dataservice import Client, ReadMode, Unavailable
from dataservice.config import Config, LaneName, Settings
from dataservice.keys import REPLAY_PREFIX, result_key
from dataservice.localservices import redis_reachable
from dataservice.types import ReadOp
from dataservice.wire import celery_settings
from tests.conftest import SERVICE_USER, require
from tests.support import RedisWatch, counter, on_redis, statements_by
from workers.app import LaneRuntime, register_task

OWN_REDIS_URL = "redis://127.0.0.1:6379/10"
# Nothing listens here: every connection attempt is refused at once.
REFUSING_DATABASE_URL = "mysql+mysqldb://ds_test:ds-test-pw@127.0.0.1:1/dataservice_test"


@pytest.fixture
def own_redis(settings: Settings) -> Iterator[tuple[Settings, redis.Redis]]:
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(OWN_REDIS_URL)
    client.flushdb()
    yield on_redis(settings, OWN_REDIS_URL), client
    client.flushdb()
    client.close()


@contextmanager
def lane_worker(settings: Settings, config: Config, lane: LaneName) -> Iterator[LaneRuntime]:
    """A real Celery worker (threads pool) serving ``lane`` in this process."""
    app = Celery("deadline-tests", set_as_current=False)
    app.conf.update(celery_settings(settings, config))
    runtime = LaneRuntime(settings, config, lane)
    register_task(app, runtime)
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=2,
            perform_ping_check=False,
            queues=[config.lanes[lane].queue],
            shutdown_timeout=10,
        ):
            yield runtime
    finally:
        runtime.close()


@pytest.mark.timeout(60)
def test_a_request_late_by_the_time_it_is_dequeued_does_no_database_work(
    own_redis: tuple[Settings, redis.Redis], config: Config, database: Engine, scope: str
) -> None:
    settings, broker = own_redis
    grace_s = config.results.grace_ms / 1000
    with Client("tests", settings, config) as client:
        handle = client.submit(ReadOp(scope, "a", ReadMode.PRIMARY), timeout=0.5)
    queue = config.lanes.batch.queue
    assert broker.llen(queue) == 1
    # No worker yet: the request waits out its deadline, and the grace, in the queue.
    time.sleep((handle.deadline_ms / 1000 - time.time()) + grace_s + 0.2)

    statements = statements_by(database, SERVICE_USER)
    late = counter("dataservice_timeouts", lane="batch", stage="queue")
    with lane_worker(settings, config, LaneName.BATCH):
        until = time.monotonic() + 10
        while counter("dataservice_timeouts", lane="batch", stage="queue") == late:
            assert time.monotonic() < until, "the worker never took the message"
            time.sleep(0.01)
    assert broker.llen(queue) == 0
    assert statements_by(database, SERVICE_USER) == statements
    assert not broker.exists(result_key("tests", handle.request_id))
    # Nor was its id even remembered: it was dropped before the limits.
    assert not broker.keys(f"{REPLAY_PREFIX}*")


@pytest.mark.timeout(60)
def test_retries_are_bounded_jittered_and_stop_at_the_deadline(
    own_redis: tuple[Settings, redis.Redis], config: Config, database: Engine, scope: str
) -> None:
    settings, broker = own_redis
    unreachable_db = dataclasses.replace(settings, database_url=REFUSING_DATABASE_URL)
    retry = config.client.retry.model_copy(update={"max_attempts": 4})
    client_config = config.model_copy(
        update={"client": config.client.model_copy(update={"retry": retry})}
    )
    with (
        lane_worker(unreachable_db, config, LaneName.INTERACTIVE),
        Client("tests", settings, client_config) as client,
    ):
        # Plenty of time: the attempts run out first.
        started = time.monotonic()
        watch = RedisWatch(OWN_REDIS_URL)
        try:
            with pytest.raises(Unavailable) as caught:
                client.read(scope, "a", mode=ReadMode.PRIMARY, timeout=20)
        finally:
            watch.close()
        markers = sorted(broker.scan_iter(f"{REPLAY_PREFIX}tests:*"))
        assert len(markers) == 4, "one message per attempt, and no more than configured"
        # When each attempt was published (the admission script pushing it).
        queue = config.lanes.interactive.queue.encode()
        published = [
            at
            for at, command in zip(watch.times, watch.commands, strict=True)
            if command.startswith((b"EVAL", b"EVALSHA"))
            and f" {queue.decode()} ".encode() in command
        ]
        assert len(published) == 4, published
        gaps = [b - a for a, b in itertools.pairwise(published)]
        # Each wait is at least the retry-after the worker sent, plus a random share.
        assert all(gap >= caught.value.retry_after for gap in gaps), gaps
        assert len({round(g, 3) for g in gaps}) == len(gaps), gaps
        assert time.monotonic() - started < 10

        # Little time: the deadline runs out first, whatever the attempts allow.
        broker.delete(*markers)
        many = retry.model_copy(update={"max_attempts": 20})
        patient = client_config.model_copy(
            update={"client": client_config.client.model_copy(update={"retry": many})}
        )
        with Client("tests", settings, patient) as bounded:
            started = time.monotonic()
            with pytest.raises(Unavailable):
                bounded.read(scope, "a", mode=ReadMode.PRIMARY, timeout=0.6)
            elapsed = time.monotonic() - started
        assert elapsed < 0.6 + 0.3, elapsed
        assert 1 <= len(list(broker.scan_iter(f"{REPLAY_PREFIX}tests:*"))) < 20
    assert counter("dataservice_dependency_failures", lane="interactive", dependency="database") > 0
