"""Coalescing across replicas on the real Redis, each replica's database read
an injected function: a follower never reads the database itself, and one
whose deadline comes first answers a retryable refusal (``docs/cache.md``,
"A read", step 7)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from dataservice.cache.breaker import Breaker, Guard
from dataservice.cache.controls import RolloutControls
from dataservice.cache.replicas import ReplicaCoalescing
from dataservice.cache.store import CacheStore
from dataservice.config.model import Config
from dataservice.enums import CacheFormat
from dataservice.handler.failures import CoalescedWaitExpired, verdict
from dataservice.handler.source import Found
from dataservice.proto import pb
from tests.harness.support import now_ms


class Database:
    """One replica's database: counts its reads; the first waits for a release."""

    def __init__(self, hold: bool = False) -> None:
        self.reads = 0
        self.reading = threading.Event()
        self.release = threading.Event()
        if not hold:
            self.release.set()

    def __call__(self, scope: str, object_id: str, deadline_ms: int) -> pb.Record:
        self.reads += 1
        self.reading.set()
        assert self.release.wait(5)
        return pb.Record(object_id=object_id, revision=7, payload=b"from the database")


def replica(config: Config, redis_client: redis.Redis, database: Database) -> ReplicaCoalescing:
    guard = Guard(Breaker(config.cache.breaker), lambda exc: None)
    controls = RolloutControls(redis_client, config.cache)

    def bulk(keys: Sequence[tuple[str, str]], deadline_ms: int) -> Found:
        return {key: database(*key, deadline_ms) for key in keys}

    return ReplicaCoalescing(
        CacheStore(redis_client), guard, controls, database, bulk, config.cache, "interactive"
    )


def test_a_follower_whose_deadline_comes_first_answers_retryable_without_reading(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    leader_db, follower_db = Database(hold=True), Database()
    leader = replica(config, redis_client, leader_db)
    follower = replica(config, redis_client, follower_db)
    with ThreadPoolExecutor(3) as pool:
        led = pool.submit(leader.read, scope, "k", CacheFormat.V2, now_ms() + 5_000)
        assert leader_db.reading.wait(5)
        started = time.monotonic()
        with pytest.raises(CoalescedWaitExpired) as expired:
            follower.read(scope, "k", CacheFormat.V2, now_ms() + 300)
        waited = time.monotonic() - started
        patient = pool.submit(follower.read, scope, "k", CacheFormat.V2, now_ms() + 5_000)
        time.sleep(0.1)
        leader_db.release.set()
        assert led.result().payload == b"from the database"
        assert patient.result().payload == b"from the database"
    assert 0.25 <= waited < 1.0
    assert follower_db.reads == 0
    assert leader_db.reads == 1
    answer = verdict(expired.value)
    assert answer.code.retryable
    assert answer.retry_after_ms > 0


def test_a_failed_leader_tells_its_followers_and_one_of_them_reads(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    class Failing(Database):
        def __call__(self, scope: str, object_id: str, deadline_ms: int) -> pb.Record:
            self.reads += 1
            self.reading.set()
            self.release.wait(5)
            raise RuntimeError("database gone")

    leader_db, follower_db = Failing(hold=True), Database()
    leader = replica(config, redis_client, leader_db)
    follower = replica(config, redis_client, follower_db)
    with ThreadPoolExecutor(2) as pool:
        led = pool.submit(leader.read, scope, "k", CacheFormat.V2, now_ms() + 5_000)
        assert leader_db.reading.wait(5)
        followed = pool.submit(follower.read, scope, "k", CacheFormat.V2, now_ms() + 5_000)
        time.sleep(0.1)
        started = time.monotonic()
        leader_db.release.set()
        with pytest.raises(RuntimeError):
            led.result()
        assert followed.result().payload == b"from the database"
    # Told at once ('retry'), not after the leader's lease.
    assert time.monotonic() - started < config.cache.lock_lease_ms / 1000
    assert follower_db.reads == 1
