"""Acceptance: a request that waited out its deadline in the queue does no
database work and leaves no answer behind; a client retries a retryable
answer a bounded number of times, with jitter, and never past its deadline.

Both use real worker processes started here, on a Redis database of their own
(and, on RabbitMQ, a virtual host of their own), after the requests were
queued (the first) or pointing at a database that refuses connections (the
second). Each runs on both brokers.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import redis_reachable
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import Client, DeadlineExceeded, ReadMode, RetryableError, Unavailable
from dataservice.broker.library import PUBLISH
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.limits.admission import ADMIT
from dataservice.redis.keys import REPLAY_PREFIX, result_key
from dataservice.types import ReadOp
from tests.conftest import SERVICE_USER, require
from tests.harness.clients import ClientKind, make_client
from tests.harness.rabbit import BROKERS, depth, on_rabbitmq
from tests.harness.support import (
    RedisWatch,
    now_ms,
    on_redis,
    scraped,
    statements_by,
    with_retry,
    worker_process,
)

OWN_REDIS_URL = "redis://127.0.0.1:6379/10"
# Nothing listens here: every connection attempt is refused at once.
REFUSING_DATABASE_URL = "mysql+mysqldb://ds_test:ds-test-pw@127.0.0.1:1/dataservice_test"


@pytest.fixture(params=BROKERS)
def own_redis(
    request: pytest.FixtureRequest, settings: Settings, config: Config
) -> Iterator[tuple[Settings, redis.Redis]]:
    """Settings on a Redis database of their own, the broker each in turn;
    and that Redis (the answers, the limits and admission's books)."""
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(OWN_REDIS_URL)
    client.flushdb()
    own = on_redis(settings, OWN_REDIS_URL)
    if request.param == "amqp":
        own = on_rabbitmq(own, config, "dataservice-deadlines")
    yield own, client
    client.flushdb()
    client.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_request_late_by_the_time_it_is_dequeued_does_no_database_work(
    own_redis: tuple[Settings, redis.Redis],
    config: Config,
    database: Engine,
    scope: str,
    tmp_path: Path,
) -> None:
    settings, broker = own_redis
    grace_s = config.results.grace_ms / 1000
    with Client("tests", settings, config) as client:
        handle = client.submit(ReadOp(scope, "a", ReadMode.PRIMARY), timeout=0.5)
    queue = config.lanes.batch.queue
    assert depth(settings, queue) == 1
    # No worker yet: the request waits out its deadline, and the grace, in the queue.
    eventually(lambda: now_ms() > handle.deadline_ms + config.results.grace_ms,
               timeout=0.5 + grace_s + 5, interval=0.05,
               message="the deadline and the grace to pass")  # fmt: skip

    statements = statements_by(database, SERVICE_USER)
    with worker_process(settings, config, LaneName.BATCH, tmp_path / "batch.log") as (_, port):
        if settings.broker_is_amqp:
            # The message expired at its deadline: RabbitMQ drops it unseen.
            eventually(lambda: not depth(settings, queue), timeout=10, interval=0.05,
                       message="RabbitMQ to drop the message")  # fmt: skip
        else:
            eventually(
                lambda: scraped(port, "dataservice_timeouts", lane="batch", stage="queue") != 0,
                timeout=10, interval=0.05, message="the worker to take the message",
            )  # fmt: skip
    assert depth(settings, queue) == 0
    assert statements_by(database, SERVICE_USER) == statements
    assert not broker.exists(result_key("tests", handle.request_id))
    # Nor was its id even remembered: it was dropped before the limits.
    assert not broker.keys(f"{REPLAY_PREFIX}*")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_retries_are_bounded_jittered_and_stop_at_the_deadline(
    client_kind: ClientKind,
    own_redis: tuple[Settings, redis.Redis],
    config: Config,
    database: Engine,
    scope: str,
    tmp_path: Path,
) -> None:
    settings, broker = own_redis
    unreachable_db = dataclasses.replace(settings, database_url=REFUSING_DATABASE_URL)
    client_config = with_retry(config, max_attempts=4)
    log = tmp_path / "interactive.log"
    with (
        worker_process(unreachable_db, config, LaneName.INTERACTIVE, log) as (_, port),
        make_client(client_kind, "tests", settings, client_config) as client,
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
        # When each attempt was published: on Redis the publish interface's
        # calls on the interactive lane; on RabbitMQ the admission script's
        # runs (by digest, or by text where the server did not hold it yet)
        # that name the lane's queue.
        publish = f"FCALL {PUBLISH} 0 {LaneName.INTERACTIVE.value} ".encode()
        admit = (f"EVALSHA {ADMIT.sha} ".encode(), f"EVAL {ADMIT.text[:40]}".encode())
        queue = f" {config.lanes.interactive.queue} ".encode()
        published = [
            at
            for at, command in zip(watch.times, watch.commands, strict=True)
            if command.startswith(publish) or (command.startswith(admit) and queue in command)
        ]
        assert len(published) == 4, published
        gaps = [b - a for a, b in itertools.pairwise(published)]
        # Each wait is at least the retry-after the worker sent, plus a random share.
        assert all(gap >= caught.value.retry_after for gap in gaps), gaps
        # Jittered: the waits differ (two of three once matched to the
        # millisecond, which a random share can do; all three hardly can).
        assert max(gaps) - min(gaps) > 0.001, gaps
        assert time.monotonic() - started < 10

        # Little time: the deadline runs out first, whatever the attempts allow.
        broker.delete(*markers)
        patient = with_retry(config, max_attempts=20)
        with make_client(client_kind, "tests", settings, patient) as bounded:
            started = time.monotonic()
            # It ends at the deadline with whatever the last attempt met: a
            # retryable answer (the database's UNAVAILABLE, admission judging the
            # queue too slow), or no answer before the deadline.
            with pytest.raises((RetryableError, DeadlineExceeded)):
                bounded.read(scope, "a", mode=ReadMode.PRIMARY, timeout=0.6)
            elapsed = time.monotonic() - started
        assert elapsed < 0.6 + 0.3, elapsed
        assert 1 <= len(list(broker.scan_iter(f"{REPLAY_PREFIX}tests:*"))) < 20
        failures = scraped(
            port, "dataservice_dependency_failures", lane="interactive", dependency="database"
        )
        assert failures > 0
