"""The change consumer with three cells: every change invalidates both formats
in every cell, the consumer's token is fenced in each, and a cell that stops
answering while records change serves none of them stale once it is back."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import create_engine, text

from dataservice.cache.controls import RolloutControls
from dataservice.changes.consumer import ChangeConsumer
from dataservice.config.cells import CellsConfig
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.redis.keys import CHANGES_FRESH_KEY, CHANGES_LEASE_KEY, tombstone_key
from tests.harness import changes as changes_harness
from tests.harness.changes import (
    CHANGES_REDIS_URL,
    UPSERT,
    cached,
    plant,
    running_consumer,
    upsert,
)

binlog_url = changes_harness.binlog_url
cache_redis = changes_harness.cache_redis

CELLS = ("a", "b", "c")
RECORDS = 1000
STOPPED_S = 10.0


@pytest.fixture
def others(tmp_path: Path) -> Iterator[dict[str, PrivateRedis]]:
    """Cells b and c on Redis servers of their own (a: the change stream's db)."""
    servers = {cell: PrivateRedis(tmp_path / f"redis-{cell}") for cell in CELLS[1:]}
    try:
        for server in servers.values():
            server.start()
        yield servers
    finally:
        for server in servers.values():
            server.signal(signal.SIGCONT)
            server.signal(signal.SIGKILL)


@pytest.fixture
def clients(
    cache_redis: redis.Redis, others: dict[str, PrivateRedis]
) -> Iterator[dict[str, redis.Redis]]:
    made = {cell: redis.Redis.from_url(server.url) for cell, server in others.items()}
    yield {"a": cache_redis, **made}
    for client in made.values():
        client.close()


@pytest.fixture
def consumer(
    binlog_url: str,
    config: Config,
    others: dict[str, PrivateRedis],
    clients: dict[str, redis.Redis],
    tmp_path: Path,
) -> Iterator[ChangeConsumer]:
    cells_file = tmp_path / "cells.yml"
    urls = {"a": CHANGES_REDIS_URL, **{cell: server.url for cell, server in others.items()}}
    cells_file.write_text(
        yaml.safe_dump({"cells": {cell: {"redis_url": url} for cell, url in urls.items()}})
    )
    with_cells = config.model_copy(update={"cells": CellsConfig(names=CELLS)})
    settings = Settings(database_url=binlog_url, redis_url=CHANGES_REDIS_URL, cells_file=cells_file)
    with running_consumer(settings, with_cells) as running:
        yield running


def test_a_commit_invalidates_both_formats_in_every_cell_under_the_consumers_fence(
    consumer: ChangeConsumer, binlog_url: str, clients: dict[str, redis.Redis]
) -> None:
    scope = f"t-{uuid.uuid4().hex[:10]}"
    for client in clients.values():
        plant(client, scope, "a", 1)
    engine = create_engine(binlog_url)
    try:
        with engine.begin() as conn:
            upsert(conn, scope, "a", 2)
    finally:
        engine.dispose()
    eventually(lambda: sum(cached(c, scope, "a") for c in clients.values()) == 0, timeout=5.0)
    for client in clients.values():
        assert client.get(tombstone_key(scope, "a")) == b"2"
    # The lease lives in the first cell; the others hold its token as their fence.
    token = consumer.state.token
    assert all(int(c.get(CHANGES_LEASE_KEY) or 0) == token for c in clients.values())
    eventually(lambda: all(c.exists(CHANGES_FRESH_KEY) for c in clients.values()), timeout=10.0)


# A cell's Redis stopped for 10 s on purpose: the fault tier.
@pytest.mark.fault
def test_a_cell_stopped_while_records_change_serves_none_of_them_stale_once_back(
    consumer: ChangeConsumer,
    binlog_url: str,
    config: Config,
    clients: dict[str, redis.Redis],
    others: dict[str, PrivateRedis],
) -> None:
    scope = f"t-{uuid.uuid4().hex[:10]}"
    ids = [f"r{n}" for n in range(RECORDS)]
    engine = create_engine(binlog_url)
    try:
        with engine.begin() as conn:
            conn.execute(UPSERT, [{"s": scope, "o": object_id, "r": 1} for object_id in ids])
        stopped = clients["c"]
        controls = RolloutControls(stopped, config.cache)
        generation = controls.fetch().generation
        eventually(lambda: stopped.exists(CHANGES_FRESH_KEY), timeout=10.0)
        for object_id in ids:
            plant(stopped, scope, object_id, 1, generation)
        others["c"].signal(signal.SIGSTOP)
        started = time.monotonic()
        try:
            for first in range(0, RECORDS, 100):
                with engine.begin() as conn:
                    conn.execute(
                        text("UPDATE records SET revision = 2 WHERE scope = :s AND object_id = :o"),
                        [{"s": scope, "o": object_id} for object_id in ids[first : first + 100]],
                    )
            # The other cells keep up meanwhile.
            eventually(lambda: clients["b"].get(tombstone_key(scope, ids[-1])) == b"2", timeout=10)
            time.sleep(max(STOPPED_S - (time.monotonic() - started), 0.0))
        finally:
            others["c"].signal(signal.SIGCONT)
    finally:
        engine.dispose()

    # Back: until its generation has moved on, its guard keeps every read off
    # the cache; once it says fresh, no entry of the old revision is reachable.
    def fresh_again() -> bool:
        return bool(stopped.exists(CHANGES_FRESH_KEY))

    while not fresh_again():
        time.sleep(0.02)
        assert time.monotonic() - started < STOPPED_S + 30, "the cell was never fresh again"
    now = controls.fetch().generation
    assert now != generation
    assert sum(cached(stopped, scope, object_id, now) for object_id in ids) == 0
