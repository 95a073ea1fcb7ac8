"""The load tests' database speed knob: ``database.injected_delay_table``.

A running store reads its injected sleep from the table in the same statement,
so raising the table's value slows the very next operation on a connection
already open, with nothing restarted or told. Real MariaDB, the service's own
engine and user.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from dataservice_tools.loadtest.delay import DELAY_TABLE, DelayTable
from sqlalchemy import Engine, text

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.store import RecordStore, create_store_engine
from tests.conftest import ROOT_URL, SERVICE_USER, TEST_DATABASE
from tests.harness.support import admin_connection_id, connection_ids

SLOW_MS = 300


@pytest.fixture
def delay_table(database: Engine) -> Iterator[DelayTable]:
    table = DelayTable(ROOT_URL, TEST_DATABASE)
    table.create(0)
    try:
        yield table
    finally:
        table.close()
        with database.connect() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS `{DELAY_TABLE}`"))


def _timed_read(store: RecordStore, scope: str) -> float:
    started = time.monotonic()
    store.read(scope, "no-such-record")
    return time.monotonic() - started


def test_a_read_takes_longer_right_after_the_delay_table_is_raised(
    settings: Settings, config: Config, database: Engine, delay_table: DelayTable, scope: str
) -> None:
    engine = create_store_engine(settings.database_url, 1, config.database)
    store = RecordStore(
        engine,
        max_statement_ms=config.database.max_statement_ms,
        injected_delay_table=DELAY_TABLE,
    )
    others = connection_ids(database, SERVICE_USER)
    try:
        fast = _timed_read(store, scope)
        others.add(admin_connection_id(engine))
        ours = connection_ids(database, SERVICE_USER) - others
        delay_table.set(SLOW_MS)
        slow = _timed_read(store, scope)
        delay_table.set(0)
        fast_again = _timed_read(store, scope)
        # One connection throughout, by the server's own list: the new speed
        # reached a connection that was already open.
        assert len(ours) == 1
        assert connection_ids(database, SERVICE_USER) - others == ours
    finally:
        engine.dispose()
    assert fast < SLOW_MS / 1000 / 3, fast
    assert slow >= SLOW_MS / 1000, slow
    assert fast_again < SLOW_MS / 1000 / 3, fast_again
    assert delay_table.get() == 0
