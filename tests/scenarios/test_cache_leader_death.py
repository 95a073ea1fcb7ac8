"""Acceptance: a coalescing leader SIGKILLed while it holds the lock costs its
followers one takeover and the database one more read, never their answers.

Three interactive worker replicas share one cache Redis and database. Replica
A takes its requests from a broker of its own, which nobody else consumes (so
the test decides which replica leads), and each of its database operations
first sleeps ``LEADER_DELAY_MS`` (``database.injected_delay_ms``), so it is
still reading, holding the lock, when it is killed. B and C share the other
broker and read at full speed.

The leader's read goes to A's broker; once the lock (``ds:lock:<scope>:<id>``)
exists and B and C both wait for it, A gets SIGKILL. Its lease then lapses
(``cache.lock_lease_ms``), one follower takes the lock over, reads and fills,
and every follower gets the record within its deadline, which is longer than
the lease. The database counts the reads itself
(:mod:`dataservice_tools.testkit.counting_database`).
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.bursts import Outcome, burst
from dataservice_tools.testkit.counting_database import CountingDatabase
from dataservice_tools.testkit.replicas import Replicas, replicas, until_each_answers
from dataservice_tools.testkit.waits import eventually

from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.redis.keys import lock_key, lockwait_key
from tests.harness.support import scraped, with_changes, with_retry

LEADER_DELAY_MS = 3000
FOLLOWERS = 20
# Longer than the lease (1000 ms) plus a takeover's read, with room to spare.
FOLLOWER_TIMEOUT_S = 5.0
PAYLOAD = b"survives its leader" * 10
KEY = "contended"
WARM = "warm"


@pytest.fixture
def fleet(
    replica_settings: Settings, config: Config, tmp_path: Path
) -> Iterator[tuple[Settings, Replicas]]:
    """Three replicas on one cache; A, the leader-to-be, takes its requests
    from a broker of its own (a private Redis), so that only it serves the
    leader's read."""
    leader = with_changes(
        replica_settings,
        tmp_path / "leader.yml",
        {("database", "injected_delay_ms"): LEADER_DELAY_MS},
    )
    broker = PrivateRedis(tmp_path / "leader-broker")
    broker.start()
    try:
        leader = dataclasses.replace(leader, broker_url=broker.url)
        with replicas(replica_settings, config, tmp_path, 3, settings_of={0: leader}) as started:
            yield leader, started
    finally:
        broker.signal(signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.timeout(180)
def test_followers_of_a_killed_leader_get_the_record_through_exactly_one_takeover(
    fleet: tuple[Settings, Replicas],
    replica_settings: Settings,
    config: Config,
    counting_database: CountingDatabase,
) -> None:
    leader_settings, started = fleet
    a, b, c = started.workers
    _, *follower_ports = started.metrics_ports
    assert config.cache.lock_lease_ms < FOLLOWER_TIMEOUT_S * 1000
    assert config.cache.lock_lease_ms < LEADER_DELAY_MS
    one_attempt = with_retry(config, max_attempts=1)
    leader_config = with_retry(load_config(leader_settings.config_path), max_attempts=1)
    scope = f"t-{uuid.uuid4().hex[:12]}"
    counting_database.seed(scope, [KEY, WARM], PAYLOAD)
    until_each_answers(replica_settings, one_attempt, [b, c], "tests", scope, WARM)
    takeovers_before = _takeovers(follower_ports)
    cache = redis.Redis.from_url(replica_settings.redis_url)

    # The leader's read: only A consumes its broker. Nobody answers it (A dies).
    led: list[Outcome] = []
    leader_read = threading.Thread(
        target=lambda: led.extend(
            burst(leader_settings, leader_config, "tests", scope, [KEY], 1, FOLLOWER_TIMEOUT_S)
        )
    )
    followed: list[Outcome] = []
    followers = threading.Thread(
        target=lambda: followed.extend(
            burst(replica_settings, one_attempt, "tests", scope, [KEY] * FOLLOWERS, FOLLOWERS,
                  FOLLOWER_TIMEOUT_S)
        )
    )  # fmt: skip
    try:
        leader_read.start()
        eventually(
            lambda: cache.exists(lock_key(scope, KEY)),
            timeout=15,
            interval=0.002,
            message="A taking the lock",
        )
        token = cache.get(lock_key(scope, KEY))
        followers.start()
        # Both B and C wait for A (each replica waits once, for all its threads).
        eventually(
            lambda: int(cache.get(lockwait_key(scope, KEY)) or 0) >= 2,
            timeout=0.8,
            interval=0.002,
            message="B and C following",
        )
        reads_before_kill = counting_database.reads(scope, KEY)
        a.send_signal(signal.SIGKILL)
        # Still A's token after the kill: A held the lock when it died.
        assert cache.get(lock_key(scope, KEY)) == token
        followers.join(FOLLOWER_TIMEOUT_S + 30)
        leader_read.join(FOLLOWER_TIMEOUT_S + 30)
    finally:
        cache.close()
    assert a.wait(5) == -signal.SIGKILL

    assert len(followed) == FOLLOWERS
    errors = Counter(o.error for o in followed if o.error)
    assert not errors, f"followers without the record: {dict(errors)}"
    assert all(o.record is not None and o.record.payload == PAYLOAD for o in followed)
    assert max(o.latency_ms for o in followed) < FOLLOWER_TIMEOUT_S * 1000
    assert [o.record for o in led] == [None]

    # Exactly one read came after the kill: the takeover's. (A was still
    # sleeping in the database when it died, so it never read the record.)
    total = counting_database.reads(scope, KEY)
    assert total - reads_before_kill == 1
    assert total <= 2
    assert _takeovers(follower_ports) - takeovers_before == 1


def _takeovers(ports: list[int]) -> float:
    return sum(scraped(port, "dataservice_lock_takeovers", lane="interactive") for port in ports)
