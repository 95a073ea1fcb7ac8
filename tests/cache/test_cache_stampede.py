"""Acceptance: a stampede on one cold key reaches the database at most twice.

Three interactive worker replicas (``dataservice worker --lane interactive``
processes) share one broker, one cache Redis and one database. 500
``ALLOW_CACHED`` reads of a record nobody has read are released together, from
500 caller threads, and each makes one attempt. The database itself counts
the reads of that record (its general log:
:mod:`dataservice_tools.testkit.counting_database`); the service's own
counters only show that the burst really did find the key cold on every
replica.

Every database operation of these replicas first sleeps ``READ_DELAY_MS``
(``database.injected_delay_ms``). Without it the first fill lands a
millisecond or two into the burst and nearly every read is an ordinary hit:
with coalescing off (``cache.coalesce: false``) the key was then read once or
twice, which a test cannot tell from coalescing; with the delay, 21 times (one
per worker thread). The delay stays well inside the lock's lease, so no
follower has cause to take over: the test gives the lock a lease of
``LOCK_LEASE_MS``, so that a machine busy with other work does not stretch the
leader's read past it.

Nothing here depends on where a hit is answered (the consumer thread's fast
path or the pool): the count is the database's, and the service's miss
counter only has to show that each replica found the key cold.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.testkit.bursts import burst, sent_before_first_answer
from dataservice_tools.testkit.counting_database import CountingDatabase
from dataservice_tools.testkit.replicas import Replicas, replicas, until_each_answers

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.redis.keys import lock_key, record_key
from tests.harness.support import scraped, with_changes, with_retry

REPLICAS = 3
READS = 500
MAX_DATABASE_READS = 2
# Long enough that a busy machine has sent a tenth of the burst before the
# first answer (49 of 500 were on their way within 300 ms in one CI run).
READ_DELAY_MS = 600
LOCK_LEASE_MS = 5000
# Generous: the burst drains in a second or two; nobody should run out of time.
TIMEOUT_S = 30.0
PAYLOAD = bytes(range(256)) * 4
HOT = "hot"
# Read by the warm-up only, never by the burst.
WARM = "warm"


@pytest.fixture
def fleet(
    replica_settings: Settings, config: Config, tmp_path: Path
) -> Iterator[tuple[Settings, Replicas]]:
    slow = with_changes(
        replica_settings,
        tmp_path / "queues.yml",
        {
            ("database", "injected_delay_ms"): READ_DELAY_MS,
            ("cache", "lock_lease_ms"): LOCK_LEASE_MS,
        },
    )
    with replicas(slow, config, tmp_path, REPLICAS) as started:
        yield slow, started


def without_target_wait(config: Config) -> Config:
    """The burst stands in the queue while the leader reads: admission's
    standing-queue target, which knows the warm-up's uncached reads and nothing
    of the hits the burst will be, would refuse part of it (an overload test's
    matter, not this one's)."""
    lane = config.lanes.interactive
    admission = lane.admission.model_copy(update={"target_wait_ms": None})
    lanes = config.lanes.model_copy(
        update={"interactive": lane.model_copy(update={"admission": admission})}
    )
    return config.model_copy(update={"lanes": lanes})


def _cold(client: redis.Redis, config: Config, scope: str) -> bool:
    keys = [record_key(fmt.value, scope, HOT, 1) for fmt in config.cache.rollout.fill]
    return not client.exists(*keys, lock_key(scope, HOT))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_500_concurrent_cached_reads_of_a_cold_key_read_the_database_at_most_twice(
    fleet: tuple[Settings, Replicas], config: Config, counting_database: CountingDatabase
) -> None:
    settings, started = fleet
    one_attempt = without_target_wait(with_retry(config, max_attempts=1))
    scope = f"t-{uuid.uuid4().hex[:12]}"
    counting_database.seed(scope, [HOT, WARM], PAYLOAD)

    # Every replica serves reads before the burst; and every one of those
    # reads went to the database, so the count sees each read it should.
    answered = until_each_answers(
        settings, one_attempt, started.workers, "tests", scope, WARM, timeout_s=90
    )
    assert answered > 0
    assert counting_database.reads(scope, WARM) == answered
    assert counting_database.reads(scope, HOT) == 0
    cache = redis.Redis.from_url(settings.redis_url)
    try:
        assert _cold(cache, config, scope)
    finally:
        cache.close()
    misses_before = [_misses(port) for port in started.metrics_ports]

    outcomes = burst(settings, one_attempt, "tests", scope, [HOT] * READS, READS, TIMEOUT_S)

    assert len(outcomes) == READS
    errors = Counter(o.error for o in outcomes if o.error)
    assert not errors, f"reads that did not return the record: {dict(errors)}"
    assert all(
        o.record is not None and (o.record.revision, o.record.payload) == (1, PAYLOAD)
        for o in outcomes
    )
    assert max(o.latency_ms for o in outcomes) < TIMEOUT_S * 1000
    # The burst was concurrent: reads were on their way before any answer (at
    # least a tenth of them, however slowly a busy machine starts 500
    # threads), and each replica had reads that found the key cold.
    assert sent_before_first_answer(outcomes) >= READS // 10
    ports = started.metrics_ports
    misses = [_misses(port) - before for port, before in zip(ports, misses_before, strict=True)]
    assert all(m > 0 for m in misses), misses
    assert sum(misses) >= 10, misses

    reads = counting_database.reads(scope, HOT)
    assert 1 <= reads <= MAX_DATABASE_READS, f"{reads} database reads of the key"


def _misses(port: int) -> float:
    return scraped(port, "dataservice_cache_reads", lane="interactive", format="v2", outcome="miss")
