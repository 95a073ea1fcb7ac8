"""Acceptance: a caller flooding three replicas at ten times its rate is held to
its rate, service-wide, and the other caller is never refused.

The same set-up as ``bench/flood.py``, shorter: three ``dataservice worker
--lane interactive`` processes on Redis db 5, the test database, the test
configuration plus the callers ``flooder`` (40/s, burst 10) and ``steady``.
Only the accepted rate is asserted; latency under the flood is the bench's
(figures in bench/RESULTS.md), since on a shared 2-vCPU machine it measures
the machine as much as the service.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import redis
from dataservice_tools.loadtest.environment import seed_records
from dataservice_tools.localservices import redis_reachable
from dataservice_tools.testkit.flood import (
    FLOODER,
    SCOPE,
    STEADY,
    Flooders,
    one_attempt,
    run_phase,
    write_config,
)
from dataservice_tools.testkit.openloop import summarize_flood, summarize_steady
from dataservice_tools.testkit.replicas import Replicas
from sqlalchemy import Engine

from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.security.callers import write_callers_file
from tests.conftest import SHIPPED_CONFIG, require
from tests.harness.support import on_redis, with_test_callers

FLOOD_REDIS_URL = "redis://127.0.0.1:6379/5"
RATE = 40.0
BURST = 10
FACTOR = 10
STEADY_RATE = 20.0
SECONDS = 10.0

pytestmark = [pytest.mark.timeout(90), pytest.mark.load]


@pytest.fixture(scope="module")
def flood_settings(
    settings: Settings, database: Engine, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Settings, Config]:
    """The test configuration plus the two callers, their keys, on Redis db 5."""
    require(redis_reachable(FLOOD_REDIS_URL), "Redis at 127.0.0.1:6379")
    directory = tmp_path_factory.mktemp("flood")
    config_path = directory / "queues.yml"
    config = write_config(with_test_callers(SHIPPED_CONFIG), config_path, RATE, BURST)
    callers_file = directory / "callers.yml"
    write_callers_file(callers_file, {FLOODER: f"{FLOODER}-1", STEADY: f"{STEADY}-1"})
    flood = dataclasses.replace(
        on_redis(settings, FLOOD_REDIS_URL, config_path), callers_file=callers_file
    )
    client = redis.Redis.from_url(FLOOD_REDIS_URL)
    try:
        client.flushdb()
    finally:
        client.close()
    return flood, config


@pytest.fixture(scope="module")
def replicas(
    flood_settings: tuple[Settings, Config], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    settings, config = flood_settings
    fleet = Replicas(settings, config, 3, tmp_path_factory.mktemp("flood-logs"))
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def test_flooding_caller_is_held_to_its_rate_and_the_other_is_never_refused(
    flood_settings: tuple[Settings, Config], replicas: Replicas, database: Engine
) -> None:
    settings, config = flood_settings
    ids = seed_records(database.url.render_as_string(hide_password=False), SCOPE, 20, 256)
    clients = one_attempt(config)
    flooders = Flooders(settings, clients, FLOODER, SCOPE, RATE * FACTOR, processes=2, threads=32)
    steady = [Client(STEADY, settings, clients)]
    try:
        phase = run_phase(steady, SCOPE, ids, STEADY_RATE, SECONDS, flooders, pids={})
    finally:
        steady[0].close()
        flooders.close()
    replicas.check_alive()

    flood = summarize_flood(phase.flood, RATE, BURST)
    # The flood was offered far above the rate, so the limit, not the sender, bound it.
    assert flood["sent_per_s"] >= 5 * RATE, flood
    assert flood["exhausted"] > flood["ok"], flood
    # Accepted beyond the bucket's initial burst, per second of sending: the rate, +-10 %.
    assert flood["accepted_over_rate"] is not None
    assert abs(flood["accepted_over_rate"] - 1) <= 0.10, flood

    other = summarize_steady(phase.steady)
    assert other["exhausted"] == 0, other
    assert other["ok"] >= 0.9 * STEADY_RATE * SECONDS, other
