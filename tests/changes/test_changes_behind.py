"""How far behind the server the change consumer is, in binlog events and
bytes (``dataservice/changes/behind.py``): against a private MariaDB with a
binlog, asked as the consumer's own least-privilege user, with the real Redis
(``docs/changes.md``, "Watching it")."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from dataservice_tools.localservices import free_port
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, create_engine, text
from typer.testing import CliRunner

from dataservice.cache.guard import stream_status
from dataservice.changes import consumer as consumer_module
from dataservice.changes.behind import (
    EVENTS_CAP,
    UNKNOWN,
    Behind,
    LagProbe,
    behind,
    describe_events,
)
from dataservice.changes.stream import Position
from dataservice.cli import app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.observe.metrics import REGISTRY
from dataservice.redis.keys import CHANGES_STATUS_KEY
from tests.harness import changes as changes_harness
from tests.harness.binlog import BinlogDatabase
from tests.harness.changes import (
    CHANGES_REDIS_URL,
    cached,
    plant,
    running_consumer,
    upsert,
)
from tests.harness.support import changed, on_redis

cache_redis = changes_harness.cache_redis

# Each single-row write is at least a GTID, a table map, its row and a commit.
MIN_EVENTS_PER_WRITE = 4


admin = changes_harness.admin


@pytest.fixture
def own(binlog_database: BinlogDatabase, settings: Settings, admin: Engine) -> Iterator[Settings]:
    """The service and the consumer (as its own user) on the binlog database,
    left without a saved position, as the other tests that share it expect."""
    yield binlog_database.on(on_redis(settings, CHANGES_REDIS_URL))
    with admin.connect() as conn:
        conn.execute(text("DELETE FROM change_positions"))


def _head(admin: Engine) -> Position:
    with admin.connect() as conn:
        row = conn.execute(text("SHOW MASTER STATUS")).one()
    return Position(str(row[0]), int(row[1]))


def _write(admin: Engine, scope: str, count: int, prefix: str = "o") -> None:
    """``count`` transactions of one new record each (a write that changes
    nothing leaves nothing in the binlog)."""
    with admin.connect() as conn:
        for n in range(count):
            upsert(conn, scope, f"{prefix}{n}", 2)


def _events_in(admin: Engine, start: Position) -> int:
    """Every event of ``start``'s file from it, read whole (no LIMIT)."""
    with admin.connect() as conn:
        statement = text("SHOW BINLOG EVENTS IN :f FROM :p")
        return len(conn.execute(statement, {"f": start.log_file, "p": start.log_pos}).all())


def _cache_status(settings: Settings, directory: Path, *args: str) -> str:
    """``dataservice cache status`` with the freshness guard on (the tests' is off)."""
    guarded = directory / "guarded.yml"
    document = yaml.safe_load(settings.config_path.read_text(encoding="utf-8"))
    guarded.write_text(yaml.safe_dump(changed(document, ("changes", "guard"), True)))
    env = dataclasses.replace(settings, config_path=guarded).to_env()
    result = CliRunner().invoke(app, ["cache", "status", *args], env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


def _gauge(name: str) -> float | None:
    return REGISTRY.get_sample_value(name)


def test_events_and_bytes_behind_count_every_later_file_and_stop_at_the_cap(
    binlog_database: BinlogDatabase, admin: Engine
) -> None:
    scope = f"t-{uuid.uuid4().hex[:10]}"
    start = _head(admin)
    _write(admin, scope, 3)
    with admin.connect() as conn:
        conn.execute(text("FLUSH BINARY LOGS"))
        sizes = {str(name): int(size) for name, size in conn.execute(text("SHOW BINARY LOGS"))}
    _write(admin, scope, 2, prefix="p")
    end = _head(admin)
    assert end.log_file != start.log_file
    first, second = _events_in(admin, start), _events_in(admin, Position(end.log_file, 4))
    consumer = create_engine(binlog_database.changes_url)  # the least-privilege user
    try:
        with consumer.connect() as conn:
            found = behind(conn, start)
            assert found.events == first + second
            assert found.events >= 5 * MIN_EVENTS_PER_WRITE
            assert found.bytes == sizes[start.log_file] - start.log_pos + end.log_pos
            assert behind(conn, end) == Behind(0, 0)
            # The cap bounds the count, in the position's file and in later ones;
            # the bytes stay exact.
            assert behind(conn, start, cap=3) == Behind(3, found.bytes)
            assert behind(conn, start, cap=first + 2) == Behind(first + 2, found.bytes)
            assert behind(conn, start, cap=found.events) == found
            with pytest.raises(LookupError):
                behind(conn, Position("binlog.999999", 4))
    finally:
        consumer.dispose()
    assert describe_events(EVENTS_CAP) == "at least 1,000 events"
    assert describe_events(EVENTS_CAP - 1) == "999 events"
    assert describe_events(1) == "1 event"
    assert describe_events(-1) == "? events"


@pytest.mark.slow
def test_the_consumer_reports_events_behind_while_behind_and_no_lag_once_caught_up(
    own: Settings, config: Config, cache_redis: redis.Redis, admin: Engine, tmp_path: Path
) -> None:
    scope = f"t-{uuid.uuid4().hex[:10]}"
    with running_consumer(own, config):
        eventually(lambda: (stream_status(cache_redis) or {}).get("lag_events") == "0", timeout=10)
    # Stopped: the server moves on without it.
    _write(admin, scope, 20)
    plant(cache_redis, scope, "o19", 1)
    cache_redis.delete(CHANGES_STATUS_KEY)
    reports: list[dict[str, str]] = []

    def caught_up() -> bool:
        status = stream_status(cache_redis)
        if status is not None and (not reports or reports[-1] != status):
            reports.append(status)
        return status is not None and status["lag_events"] == "0"

    with running_consumer(own, config):
        eventually(caught_up, timeout=10)
        assert cached(cache_redis, scope, "o19") == 0
        assert _gauge("dataservice_changes_lag_events") == 0
        assert _gauge("dataservice_changes_lag_bytes") == 0
        text_status = _cache_status(own, tmp_path)
        json_status = json.loads(_cache_status(own, tmp_path, "--json"))["change_stream"]
    # `dataservice cache status` shows the figures beside the seconds.
    assert re.search(r"is 0\.0 s \([0-9,]+ events?, [0-9,]+ bytes\) behind at", text_status)
    assert int(json_status["lag_events"]) >= 0
    assert int(json_status["lag_bytes"]) >= 0
    # Its first report, from the position it saved, before it read anything.
    assert int(reports[0]["lag_events"]) >= 20 * MIN_EVENTS_PER_WRITE
    assert int(reports[0]["lag_bytes"]) > 0
    # Behind, it never says it has no lag: the age of what it has yet to read
    # is unknown (-1) until it has read some, and the freshness guard holds.
    assert reports[0]["lag_s"] == "-1.000"
    # (A few events behind may be its own position saves, which it skips.)
    behind = [r for r in reports if int(r["lag_events"]) >= 20 * MIN_EVENTS_PER_WRITE]
    assert all(float(r["lag_s"]) != 0 for r in behind), behind
    # Nothing left to read: caught up, whatever the age of the last commit it applied.
    assert reports[-1]["lag_s"] == "0.000"
    assert reports[-1]["lag_bytes"] == "0"
    # Not active: no figure.
    assert _gauge("dataservice_changes_lag_events") == -1


@pytest.mark.slow
def test_a_failing_lag_query_reports_unknown_once_warned_and_invalidation_goes_on(
    own: Settings,
    config: Config,
    cache_redis: redis.Redis,
    admin: Engine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    nowhere = f"mysql+mysqldb://nobody@127.0.0.1:{free_port()}/none"
    monkeypatch.setattr(consumer_module, "LagProbe", lambda url: LagProbe(nowhere))
    caplog.set_level(logging.WARNING, logger="dataservice.changes.behind")
    scope = f"t-{uuid.uuid4().hex[:10]}"
    seen: set[str] = set()

    def another_report() -> bool:
        status = stream_status(cache_redis)
        if status is None or status["at_ms"] in seen:
            return False
        seen.add(status["at_ms"])
        return True

    with running_consumer(own, config) as consumer:
        token = consumer.state.token
        for object_id in ("a", "b", "c"):
            plant(cache_redis, scope, object_id, 1)
            with admin.connect() as conn:
                upsert(conn, scope, object_id, 2)
            eventually(another_report, timeout=5)  # one a second
        eventually(lambda: sum(cached(cache_redis, scope, o) for o in "abc") == 0, timeout=5.0)
        assert consumer.state.role == "active"
        assert consumer.state.token == token
        status = stream_status(cache_redis)
        assert status is not None
        assert (status["lag_events"], status["lag_bytes"]) == ("-1", "-1")
        assert (consumer.state.lag_events, consumer.state.lag_bytes) == (-1, -1)
    warnings = [r for r in caplog.records if r.name == "dataservice.changes.behind"]
    assert len(warnings) == 1
    assert "unknown" in warnings[0].getMessage()


def test_the_probe_answers_unknown_for_a_position_the_server_no_longer_has(
    binlog_database: BinlogDatabase,
) -> None:
    probe = LagProbe(binlog_database.changes_url)
    try:
        assert probe.measure(Position("binlog.999999", 4)) == UNKNOWN
    finally:
        probe.close()


def test_the_probe_counts_events_whose_statements_hold_payload_bytes(
    binlog_database: BinlogDatabase, admin: Engine
) -> None:
    # MariaDB annotates row events with their statement, payload literal
    # included: the probe counts such events without decoding them.
    start = _head(admin)
    scope = f"t-{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(
            text(
                "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
                " VALUES (:s, 'bin', 1, :p, NOW(6), NOW(6))"
            ),
            {"s": scope, "p": bytes(range(128, 256))},
        )
    probe = LagProbe(binlog_database.changes_url)
    try:
        found = probe.measure(start)
    finally:
        probe.close()
    # Known (not -1): one write's events, however its payload reads.
    assert MIN_EVENTS_PER_WRITE <= found.events < EVENTS_CAP
    assert found.bytes > 0
