"""The cold-cache scenario at reduced size (``docs/loadtest.md``, "cold-cache").

One replica per lane on a private MariaDB with a binlog (the change consumer
runs beside them), 100 ms in the database per operation, 100 records: the
interactive lane offered 1.5 times what the database serves (98 % reads, through
the cache), the cache's generation rotated at 40 % of the run. The database
never holds more active statements than the replicas' share, and the hit ratio
is back at 0.9 within :data:`REFILL_BOUND_S`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dataservice_tools.loadtest import environment as env
from dataservice_tools.loadtest.refill import REFILLED
from dataservice_tools.localservices import TemporaryBinlogMariaDB, redis_reachable

from tests.conftest import require, started_binlog_mariadb
from tests.harness.loadtest import run_scenario
from tests.scenarios.test_loadtest import assert_within_share

pytestmark = pytest.mark.load

TARGET = env.Target("service", "ds_cold", "ds-cold-pw", "dataservice_cold", 13)
DELAY_MS = 100
DURATION_S = 20.0
# The stated bound, at this size: 100 keys, each refilled by one read of 100 ms
# under 7 permits, behind a queue of misses that admission keeps short.
REFILL_BOUND_S = 8.0
# Cold right after the rotation, far below the warm 0.97: the lowest one-second
# hit ratio read 0.36-0.38 on an idle machine and 0.34-0.47 beside two busy loops
# (once 0.53 over whole seconds, which could straddle the cold moment).
COLD_BELOW = 0.6


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryBinlogMariaDB]:
    require(redis_reachable(TARGET.redis_url), "Redis at 127.0.0.1:6379")
    binlog = started_binlog_mariadb()
    try:
        yield binlog
    finally:
        binlog.stop()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_rotated_cache_refills_within_the_permits(
    server: TemporaryBinlogMariaDB, tmp_path: Path
) -> None:
    """Coalescing on, as shipped (the full-size runs compare it with off)."""
    report, samples = run_scenario(
        "cold-cache", tmp_path, TARGET, replicas=1, duration_s=DURATION_S,
        db_delay_ms=DELAY_MS, records=100, root_url=server.url(""),
    )  # fmt: skip
    assert report["config"]["coalesce"] is True
    assert report["config"]["capacity_source"] == "closed-loop probe reading PRIMARY"
    refill = report["changes"]["refill"]
    assert refill["cold_at_s"] is not None, "the generation was not rotated"
    # Warm before the rotation, cold right after it, refilled within the bound.
    assert refill["hit_ratio_before"] >= REFILLED, refill
    assert refill["hit_ratio_lowest_after"] < COLD_BELOW, refill
    assert refill["refilled_s"] is not None, refill["series"]
    assert refill["refilled_s"] <= REFILL_BOUND_S, refill["series"]
    # The refill is the database's work, and it stays inside the permits.
    assert refill["database_peak_per_s"] > 0
    assert_within_share(report, samples)
