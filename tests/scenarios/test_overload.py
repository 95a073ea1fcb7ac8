"""Acceptance: overload fails fast. Reduced size: one replica per lane, 200 ms
in the database per operation (interactive capacity 7 permits / 0.2 s = 35/s),
the client's throttle and admission's standing-queue target as shipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from dataservice_tools.loadtest.findings import FAST_REFUSAL_MS, TIMEOUT_SHARE
from dataservice_tools.loadtest.recovery import SHARE
from dataservice_tools.loadtest.sampler import Sample
from dataservice_tools.localservices import mysql_reachable, redis_reachable

from dataservice.redis.keys import admission_key
from tests.conftest import SHIPPED_CONFIG, require
from tests.harness.loadtest import run_scenario
from tests.scenarios.test_loadtest import DELAY_MS, TEST_TARGET, assert_within_share

RATE = 7 * 1000 / DELAY_MS

pytestmark = [pytest.mark.timeout(120), pytest.mark.load]


@pytest.fixture(scope="module", autouse=True)
def services() -> None:
    require(redis_reachable(TEST_TARGET.redis_url), "Redis at 127.0.0.1:6379")
    require(mysql_reachable("127.0.0.1", 3306), "MariaDB at 127.0.0.1:3306")


def run(scenario: str, out: Path, duration_s: float) -> tuple[dict[str, Any], list[Sample]]:
    return run_scenario(
        scenario, out, TEST_TARGET, replicas=1, duration_s=duration_s, rate=RATE,
        db_delay_ms=DELAY_MS, records=200,
    )  # fmt: skip


def test_three_times_capacity_is_served_at_capacity_and_the_rest_refused_at_once(
    tmp_path: Path,
) -> None:
    """3x the capacity the closed-loop probe measures, as at full size (a nominal
    35/s a slower machine does not drain would add an overload of its own), for
    as long as the full-size run (the idle lane's first burst, admitted up to its
    deadline, is then the same share of it)."""
    report, samples = run_scenario(
        "overload", tmp_path, TEST_TARGET, replicas=1, duration_s=20.0, db_delay_ms=DELAY_MS,
        records=200,
    )  # fmt: skip
    capacity = report["config"]["capacity_per_s"]["interactive"]
    interactive = report["lanes"]["interactive"]
    assert interactive["timeout_rate"] <= TIMEOUT_SHARE, interactive
    # A stall of the whole machine delays every refusal in flight with it.
    allowed = FAST_REFUSAL_MS + report["machine_stalls"]["max_ms"]
    assert interactive["refused_p99_ms"] <= allowed, (interactive, report["machine_stalls"])
    assert interactive["p99_ms"] <= 1000 * report["config"]["timeouts_s"]["interactive"]
    assert interactive["goodput_per_s"] >= 0.9 * capacity, (capacity, interactive)
    assert interactive["rejected"] > 0
    assert_within_share(report, samples)


def test_a_step_to_three_times_and_back_starts_and_stops_refusing_within_two_seconds(
    tmp_path: Path,
) -> None:
    """1x is the capacity the closed-loop probe measures (as at full size), not
    the nominal 35/s: a nominal figure a little above what the machine drains
    would make 1x an overload of its own, rightly refused."""
    duration = 15.0
    report, samples = run_scenario(
        "step", tmp_path, TEST_TARGET, replicas=1, duration_s=duration, db_delay_ms=DELAY_MS,
        records=200,
    )  # fmt: skip
    capacity = report["config"]["capacity_per_s"]["interactive"]
    series = report["series"]["interactive"]
    up, down = int(duration / 3), int(2 * duration / 3)
    refused, offered, goodput = series["rejected"], series["offered"], series["goodput"]
    # Before the step nothing is refused; within 2 s of it, refusals are under way.
    assert sum(refused[:up]) == 0, refused
    assert sum(refused[up : up + 2]) > 0.3 * sum(offered[up : up + 2]), refused
    # From 2 s after the step down, nothing is refused at all.
    assert sum(refused[down + 2 :]) == 0, (down, refused)
    # After the first 2 s, goodput over every 2 s window is at least 0.9 of the
    # capacity: neither the overload nor its end costs the lane anything.
    for start in range(2, int(duration) - 1):
        assert goodput[start] + goodput[start + 1] >= 2 * SHARE * capacity, (start, goodput)
    assert report["lanes"]["interactive"]["timeout_rate"] <= TIMEOUT_SHARE, report["lanes"]
    assert_within_share(report, samples)


def broker_counts(redis_url: str, queue: str) -> tuple[int, int]:
    """(publishes the broker's admission script saw, those it admitted) on ``queue``."""
    client = redis.Redis.from_url(redis_url)
    try:
        stored = client.hgetall(admission_key(queue))
        # The counts; the books also keep times, rates and the broker's epoch.
        fields = {
            k.decode(): int(v)
            for k, v in stored.items()
            if k == b"offered" or k.startswith(b"refused:")
        }
    finally:
        client.close()
    refused = sum(v for k, v in fields.items() if k.startswith("refused:"))
    return fields.get("offered", 0), fields.get("offered", 0) - refused


def test_throttled_clients_send_about_k_times_what_is_accepted_and_unthrottled_ones_all_and_retries(
    tmp_path: Path,
) -> None:
    """Counted at the broker (admission's own count of publishes), not by the client."""
    unthrottled = tmp_path / "unthrottled.yml"
    data = yaml.safe_load(SHIPPED_CONFIG.read_text(encoding="utf-8"))
    data["client"]["throttle"]["enabled"] = False
    unthrottled.write_text(yaml.safe_dump(data), encoding="utf-8")
    k = float(data["client"]["throttle"]["k"])
    counts = {}
    for name, config in (("on", SHIPPED_CONFIG), ("off", unthrottled)):
        report, _ = run_scenario(
            "overload", tmp_path / name, TEST_TARGET, replicas=1, duration_s=10.0, rate=RATE,
            db_delay_ms=DELAY_MS, records=200, base_config=config,
        )  # fmt: skip
        attempts = report["lanes"]["interactive"]["attempts"]
        counts[name] = (attempts, *broker_counts(TEST_TARGET.redis_url, "interactive"))
    attempts, offered, admitted = counts["on"]
    assert offered <= k * admitted * 1.1, counts
    assert offered < 0.9 * attempts, counts
    attempts, offered, admitted = counts["off"]
    # Every attempt reached the broker, and its retries besides.
    assert offered > attempts, counts
