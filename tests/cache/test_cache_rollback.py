"""The rollback sequence of ``docs/cache.md`` ("Rolling back"), run by an
operator against a real worker: stop fills, bypass, wait, rotate, resume.

One ``dataservice worker --lane interactive`` process on Redis db 7, whose
configuration keeps the sequence short: the controls are re-read every 100 ms,
a permit is waited for at most 200 ms, a statement is stopped after 1 s, and
every database operation first sleeps 300 ms, so that a miss is still reading
the database when the rollback begins. ``cache.ttl_s`` keeps its shipped
value: the entries cached before the rollback are still in Redis when the
generation rotates, so the test sees the rotation, not their expiry, hide them.

Step 3 waits the bound the doc states: every replica acts on steps 1 and 2
within ``cache.controls_max_age_ms``, and a miss that looked in the cache
before that fills when its database read returns, after at most the permit
wait, the injected sleep and the statement's limit. The miss in flight shows
such a fill landing after fills were stopped, in the generation it looked in.
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
from dataservice.cache.controls import Change, RolloutControls
from dataservice.cli import app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import CacheFormat, LaneName
from dataservice.redis.keys import lock_key, record_key
from dataservice.types import Record
from tests.conftest import require
from tests.harness.livecache import (
    Statements,
    cached_formats,
    in_database,
    served_lookups,
    settle,
)
from tests.harness.support import on_redis, with_changes, worker_process

OWN_REDIS_URL = "redis://127.0.0.1:6379/7"
QUICK: dict[tuple[str, ...], object] = {
    ("cache", "controls_max_age_ms"): 100,
    ("database", "pool_timeout_ms"): 200,
    ("database", "max_statement_ms"): 1000,
    ("database", "injected_delay_ms"): 300,
}
WHO = "rollback-drill"
BOTH = frozenset(CacheFormat)
WARM = ("warm-0", "warm-1", "warm-2")
IN_FLIGHT = "in-flight"
RECORDS = (*WARM, IN_FLIGHT)
# Steps 1, 2, 4 and 5 (twice), as the audit stream records them.
ACTIONS = ("change", "change", "rotate", "change", "change")


@pytest.fixture
def worker(
    settings: Settings, database: Engine, tmp_path: Path
) -> Iterator[tuple[Settings, Config, int]]:
    """The worker's settings, its configuration and its metrics port."""
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    own = with_changes(on_redis(settings, OWN_REDIS_URL), tmp_path / "queues.yml", QUICK)
    config = own.load()
    broker = redis.Redis.from_url(OWN_REDIS_URL)
    broker.flushdb()
    log = tmp_path / "worker.log"
    try:
        with worker_process(own, config, LaneName.INTERACTIVE, log) as (_, port):
            yield own, config, port
    finally:
        broker.flushdb()
        broker.close()


def _in_flight_bound_s(config: Config) -> float:
    """docs/cache.md, "Rolling back", step 3: how long a fill can still land."""
    database = config.database
    wait_ms = config.cache.controls_max_age_ms + database.pool_timeout_ms
    return (wait_ms + database.injected_delay_ms + database.max_statement_ms) / 1000


def _entries(cache: redis.Redis, scope: str, generation: int) -> dict[str, object]:
    keys = [record_key(fmt.value, scope, oid, generation) for oid in RECORDS for fmt in BOTH]
    return dict(zip(keys, cache.mget(keys), strict=True))


class Drill:
    """The operator's controls, a caller, and the database's word on each read."""

    def __init__(
        self, config: Config, port: int, cache: redis.Redis, client: Client, database: Engine
    ) -> None:
        self.config = config
        self.port = port
        self.cache = cache
        self.client = client
        self.database = database
        self.controls = RolloutControls(cache, config.cache)
        self.statements = Statements(database)
        self.changes: list[Change] = []
        self.expected: dict[str, Record] = {}

    def read(self, scope: str, object_id: str) -> int:
        """An ``ALLOW_CACHED`` read, which must answer the database's record:
        the statements it ran (none: the cache answered)."""
        self.statements.since()
        assert self.client.read(scope, object_id) == self.expected[object_id]
        return self.statements.since()

    def warm(self, scope: str) -> None:
        for object_id in RECORDS:
            self.client.write(scope, object_id, object_id.encode())
            self.expected[object_id] = in_database(self.database, scope, object_id)
        for object_id in WARM:
            assert self.read(scope, object_id) > 0
            assert self.read(scope, object_id) == 0, "a warm read is answered from the cache"
            assert cached_formats(self.cache, scope, object_id, 1) == BOTH

    def stop_fills_bypass_and_wait(self, scope: str, pool: ThreadPoolExecutor) -> None:
        # A miss whose leader holds the lock, reading the database, as fills stop.
        in_flight = pool.submit(self.client.read, scope, IN_FLIGHT)
        eventually(
            lambda: self.cache.exists(lock_key(scope, IN_FLIGHT)),
            timeout=10.0,
            interval=0.002,
            message="the in-flight miss",
        )

        self.changes.append(self.controls.change(WHO, fill=frozenset()))
        self.changes.append(self.controls.change(WHO, bypass=True))
        bypassed_at = time.monotonic()
        assert in_flight.result(10) == self.expected[IN_FLIGHT]
        # It looked in the cache before either change, so it still filled.
        assert cached_formats(self.cache, scope, IN_FLIGHT, 1) == BOTH

        settle(self.config)
        lookups = served_lookups(self.port, "hit", "miss")
        for object_id in WARM:
            assert self.read(scope, object_id) > 0, "under bypass every read reads the database"
        assert served_lookups(self.port, "hit", "miss") == lookups

        time.sleep(max(0.0, bypassed_at + _in_flight_bound_s(self.config) - time.monotonic()))

    def rotate_and_resume(self, scope: str) -> None:
        old = _entries(self.cache, scope, 1)
        assert None not in old.values()
        self.changes.append(self.controls.rotate(WHO))
        generation = self.changes[-1].after.generation
        assert generation == 2
        settle(self.config)
        assert set(_entries(self.cache, scope, generation).values()) == {None}

        self.changes.append(self.controls.change(WHO, bypass=False))
        self.changes.append(self.controls.change(WHO, fill=BOTH))
        settle(self.config)
        for object_id in RECORDS:
            # Its old generation's entry is still in Redis, and not read: a miss.
            assert self.read(scope, object_id) > 0, f"{object_id}: the old generation was read"
            assert cached_formats(self.cache, scope, object_id, generation) == BOTH
            lookups = served_lookups(self.port, "hit", "miss")
            assert self.read(scope, object_id) == 0, f"{object_id}: the new generation missed"
            # A hit is counted just after its answer went out: the caller may be first.
            eventually(lambda: served_lookups(self.port, "hit", "miss") > lookups, timeout=2)  # noqa: B023
            assert served_lookups(self.port, "hit", "miss") == lookups + 1
        assert _entries(self.cache, scope, 1) == old, "a fill landed in the old generation"

    def check_audited(self) -> None:
        history = self.controls.history(len(self.changes) + 1)
        assert [(e.who, e.action, e.before, e.after) for e in reversed(history)] == [
            (WHO, action, change.before, change.after)
            for action, change in zip(ACTIONS, self.changes, strict=True)
        ]
        fill, bypass, _, unbypass, refill = self.changes
        assert (fill.before.fill, fill.after.fill) == (BOTH, frozenset())
        assert (bypass.before.bypass, bypass.after.bypass) == (False, True)
        assert (unbypass.before.bypass, unbypass.after.bypass) == (True, False)
        assert (refill.before.fill, refill.after.fill) == (frozenset(), BOTH)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_rollback_sequence_hides_every_entry_and_the_cache_fills_again_after(
    worker: tuple[Settings, Config, int], database: Engine, scope: str
) -> None:
    settings, config, port = worker
    with (
        redis.Redis.from_url(settings.redis_url) as cache,
        Client("tests", settings, config) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        drill = Drill(config, port, cache, client, database)
        drill.warm(scope)
        drill.stop_fills_bypass_and_wait(scope, pool)
        drill.rotate_and_resume(scope)
        drill.check_audited()
        rotated_at_ms = drill.changes[2].after.rotated_at_ms

    result = CliRunner().invoke(app, ["cache", "status", "--json"], env=settings.to_env())
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["controls"] == {
        "fill": ["v1", "v2"], "read": "v2", "percent": 100, "bypass": False, "shadow": 0,
        "generation": 2, "rotated_at_ms": rotated_at_ms, "source": "redis",
    }  # fmt: skip
    assert status["warnings"] == []
    assert [(e["who"], e["action"]) for e in status["history"]] == [
        (WHO, action) for action in reversed(ACTIONS)
    ]
