"""Acceptance: the two incident replays, at reduced size, against the service.

``proxy-storm`` replays a proxy whose borrow wait equalled its callers'
timeout: callers whose timeout is the service's own pool wait, offered 2.26x
what the connections serve, and every connection dropped at 40 % of the run.
``downsized-db`` replays a database downsized without a load test: at 50 % of
the run every operation's time in the database doubles under the running
workers, unannounced; the capacity at both speeds is probed first.

Each run starts its own worker processes (one per lane, each with its alive
file) on Redis db 12, the database ``dataservice_incident_t`` and the MariaDB
user ``ds_incident_t``; the sampler reads that user's connections from the
server's process list. The database's injected time per operation (200 ms)
makes the permits, not the machine's two CPUs, the bottleneck: a lane serves
7 / 0.2 s = 35 requests a second at most, the generator offers a few dozen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dataservice_tools.loadtest import environment as env
from dataservice_tools.loadtest.recovery import LIMIT_S, SHARE
from dataservice_tools.loadtest.sampler import Sample
from dataservice_tools.localservices import mysql_reachable, redis_reachable

from tests.conftest import require
from tests.harness.loadtest import run_scenario

TARGET = env.Target("service", "ds_incident_t", "ds-incident-t-pw", "dataservice_incident_t", 12)
DELAY_MS = 200

pytestmark = [pytest.mark.timeout(90), pytest.mark.load]


@pytest.fixture(scope="module", autouse=True)
def services() -> None:
    require(redis_reachable(TARGET.redis_url), "Redis at 127.0.0.1:6379")
    require(mysql_reachable("127.0.0.1", 3306), "MariaDB at 127.0.0.1:3306")


def run(scenario: str, out: Path, duration_s: float) -> tuple[dict[str, Any], list[Sample]]:
    return run_scenario(
        scenario, out, TARGET, replicas=1, duration_s=duration_s, db_delay_ms=DELAY_MS, records=200
    )


def assert_connections_within_share(report: dict[str, Any], samples: list[Sample]) -> None:
    over = [s for s in samples if s.connections > s.share_connections]
    assert not over, f"samples over the replicas' connection share: {over[:5]}"
    assert max(s.connections for s in samples) <= report["budget"]["service_max_connections"]
    assert report["database"]["sample_hz"] >= 20


def assert_live_throughout(report: dict[str, Any]) -> None:
    liveness = report["liveness"]
    assert liveness["applicable"]
    assert liveness["samples"] > 0
    assert liveness["sample_hz"] >= 2, liveness
    # Both replicas' alive files were checked in every sample, and every sample was green.
    assert set(liveness["series"]["files"]) == {2}, liveness["series"]["files"]
    assert liveness["red_samples"] == 0, liveness["first_failures"]


def assert_recovered(report: dict[str, Any], capacity_after: dict[str, float]) -> None:
    """Every lane's goodput over 2 s was back to 0.9 of the capacity that
    applies after the event within 10 s of it."""
    recovery = report["recovery"]
    assert (recovery["share_of_capacity"], recovery["limit_s"]) == (SHARE, LIMIT_S)
    for lane, figures in recovery["lanes"].items():
        assert figures["capacity_after_per_s"] == round(capacity_after[lane], 1)
        assert figures["target_per_s"] >= round(SHARE * capacity_after[lane], 1) - 0.1
        back = figures["recovery_s"]
        assert back is not None, (lane, figures, report["series"][lane])
        assert back <= LIMIT_S, (lane, figures)


def test_proxy_storm_keeps_connections_within_the_share_and_recovers_from_the_drop(
    tmp_path: Path,
) -> None:
    report, samples = run("proxy-storm", tmp_path, duration_s=12.0)
    config = report["config"]
    # The replay's premise: callers give up after the service's own pool wait.
    assert config["timeouts_s"]["interactive"] == 0.5
    assert report["verdicts"]["killed_connections"] > 0
    assert report["verdicts"]["reconnect"]["within_bound"], report["verdicts"]["reconnect"]
    assert_connections_within_share(report, samples)
    assert_live_throughout(report)
    assert_recovered(report, config["capacity_per_s"])


def test_downsized_db_is_measured_at_both_speeds_and_recovers_to_the_new_capacity(
    tmp_path: Path,
) -> None:
    report, samples = run("downsized-db", tmp_path, duration_s=12.0)
    config = report["config"]
    assert (config["delay_ms_before"], config["delay_ms_after"]) == (DELAY_MS, 2 * DELAY_MS)
    before, after = config["capacity_per_s"], config["capacity_after_per_s"]
    for lane in before:
        # Measured, not assumed: the slower database really served about half.
        assert 0.35 * before[lane] <= after[lane] <= 0.65 * before[lane], (before, after)
    assert_connections_within_share(report, samples)
    assert_live_throughout(report)
    assert_recovered(report, after)
    # The service held the new capacity: the halving cost no collapse later on.
    assert report["recovery"]["held"], report["recovery"]["lanes"]
