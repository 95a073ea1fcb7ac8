"""The change stream under faults (``docs/changes.md``): consumers SIGKILLed at
random points during random writes, binlog rotations and database restarts
mid-stream, DDL and unrelated tables, and the consumer's Redis restarting. Each
ends by checking the cache against the database: no entry older than its
record, every tombstone at its record's last change."""

from __future__ import annotations

import random
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import PrivateMariaDB
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from dataservice.cache.controls import RolloutControls
from dataservice.changes.checkpoint import Checkpoints
from dataservice.changes.stream import Position
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.redis.keys import CHANGES_FENCE_KEY
from tests.conftest import SHIPPED_CONFIG
from tests.harness import changes as changes_harness
from tests.harness import changes_faults
from tests.harness.changes import (
    CHANGES_REDIS_URL,
    cached,
    change,
    holder,
    plant,
    running_consumer,
    tomb,
    upsert,
    with_changes_config,
)
from tests.harness.changes_faults import (
    INSERT,
    WRITERS,
    WRITES,
    Consumers,
    OwnRedis,
    Writes,
    stale_entries,
)
from tests.harness.support import with_changes

pytestmark = pytest.mark.fault

binlog_url = changes_harness.binlog_url
cache_redis = changes_harness.cache_redis
restartable_mariadb = changes_faults.restartable_mariadb
own_redis = changes_faults.own_redis

KILLS = 20
# Short, so that 20 takeovers fit in the writes (the shipped lease is 3 s).
LEASE_MS = 1_000


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_consumers_sigkilled_at_random_points_leave_no_entry_older_than_the_database(
    binlog_url: str, cache_redis: redis.Redis, config: Config, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    short = {("changes", "lease_ms"): LEASE_MS, ("changes", "reconnect_max_s"): 1}
    settings = with_changes(Settings(config_path=SHIPPED_CONFIG), tmp_path / "q.yml", short)
    engine = create_engine(binlog_url, pool_size=WRITERS + 2)
    scope = f"t-{uuid.uuid4().hex[:10]}"
    consumers = Consumers(binlog_url, settings.config_path, tmp_path, 2)
    try:
        # The first one active may rotate the generation (no saved position yet).
        eventually(lambda: consumers.active(cache_redis) is not None, timeout=30)
        first_token = holder(cache_redis)
        generation = RolloutControls(cache_redis, config.cache).fetch().generation
        kills = sorted(rng.sample(range(50, WRITES - 50), KILLS))
        # A group of ids changes for the last time around each kill (up to
        # about a second after), where the killed consumer may not have
        # applied or saved the changes, or none is active yet.
        retire_at = [at + rng.randrange(60) for at in kills]
        writes = Writes(engine, cache_redis, scope, generation, retire_at)
        with engine.begin() as conn:
            conn.execute(INSERT, [{"s": scope, "o": o, "r": 1} for o in writes.ids])
        began, active_kills = time.monotonic(), 0
        with ThreadPoolExecutor(WRITERS + 1) as pool:
            writers = [pool.submit(writes.write, w, rng.random()) for w in range(WRITERS)]
            filler = pool.submit(writes.fill, rng.random(), config.cache.ttl_s * 1000)
            try:
                for at in kills:
                    eventually(
                        lambda at=at: writes.done >= at or any(w.done() for w in writers),
                        timeout=120,
                    )
                    slot = consumers.active(cache_redis)
                    active_kills += slot is not None
                    consumers.kill(rng.randrange(2) if slot is None else slot)
                for writer in writers:
                    writer.result()
            finally:
                writes.stop.set()
            filler.result()
        wrote_s = time.monotonic() - began
        # Caught up once a change committed after all the others is applied.
        change(engine, cache_redis, scope, "marker", 1, generation)
        started = time.monotonic()
        eventually(lambda: not cached(cache_redis, scope, "marker", generation), timeout=60)
        caught_up_s = time.monotonic() - started
    finally:
        consumers.stop()
    with engine.connect() as conn:
        select = text("SELECT object_id, revision FROM records WHERE scope = :s")
        revisions = {row.object_id: row.revision for row in conn.execute(select, {"s": scope})}
    engine.dispose()
    del revisions["marker"]
    assert revisions == writes.expected()
    assert stale_entries(cache_redis, scope, revisions) == [], f"seed {seed}"
    assert {o: tomb(cache_redis, scope, o) for o in writes.ids} == writes.floors()
    assert RolloutControls(cache_redis, config.cache).fetch().generation == generation
    leases = int(cache_redis.get(CHANGES_FENCE_KEY) or 0) - first_token
    entries = len(list(cache_redis.scan_iter(match=f"record:v[12]:{scope}:*", count=1000)))
    print(
        f"seed {seed}: {writes.done} row changes in {wrote_s:.1f} s; {KILLS} kills, "
        f"{active_kills} of the active; {leases} leases taken after the first; caught up "
        f"{caught_up_s:.2f} s after; fills {dict(writes.fills)}; {entries} entries left"
    )


def flush_binary_logs(engine: Engine) -> None:
    with engine.connect() as conn:
        conn.execute(text("FLUSH BINARY LOGS"))


def test_binlog_rotations_and_database_restarts_mid_stream_miss_no_change(
    restartable_mariadb: PrivateMariaDB, cache_redis: redis.Redis, config: Config
) -> None:
    server = restartable_mariadb
    url = server.url("dataservice")
    # A connection per statement: none outlives a restart.
    engine = create_engine(url, poolclass=NullPool)
    settings = Settings(database_url=url, redis_url=CHANGES_REDIS_URL)
    scope = f"t-{uuid.uuid4().hex[:10]}"
    floors: dict[str, int] = {}
    with running_consumer(settings, with_changes_config(config, reconnect_max_s=1)) as consumer:
        generation = RolloutControls(cache_redis, config.cache).fetch().generation

        def write(*object_ids: str) -> None:
            for object_id in object_ids:
                change(engine, cache_redis, scope, object_id, 2, generation)
                floors[object_id] = 2

        def invalidated(*object_ids: str) -> bool:
            return not any(cached(cache_redis, scope, o, generation) for o in object_ids)

        write("a")
        flush_binary_logs(engine)
        write("b")
        eventually(lambda: invalidated("a", "b"), timeout=5.0)
        PrivateMariaDB.stop(server)  # SIGTERM: a clean shutdown
        time.sleep(1)  # down long enough for the consumer to fail and back off
        server.start()
        write("c")
        started = time.monotonic()
        eventually(lambda: invalidated("c"), timeout=30)
        after_stop_s = time.monotonic() - started
        write("d")
        assert server.process is not None
        server.process.kill()  # a crash just after a commit the consumer may not have read
        server.process.wait()
        server.start()
        write("e")
        flush_binary_logs(engine)
        write("f")
        started = time.monotonic()
        eventually(lambda: invalidated("d", "e", "f"), timeout=30)
        after_crash_s = time.monotonic() - started
        assert consumer.state.role == "active"
    assert {o: tomb(cache_redis, scope, o) for o in floors} == floors
    # Each time the consumer went on from its saved position: nothing to rotate for.
    assert RolloutControls(cache_redis, config.cache).fetch().generation == generation
    print(
        f"invalidated {after_stop_s:.2f} s after a clean restart,"
        f" {after_crash_s:.2f} s after a crash"
    )


def test_unrelated_tables_and_ddl_neither_stop_nor_skip_invalidations_and_truncate_rotates(
    binlog_url: str, cache_redis: redis.Redis, config: Config
) -> None:
    engine = create_engine(binlog_url)
    settings = Settings(database_url=binlog_url, redis_url=CHANGES_REDIS_URL)
    controls = RolloutControls(cache_redis, config.cache)
    scope = f"t-{uuid.uuid4().hex[:10]}"

    def run(*statements: str) -> None:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement), {"s": scope})

    run(
        "CREATE TABLE IF NOT EXISTS notes (scope VARCHAR(64), object_id VARCHAR(128),"
        " revision BIGINT, PRIMARY KEY (scope, object_id))",
        "CREATE DATABASE IF NOT EXISTS elsewhere",
        "CREATE TABLE IF NOT EXISTS elsewhere.records LIKE records",
    )
    with running_consumer(settings, config) as consumer:
        token, generation = consumer.state.token, controls.fetch().generation
        plant(cache_redis, scope, "a", 1, generation)
        plant(cache_redis, scope, "b", 1, generation)
        # One transaction: "a" changes in other tables only, "b" in records.
        run(
            "INSERT INTO notes VALUES (:s, 'a', 5)",
            "INSERT INTO elsewhere.records VALUES (:s, 'a', 5, 'x', NOW(6), NOW(6))",
            "INSERT INTO records VALUES (:s, 'b', 2, 'x', NOW(6), NOW(6))",
        )
        eventually(lambda: not cached(cache_redis, scope, "b", generation), timeout=5.0)
        assert cached(cache_redis, scope, "a", generation) == 2
        assert tomb(cache_redis, scope, "a") == 0
        for object_id, ddl in (
            ("c", "ALTER TABLE records ADD COLUMN note VARCHAR(16) NULL"),
            ("d", "ALTER TABLE records DROP COLUMN note"),
        ):
            run(ddl)
            change(engine, cache_redis, scope, object_id, 2, generation)
            eventually(
                lambda o=object_id: not cached(cache_redis, scope, o, generation), timeout=5.0
            )
        assert controls.fetch().generation == generation
        # Rows gone without row events: only a new generation covers them.
        run("TRUNCATE records")
        eventually(lambda: controls.fetch().generation == generation + 1, timeout=5.0)
        change(engine, cache_redis, scope, "e", 2, generation + 1)
        eventually(lambda: not cached(cache_redis, scope, "e", generation + 1), timeout=5.0)
        # One active spell throughout: nothing it read made it stop or start again.
        assert (consumer.state.role, consumer.state.token) == ("active", token)
    assert [tomb(cache_redis, scope, o) for o in "bcde"] == [2, 2, 2, 2]
    engine.dispose()


def test_the_consumer_rides_out_its_redis_restarting_empty_and_goes_on_saving(
    binlog_url: str, own_redis: OwnRedis, config: Config
) -> None:
    engine = create_engine(binlog_url)
    client = redis.Redis.from_url(own_redis.url)
    checkpoints = Checkpoints(engine)
    settings = Settings(database_url=binlog_url, redis_url=own_redis.url)
    scope = f"t-{uuid.uuid4().hex[:10]}"

    def saved_beyond(position: Position | None) -> bool:
        saved = checkpoints.load()
        return position is not None and saved is not None and saved >= position

    # Leases were taken before, as on any Redis that has run a while.
    client.incrby(CHANGES_FENCE_KEY, 100)
    with running_consumer(
        settings, with_changes_config(config, lease_ms=1000, reconnect_max_s=0.5)
    ) as consumer:
        generation = RolloutControls(client, config.cache).fetch().generation
        change(engine, client, scope, "a", 2, generation)
        eventually(lambda: not cached(client, scope, "a", generation), timeout=5.0)
        eventually(lambda: saved_beyond(consumer.state.position), timeout=5.0)
        before = consumer.state.token
        own_redis.kill()
        with engine.begin() as conn:
            upsert(conn, scope, "b", 2)  # a change while Redis is away
        time.sleep(1)  # long enough for the consumer to meet the dead Redis
        own_redis.start()  # empty: no entries, tombstones, lease or fencing counter
        # Tokens still only grow: the database remembers the largest one.
        started = time.monotonic()
        eventually(
            lambda: holder(client) > before,
            timeout=20,
            # What a failure needs to be read: where the consumer stood.
            message=lambda: f"the lease taken again (token {before}); consumer: {consumer.state!r}",
        )
        back_s = time.monotonic() - started
        # Read again from the saved position: the change made meanwhile is applied.
        eventually(lambda: tomb(client, scope, "b") == 2, timeout=10)
        generation = RolloutControls(client, config.cache).fetch().generation
        change(engine, client, scope, "c", 2, generation)
        eventually(lambda: not cached(client, scope, "c", generation), timeout=5.0)
        # The position it saves moves on too, past the change after the restart.
        eventually(lambda: saved_beyond(consumer.state.position), timeout=5)
    assert tomb(client, scope, "c") == 2
    client.close()
    engine.dispose()
    print(f"the lease was taken again {back_s:.2f} s after Redis came back")


def test_a_change_just_after_an_operator_rotation_reaches_the_new_generation(
    binlog_url: str, cache_redis: redis.Redis, config: Config
) -> None:
    # The consumer re-reads the controls at most this often, like the workers;
    # the longest allowed keeps it on the old generation for the whole test.
    cache = config.cache.model_copy(update={"controls_max_age_ms": 5_000})
    engine = create_engine(binlog_url)
    settings = Settings(database_url=binlog_url, redis_url=CHANGES_REDIS_URL)
    controls = RolloutControls(cache_redis, config.cache)
    scope = f"t-{uuid.uuid4().hex[:10]}"
    with running_consumer(settings, config.model_copy(update={"cache": cache})):
        generation = controls.fetch().generation
        change(engine, cache_redis, scope, "a", 2, generation)
        eventually(lambda: not cached(cache_redis, scope, "a", generation), timeout=5.0)
        controls.rotate("tests")
        # A worker that saw the rotation first filled the new generation.
        change(engine, cache_redis, scope, "b", 2, generation + 1)
        eventually(lambda: tomb(cache_redis, scope, "b") == 2, timeout=5.0)
        assert not cached(cache_redis, scope, "b", generation + 1)
    engine.dispose()
