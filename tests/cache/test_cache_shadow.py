"""Shadow comparisons against a real worker (``docs/cache.md``, "Shadow comparisons").

One ``dataservice worker --lane interactive`` process on Redis db 7 with both
formats filled and v2 read. A cache entry corrupted behind the service's back
(the right revision, a wrong payload) is served, as the cache is trusted, and
the comparison counts the mismatch against the database and between the
formats. With the lane's one point-read permit held by a slow ``PRIMARY``
read, sampled hits are skipped and counted, and none of them runs later.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import redis_reachable
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine
from typer.testing import CliRunner

from dataservice import Client
from dataservice.cache.controls import RolloutControls
from dataservice.cache.formats import CODECS, frame
from dataservice.cache.shadow import read_counts
from dataservice.cli import app
from dataservice.codec import record_to_pb
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import CacheFormat, LaneName, ReadMode
from dataservice.redis.keys import SHADOW_KEY, record_key
from tests.conftest import SERVICE_USER, require
from tests.harness.livecache import in_database, restore_defaults, settle
from tests.harness.support import on_redis, running_statements, with_changes, worker_process

OWN_REDIS_URL = "redis://127.0.0.1:6379/7"
WHO = "shadow-test"
# One point-read permit, so that one slow read saturates the class; three
# threads, so that the consumer still takes hits while it runs.
QUICK: dict[tuple[str, ...], object] = {
    ("cache", "controls_max_age_ms"): 100,
    ("lanes", "interactive", "classes", "point_read"): 1,
    ("lanes", "interactive", "classes", "point_write"): 3,
    ("lanes", "interactive", "permits"): 3,
    ("lanes", "interactive", "concurrency"): 3,
}
SLOW_MS = 1500


def _worker(
    settings: Settings, tmp_path: Path, changes: dict[tuple[str, ...], object]
) -> Iterator[tuple[Settings, Config]]:
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    own = with_changes(on_redis(settings, OWN_REDIS_URL), tmp_path / "queues.yml", changes)
    config = own.load()
    broker = redis.Redis.from_url(OWN_REDIS_URL)
    broker.flushdb()
    try:
        with worker_process(own, config, LaneName.INTERACTIVE, tmp_path / "worker.log"):
            yield own, config
    finally:
        broker.flushdb()
        broker.close()


@pytest.fixture
def worker(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, Config]]:
    yield from _worker(settings, tmp_path, QUICK)


@pytest.fixture
def slow_worker(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, Config]]:
    yield from _worker(settings, tmp_path, {**QUICK, ("database", "injected_delay_ms"): SLOW_MS})


def _counts_settled(cache: redis.Redis, expected: int) -> dict[str, int]:
    """The counts once ``expected`` comparisons (all outcomes) are in, and a flush later."""
    eventually(
        lambda: (
            sum(v for k, v in read_counts(cache).items() if ":" in k and k != "database:ms")
            >= expected
        ),
        timeout=10.0,
        interval=0.002,
        message=f"{expected} comparisons counted",
    )
    time.sleep(1.2)
    return read_counts(cache)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_corrupted_entry_is_served_and_its_mismatch_counted_against_both(
    worker: tuple[Settings, Config], database: Engine, scope: str
) -> None:
    settings, config = worker
    with (
        redis.Redis.from_url(settings.redis_url) as cache,
        Client("tests", settings, config) as client,
    ):
        controls = RolloutControls(cache, config.cache)
        try:
            controls.change(WHO, fill=frozenset(CacheFormat), read=CacheFormat.V2)
            changed = controls.change(WHO, shadow=100)
            assert (changed.before.shadow, changed.after.shadow) == (0, 100)
            settle(config)
            client.write(scope, "good", b"as written")
            client.write(scope, "bad", b"as written")
            for object_id in ("good", "bad"):
                client.read(scope, object_id)  # a miss: fills both formats
            assert client.read(scope, "good").payload == b"as written"  # a hit, compared
            before = _counts_settled(cache, 2)
            assert before.get("database:match") == 1, before
            assert before.get("formats:match") == 1, before

            # Behind the service's back: v2's entry of "bad", its revision kept.
            record = record_to_pb(in_database(database, scope, "bad"))
            record.payload = b"corrupted"
            key = record_key(CacheFormat.V2.value, scope, "bad", 1)
            cache.set(key, frame(record.revision, CODECS[CacheFormat.V2].encode(record)))
            # The cache is trusted: the wrong payload is what the caller gets.
            assert client.read(scope, "bad").payload == b"corrupted"
            after = _counts_settled(cache, 4)
        finally:
            restore_defaults(cache, config)
            cache.delete(SHADOW_KEY)
    assert after.get("database:payload") == 1, after
    assert after.get("formats:payload") == 1, after
    assert after.get("database:match") == 1, after
    assert after["database:ms"] >= 0
    status = CliRunner().invoke(app, ["cache", "status", "--json"], env=settings.to_env())
    # The counts were read before the controls were restored, which cleared them;
    # status reads the hash as it is now.
    assert status.exit_code == 0, status.output


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_with_the_permits_saturated_comparisons_are_skipped_and_counted_never_queued(
    slow_worker: tuple[Settings, Config], database: Engine, scope: str
) -> None:
    settings, config = slow_worker
    hits = 20
    with (
        redis.Redis.from_url(settings.redis_url) as cache,
        Client("tests", settings, config) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        controls = RolloutControls(cache, config.cache)
        try:
            client.write(scope, "warm", b"cached", timeout=10)
            client.read(scope, "warm", timeout=10)  # a miss: fills v2
            client.write(scope, "slow", b"held", timeout=10)
            controls.change(WHO, shadow=100)
            settle(config)
            # The lane's only point-read permit, held for SLOW_MS.
            slow = pool.submit(client.read, scope, "slow", mode=ReadMode.PRIMARY, timeout=10)
            eventually(
                lambda: running_statements(database, SERVICE_USER),
                timeout=10.0,
                interval=0.002,
                message="the slow read running",
            )
            for _ in range(hits):
                assert client.read(scope, "warm").payload == b"cached"
            assert slow.result(10).payload == b"held"
            # A comparison queued behind the permit would now read (SLOW_MS, as
            # every read here) and be counted within a flush.
            time.sleep(SLOW_MS / 1000 + 1.5)
            counts = read_counts(cache)
        finally:
            restore_defaults(cache, config)
            cache.delete(SHADOW_KEY)
    skipped = counts.get("database:skipped_permits", 0) + counts.get("database:skipped_busy", 0)
    assert skipped == hits, counts
    assert counts.get("database:skipped_permits", 0) >= 1, counts
    # No comparison read the database, then or later: no outcome, no time.
    assert {k for k in counts if k.startswith("database:") and "skipped" not in k} == set(), counts


def test_status_shows_the_shadow_control_and_its_counts(
    worker: tuple[Settings, Config],
) -> None:
    settings, config = worker
    with redis.Redis.from_url(settings.redis_url) as cache:
        try:
            RolloutControls(cache, config.cache).change(WHO, shadow=10)
            cache.hset(SHADOW_KEY, mapping={"database:match": 7, "database:payload": 1})
            shown = CliRunner().invoke(app, ["cache", "status", "--json"], env=settings.to_env())
            text = CliRunner().invoke(app, ["cache", "status"], env=settings.to_env())
        finally:
            restore_defaults(cache, config)
            cache.delete(SHADOW_KEY)
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    assert document["controls"]["shadow"] == 10
    assert document["shadow"]["counts"] == {"database:match": 7, "database:payload": 1}
    assert "shadow comparisons (10 % of hits" in text.output, text.output
    assert "database: 8 compared, 7 matched, 1 mismatch (1 payload)" in text.output, text.output
