"""The connect ramp waits for a new connection only while the operation could
still use it: a request that would get its connection too late is refused at
once and leaves the token to the next one. (Without this, callers whose
timeout equals the pool's wait took every token, ran out of time and threw the
new connection away with their statement: the pool never refilled.) Real
MariaDB, the service's own engine, the shipped burst (2) at a slower rate (2/s):
one token's wait (0.5 s) and two tokens' (1 s) lie on either side of the second
request's connect-by (0.9 s), so which it got shows in whether it is served, on
a machine of any speed. The burst is spent by the first pooled connection and
the administrative one it opens (custody's, which takes its token from the same
ramp), awaited before the requests, so that no token is taken behind their back.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import Engine

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.store import Bounds, RecordStore, create_store_engine
from dataservice.store.connections import ConnectRateLimited, now_ms
from tests.harness.support import admin_connection_id


def test_a_request_that_could_not_use_a_new_connection_in_time_does_not_wait_for_one(
    settings: Settings, config: Config, database: Engine, scope: str
) -> None:
    ramp = config.database.model_copy(update={"connect_rate_per_s": 2.0})
    assert ramp.connect_burst == 2, "a pooled and the administrative connection spend the burst"
    engine = create_store_engine(settings.database_url, 3, ramp)
    store = RecordStore(engine, max_statement_ms=ramp.max_statement_ms)
    held = [engine.connect()]
    admin_connection_id(engine)  # the burst, used up
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
    # (its wait is at most one interval plus the ramp's jitter, half of one);
    # the token after it was two intervals away, past its connect-by, so it
    # would have been refused.
    assert served_after < 2 * interval, served_after
