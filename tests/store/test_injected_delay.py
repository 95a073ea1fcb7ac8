"""The injected sleep is its own bound: cut to what the statement could have
had, refused as a statement timeout when cut, and sent with no server-side
timeout (on MariaDB a statement timeout that fires as ``SLEEP()`` ends can hold
every statement's start and end for 2 s; ``InjectedDelay`` says what was
measured). Real MariaDB, the service's own engine and user."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from dataservice_tools.loadtest.delay import DELAY_TABLE, DelayTable
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, text

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import OperationClass
from dataservice.limits.permits import LanePermits
from dataservice.store import Bounds, RecordStore, create_store_engine
from dataservice.store.connections import StatementTimeout, now_ms
from dataservice.store.sessions import InjectedDelay
from tests.conftest import ROOT_URL, SERVICE_USER, TEST_DATABASE

DELAY_MS = 400


@pytest.fixture
def engine(settings: Settings, config: Config) -> Iterator[Engine]:
    engine = create_store_engine(settings.database_url, 2, config.database)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def delay_table(database: Engine) -> Iterator[DelayTable]:
    table = DelayTable(ROOT_URL, TEST_DATABASE)
    table.create(DELAY_MS)
    try:
        yield table
    finally:
        table.close()
        with database.connect() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS `{DELAY_TABLE}`"))


def _sleeps(database: Engine) -> list[str]:
    query = text(
        "SELECT INFO FROM information_schema.PROCESSLIST"
        " WHERE USER = :user AND COMMAND = 'Query' AND INFO LIKE '%SLEEP(%'"
    )
    with database.connect() as conn:
        return [str(row[0]) for row in conn.execute(query, {"user": SERVICE_USER})]


def _timed(
    store: RecordStore, config: Config, deadline_in_ms: int
) -> tuple[float, BaseException | None]:
    permits = LanePermits(config.lanes.interactive)
    started = time.monotonic()
    with permits.acquire(OperationClass.POINT_READ, 1.0) as permit:
        try:
            store.read("s", "no-such-record", Bounds(permit, deadline_ms=now_ms() + deadline_in_ms))
        except StatementTimeout as exc:
            return time.monotonic() - started, exc
    return time.monotonic() - started, None


@pytest.mark.parametrize("source", ["fixed", "table"])
def test_a_sleep_longer_than_the_deadline_is_cut_to_it_and_refused_as_a_timeout(
    source: str, config: Config, engine: Engine, delay_table: DelayTable
) -> None:
    store = RecordStore(
        engine,
        max_statement_ms=config.database.max_statement_ms,
        injected_delay_ms=DELAY_MS if source == "fixed" else 0,
        injected_delay_table=DELAY_TABLE if source == "table" else None,
    )
    took, refused = _timed(store, config, 150)
    assert isinstance(refused, StatementTimeout)
    # It slept what the statement could have had (less the set-up), not the delay.
    assert 0.1 <= took < DELAY_MS / 1000, took
    # Within the deadline, the same sleep runs whole and the read is answered.
    took, refused = _timed(store, config, 2000)
    assert refused is None
    assert took >= DELAY_MS / 1000, took


def test_the_sleep_is_sent_without_a_server_side_timeout(
    config: Config, engine: Engine, database: Engine
) -> None:
    store = RecordStore(
        engine, max_statement_ms=config.database.max_statement_ms, injected_delay_ms=DELAY_MS
    )
    done = threading.Event()
    reader = threading.Thread(target=lambda: (_timed(store, config, 2000), done.set()))
    reader.start()
    try:
        sent = eventually(lambda: _sleeps(database), timeout=2, interval=0.005)
    finally:
        reader.join(5)
    assert done.is_set()
    assert sent == ["SELECT SLEEP(400 / 1000), 0"], sent
    assert "max_statement_time" not in sent[0]


def test_an_unbounded_sleep_is_the_delay_whole() -> None:
    assert InjectedDelay.of(0, None) is None
    assert InjectedDelay.of(250, None) == InjectedDelay(250)
    assert InjectedDelay(250).unbounded() == ("SELECT SLEEP(%s / 1000)", (250,))
    assert InjectedDelay(250).bounded(100) == ("SELECT SLEEP(%s / 1000), %s", (100, 1))
    assert InjectedDelay(250).bounded(300) == ("SELECT SLEEP(%s / 1000), %s", (250, 0))
