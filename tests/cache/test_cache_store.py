"""The cache's scripts on the real Redis: fills that never go back in time,
the coalescing lock's protocol, and invalidation (``docs/cache.md``)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from dataservice.cache.formats import CODECS, frame
from dataservice.cache.store import CacheStore, Follow, Hit, Lead
from dataservice.enums import CacheFormat
from dataservice.proto import pb
from dataservice.redis.keys import record_key, tombstone_key

V1, V2 = CacheFormat.V1, CacheFormat.V2
BOTH = frozenset({V1, V2})
TTL_MS = 60_000


@pytest.fixture
def cache(redis_client: redis.Redis) -> CacheStore:
    return CacheStore(redis_client)


def record(object_id: str, revision: int, payload: bytes = b"p") -> pb.Record:
    return pb.Record(
        object_id=object_id, revision=revision, payload=payload, updated_at_unix_ms=1_700_000
    )


def lead(cache: CacheStore, scope: str, object_id: str, fmt: CacheFormat = V2) -> Lead:
    step = cache.lookup(fmt, scope, object_id, 1, lease_ms=5_000)
    assert isinstance(step, Lead)
    return step


def test_a_fill_writes_every_enabled_format_with_the_same_fields(
    cache: CacheStore, scope: str
) -> None:
    step = lead(cache, scope, "a")
    outcome = cache.fill(record("a", 3), BOTH, scope, 1, step.started_ms, TTL_MS, step.token)
    assert (outcome.outcome, outcome.written) == ("filled", 2)
    assert cache.get(V1, scope, "a", 1) == record("a", 3)
    assert cache.get(V2, scope, "a", 1) == record("a", 3)
    # Only in the generation it was filled in.
    assert cache.get(V2, scope, "a", 2) is None


def test_entries_expire_from_when_the_read_began_not_from_the_fill(
    cache: CacheStore, redis_client: redis.Redis, scope: str
) -> None:
    step = lead(cache, scope, "a")
    cache.fill(record("a", 1), {V2}, scope, 1, step.started_ms - 40_000, TTL_MS, step.token)
    left = redis_client.pttl(record_key("v2", scope, "a", 1))
    assert 0 < left <= TTL_MS - 40_000


def test_a_fill_that_arrives_after_the_expiry_is_dropped(cache: CacheStore, scope: str) -> None:
    step = lead(cache, scope, "a")
    outcome = cache.fill(
        record("a", 1), BOTH, scope, 1, step.started_ms - TTL_MS - 1, TTL_MS, step.token
    )
    assert (outcome.outcome, outcome.written) == ("late", 0)
    assert cache.get(V1, scope, "a", 1) is None
    assert cache.get(V2, scope, "a", 1) is None


def test_a_fill_never_overwrites_a_newer_revision(
    cache: CacheStore, redis_client: redis.Redis, scope: str
) -> None:
    older = lead(cache, scope, "a")  # reads revision 8 ...
    seconds, micros = redis_client.time()
    now = seconds * 1000 + micros // 1000
    cache.fill(record("a", 9), BOTH, scope, 1, now, TTL_MS)  # ... while 9 lands
    outcome = cache.fill(record("a", 8), BOTH, scope, 1, older.started_ms, TTL_MS, older.token)
    assert (outcome.outcome, outcome.written) == ("filled", 0)
    assert cache.get(V1, scope, "a", 1) == cache.get(V2, scope, "a", 1) == record("a", 9)


def test_freshness_race_an_older_fill_after_the_invalidation_never_lands(
    cache: CacheStore, scope: str
) -> None:
    """A reader reads revision 7; a writer commits 8 and its invalidation runs;
    then the reader's fill for 7 arrives: neither format ever holds 7."""
    reader = lead(cache, scope, "a")  # the reader's read of revision 7 begins
    read_by_reader = record("a", 7)
    cache.invalidate(scope, "a", 8, [1], TTL_MS)  # revision 8 committed, invalidated
    outcome = cache.fill(read_by_reader, BOTH, scope, 1, reader.started_ms, TTL_MS, reader.token)
    assert (outcome.outcome, outcome.written) == ("stale", 0)
    assert cache.get(V1, scope, "a", 1) is None
    assert cache.get(V2, scope, "a", 1) is None
    # The next leader reads revision 8, which lands.
    fresh = lead(cache, scope, "a")
    cache.fill(record("a", 8), BOTH, scope, 1, fresh.started_ms, TTL_MS, fresh.token)
    assert cache.get(V2, scope, "a", 1) == record("a", 8)


def test_a_delete_blocks_fills_of_the_deleted_revision(cache: CacheStore, scope: str) -> None:
    reader = lead(cache, scope, "a")
    cache.invalidate(scope, "a", 5 + 1, [1], TTL_MS)  # revision 5 deleted
    outcome = cache.fill(record("a", 5), BOTH, scope, 1, reader.started_ms, TTL_MS, reader.token)
    assert outcome.outcome == "stale"


def test_invalidation_drops_both_formats_in_every_generation_named(
    cache: CacheStore, redis_client: redis.Redis, scope: str
) -> None:
    for generation in (1, 2):
        step = cache.lookup(V2, scope, "a", generation, 5_000)
        assert isinstance(step, Lead)
        cache.fill(record("a", 1), BOTH, scope, generation, step.started_ms, TTL_MS, step.token)
    assert cache.invalidate(scope, "a", 2, [1, 2], TTL_MS) == 4
    assert not redis_client.exists(
        *(record_key(f, scope, "a", g) for f in ("v1", "v2") for g in (1, 2))
    )
    # A replayed older change never lowers the tombstone.
    cache.invalidate(scope, "a", 1, [1, 2], TTL_MS)
    assert redis_client.get(tombstone_key(scope, "a")) == b"2"


def test_one_leader_and_its_followers_get_its_record(cache: CacheStore, scope: str) -> None:
    leader = lead(cache, scope, "a")
    followers = [cache.lookup(V2, scope, "a", 1, 5_000) for _ in range(3)]
    assert all(isinstance(f, Follow) for f in followers)
    assert all(f.token == leader.token for f in followers if isinstance(f, Follow))
    words: list[object] = []

    def follow(step: Follow) -> None:
        words.append(cache.wait(scope, "a", step.token, 5.0))

    threads = [
        threading.Thread(target=follow, args=(f,)) for f in followers if isinstance(f, Follow)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    cache.fill(record("a", 4), BOTH, scope, 1, leader.started_ms, TTL_MS, leader.token)
    for thread in threads:
        thread.join(5)
    assert [getattr(w, "record", None) for w in words] == [record("a", 4)] * 3
    # The lock is gone: the next miss finds the entry.
    assert isinstance(cache.lookup(V2, scope, "a", 1, 5_000), Hit)


def test_followers_of_a_failed_or_empty_read_are_told_so(cache: CacheStore, scope: str) -> None:
    leader = lead(cache, scope, "a")
    follower = cache.lookup(V2, scope, "a", 1, 5_000)
    assert isinstance(follower, Follow)
    assert cache.release(scope, "a", leader.token, absent=True)
    word = cache.wait(scope, "a", follower.token, 1.0)
    assert word is not None
    assert word.absent
    leader = lead(cache, scope, "a")
    follower = cache.lookup(V2, scope, "a", 1, 5_000)
    assert isinstance(follower, Follow)
    cache.release(scope, "a", leader.token, absent=False)
    word = cache.wait(scope, "a", follower.token, 1.0)
    assert word is not None
    assert not word.absent
    assert word.record is None


def test_a_lapsed_lease_lets_one_follower_take_over_with_a_new_token(
    cache: CacheStore, scope: str
) -> None:
    first = cache.lookup(V2, scope, "a", 1, lease_ms=50)
    assert isinstance(first, Lead)
    follower = cache.lookup(V2, scope, "a", 1, 5_000)
    assert isinstance(follower, Follow)
    assert cache.wait(scope, "a", follower.token, (follower.lease_left_ms + 20) / 1000) is None
    second = cache.lookup(V2, scope, "a", 1, 5_000)
    third = cache.lookup(V2, scope, "a", 1, 5_000)
    assert isinstance(second, Lead)
    assert int(second.token) > int(first.token)
    assert isinstance(third, Follow)
    assert third.token == second.token
    # The old leader, waking up, can neither release nor notify under the new lock.
    assert not cache.release(scope, "a", first.token, absent=False)
    outcome = cache.fill(record("a", 1), BOTH, scope, 1, first.started_ms, TTL_MS, first.token)
    assert outcome.outcome == "filled"  # its record is as good as any: revisions decide
    word = cache.wait(scope, "a", third.token, 0.05)
    assert word is None  # only the new leader speaks to its followers


def test_an_entry_that_does_not_decode_is_a_miss(
    cache: CacheStore, redis_client: redis.Redis, scope: str
) -> None:
    redis_client.set(record_key("v2", scope, "a", 1), b"not an entry")
    assert cache.get(V2, scope, "a", 1) is None
    redis_client.set(record_key("v1", scope, "a", 1), frame(1, b"{not json"))
    assert cache.get(V1, scope, "a", 1) is None
    redis_client.set(record_key("v1", scope, "a", 1), frame(1, CODECS[V1].encode(record("a", 1))))
    assert cache.get(V1, scope, "a", 1) == record("a", 1)
