"""The connect ramp waits for a new connection only while the operation could
still use it: a request that would get its connection too late is refused at
once and leaves the token to the next one. (Without this, callers whose
timeout equals the pool's wait took every token, ran out of time and threw the
new connection away with their statement: the pool never refilled.) Real
MariaDB, the service's own engine, the shipped ramp (burst 2, 20/s).
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.store import Bounds, RecordStore, create_store_engine
from dataservice.store.connections import ConnectRateLimited, now_ms


def test_a_request_that_could_not_use_a_new_connection_in_time_does_not_wait_for_one(
    settings: Settings, config: Config, database: Engine, scope: str
) -> None:
    ramp = config.database
    assert ramp.connect_burst == 2, "the test holds exactly the burst's connections"
    engine = create_store_engine(settings.database_url, 3, config.database)
    store = RecordStore(engine, max_statement_ms=ramp.max_statement_ms)
    held = [engine.connect() for _ in range(ramp.connect_burst)]  # the burst, used up
    try:
        started = time.monotonic()
        with pytest.raises(ConnectRateLimited):
            store.read(scope, "x", Bounds(deadline_ms=now_ms() + 1000, connect_by_ms=now_ms() + 5))
        refused_after = time.monotonic() - started
        started = time.monotonic()
        store.read(scope, "x", Bounds(deadline_ms=now_ms() + 1000, connect_by_ms=now_ms() + 900))
        served_after = time.monotonic() - started
    finally:
        for conn in held:
            conn.close()
        engine.dispose()
    interval = 1 / ramp.connect_rate_per_s
    # Refused without waiting for the token (which was `interval` away) ...
    assert refused_after < interval / 2, refused_after
    # ... and without taking it: the next request got the very next token
    # (its wait is at most one interval plus the ramp's jitter, half of one).
    assert served_after < 1.5 * interval + 0.02, served_after
