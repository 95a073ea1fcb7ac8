"""The cache keeps scopes apart, refuses before it looks, and leaves ``PRIMARY``
reads alone, against the in-process interactive worker (Redis db 15).

- The same object id in two scopes is two records, cached under two keys.
- A caller allowed only some scopes (``tests-narrow``: ``narrow-*``) who reads
  another scope is refused ``PERMISSION_DENIED`` before any cache lookup: the
  worker's lookup counter does not move and Redis sees no command on the
  refused scope's keys, although that record is warm in the cache.
- A ``PRIMARY`` read answers the database's record even when the cache holds
  another one at the record's key; an ``ALLOW_CACHED`` read answers that one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import Client, PermissionDenied
from dataservice.cache.controls import RolloutControls
from dataservice.cache.store import CacheStore
from dataservice.codec import record_to_pb
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import ReadMode
from dataservice.redis.keys import record_key
from tests.conftest import TEST_REDIS_URL
from tests.harness.livecache import (
    Statements,
    cache_keys,
    cache_lookups,
    cached,
    in_database,
    restore_defaults,
    touching,
)
from tests.harness.support import RedisWatch

OBJECT_ID = "shared:1"
NARROW = "tests-narrow"


@pytest.fixture
def rollout(
    interactive_worker: Any, redis_client: redis.Redis, config: Config
) -> Iterator[RolloutControls]:
    """queues.yml's rollout, acted on by the worker (an earlier test may have changed it)."""
    restore_defaults(redis_client, config)
    yield RolloutControls(redis_client, config.cache)
    restore_defaults(redis_client, config)


@pytest.fixture
def narrow(settings: Settings, config: Config) -> Iterator[Client]:
    """A caller allowed to read ``narrow-*`` scopes only."""
    with Client(NARROW, settings, config) as c:
        yield c


@pytest.fixture
def narrow_scope() -> str:
    return f"narrow-{uuid.uuid4().hex[:12]}"


def test_the_same_id_in_two_scopes_is_two_records_under_two_keys(
    rollout: RolloutControls,
    client: Client,
    redis_client: redis.Redis,
    database: Engine,
    scope: str,
    narrow_scope: str,
) -> None:
    current = rollout.current()
    payloads = {scope: b"in the first scope", narrow_scope: b"in the second scope"}
    for where, payload in payloads.items():
        client.write(where, OBJECT_ID, payload)
    statements = Statements(database)
    for _ in range(2):
        for where, payload in payloads.items():
            assert client.read(where, OBJECT_ID).payload == payload
    # The first read of each scope missed and read its own record; the second hit.
    assert statements.since() > 0
    for where in payloads:
        assert client.read(where, OBJECT_ID) == in_database(database, where, OBJECT_ID)
    assert statements.since() == 0

    for fmt in current.fill:
        keys = {record_key(fmt.value, where, OBJECT_ID, current.generation) for where in payloads}
        assert len(keys) == 2
        for where, payload in payloads.items():
            entry = cached(redis_client, fmt, where, OBJECT_ID, current.generation)
            assert entry is not None
            assert entry.payload == payload


def test_a_caller_refused_a_scope_is_refused_before_any_cache_lookup(
    rollout: RolloutControls,
    client: Client,
    narrow: Client,
    redis_client: redis.Redis,
    database: Engine,
    scope: str,
    narrow_scope: str,
) -> None:
    read_format = rollout.current().read
    assert read_format is not None
    for where in (scope, narrow_scope):
        client.write(where, OBJECT_ID, where.encode())
        client.read(where, OBJECT_ID)
    # Warm: the refused read would find this entry if it looked.
    assert cached(redis_client, read_format, scope, OBJECT_ID, rollout.current().generation)

    # The counter moves for a read the caller is allowed: it would show a lookup.
    lookups = cache_lookups()
    assert narrow.read(narrow_scope, OBJECT_ID).payload == narrow_scope.encode()
    # A hit is counted just after its answer went out: the caller may be first.
    eventually(lambda: cache_lookups() > lookups, timeout=2)
    assert cache_lookups() == lookups + 1

    statements = Statements(database)
    lookups = cache_lookups()
    watch = RedisWatch(TEST_REDIS_URL)
    try:
        with pytest.raises(PermissionDenied):
            narrow.read(scope, OBJECT_ID)
    finally:
        commands = watch.close()
    assert cache_lookups() == lookups
    assert statements.since() == 0
    touched = touching(commands, cache_keys(scope, OBJECT_ID, rollout.current().generation))
    assert touched == [], f"Redis saw the refused scope's cache keys: {touched}"
    assert any(b"ds:reply:" in c for c in commands), "the watch saw the refusal's answer"


def test_primary_reads_never_touch_the_cache(
    rollout: RolloutControls,
    client: Client,
    redis_client: redis.Redis,
    database: Engine,
    scope: str,
) -> None:
    current = rollout.current()
    read_format = current.read
    assert read_format is not None
    client.write(scope, OBJECT_ID, b"the database's")
    stored = in_database(database, scope, OBJECT_ID)
    planted = record_to_pb(stored)
    planted.payload = b"planted in the cache"
    # Redis's clock, as a leader's fill has it from its lock.
    seconds, micros = redis_client.time()
    fill = CacheStore(redis_client).fill(
        planted, {read_format}, scope, current.generation, seconds * 1000 + micros // 1000, 60_000
    )
    assert (fill.outcome, fill.written) == ("filled", 1)
    statements = Statements(database)

    watch = RedisWatch(TEST_REDIS_URL)
    try:
        assert client.read(scope, OBJECT_ID, mode=ReadMode.PRIMARY) == stored
    finally:
        commands = watch.close()
    assert statements.since() > 0
    assert touching(commands, cache_keys(scope, OBJECT_ID, current.generation)) == []

    cached_read = client.read(scope, OBJECT_ID, mode=ReadMode.ALLOW_CACHED)
    assert cached_read.payload == b"planted in the cache"
    assert (cached_read.revision, cached_read.updated_at) == (stored.revision, stored.updated_at)
    assert statements.since() == 0
    assert client.read(scope, OBJECT_ID, mode=ReadMode.PRIMARY).payload == b"the database's"
