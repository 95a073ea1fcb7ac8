"""Permits and the reconnect ramp, in isolation."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import yaml

from dataservice.config.model import parse_config
from dataservice.enums import LaneName, OperationClass
from dataservice.limits.permits import LanePermits, PermitUnavailable
from dataservice.store.connections import ConnectRamp, ConnectRateLimited
from tests.conftest import SHIPPED_CONFIG


@pytest.fixture
def permits() -> LanePermits:
    data: dict[str, Any] = yaml.safe_load(SHIPPED_CONFIG.read_text())
    data["lanes"]["interactive"].update(
        permits=3, concurrency=3, classes={"point_read": 3, "point_write": 3, "bounded_list": 1}
    )
    return LanePermits(parse_config(data).lanes[LaneName.INTERACTIVE])


def test_a_lane_never_holds_more_permits_than_it_has(permits: LanePermits) -> None:
    held = threading.Barrier(4)
    release = threading.Event()
    refused: list[bool] = []

    def hold() -> None:
        try:
            with permits.acquire(OperationClass.POINT_READ, 0.2):
                held.wait()
                release.wait()
        except PermitUnavailable:
            refused.append(True)

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    held.wait(timeout=5)
    assert permits.snapshot().in_use == 3
    with pytest.raises(PermitUnavailable), permits.acquire(OperationClass.POINT_WRITE, 0.05):
        pass
    release.set()
    for t in threads:
        t.join()
    snap = permits.snapshot()
    assert (snap.in_use, snap.acquired_total, snap.released_total, snap.refused_total) == (
        0, 3, 3, 1,
    )  # fmt: skip
    assert not refused


def test_an_operation_class_is_capped_within_the_lane(permits: LanePermits) -> None:
    with permits.acquire(OperationClass.BOUNDED_LIST, 0.1):
        with pytest.raises(PermitUnavailable), permits.acquire(OperationClass.BOUNDED_LIST, 0.05):
            pass
        # Other classes still get the lane's remaining permits.
        with permits.acquire(OperationClass.POINT_READ, 0.05):
            assert permits.snapshot().by_class == {
                "point_read": 1, "point_write": 0, "bounded_list": 1,
            }  # fmt: skip
    assert permits.snapshot().in_use == 0


def test_a_permit_is_released_when_the_work_raises(permits: LanePermits) -> None:
    with pytest.raises(RuntimeError), permits.acquire(OperationClass.POINT_READ, 0.1):
        raise RuntimeError("statement failed")
    assert permits.snapshot().in_use == 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_ramp_allows_a_burst_then_its_rate() -> None:
    clock = FakeClock()
    ramp = ConnectRamp(rate_per_s=5, burst=3, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        ramp.take(max_wait_s=0.5)
    assert clock.slept == []
    ramp.take(max_wait_s=0.5)  # the fourth waits for a token: 1/5 s, plus jitter
    assert 0.2 <= clock.slept[-1] <= 0.2 + 0.1 + 1e-9
    for _ in range(10):
        ramp.take(max_wait_s=0.5)
    # A token bucket's bound: by time t, at most burst + rate * t connections.
    assert 3 + 5 * clock.now + 1e-9 >= 14, "more than the rate allows"


def test_the_ramp_refuses_a_wait_longer_than_allowed() -> None:
    clock = FakeClock()
    ramp = ConnectRamp(rate_per_s=1, burst=1, clock=clock, sleep=clock.sleep)
    ramp.take(max_wait_s=0.1)
    with pytest.raises(ConnectRateLimited) as caught:
        ramp.take(max_wait_s=0.1)
    assert caught.value.retry_after == pytest.approx(1.0)


def test_concurrent_takers_never_beat_the_rate() -> None:
    ramp = ConnectRamp(rate_per_s=50, burst=5)
    stamps: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        ramp.take(max_wait_s=2.0)
        with lock:
            stamps.append(time.monotonic())

    threads = [threading.Thread(target=take) for _ in range(30)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 5 at once, then 25 more at 50/s: at least 0.5 s in all.
    assert max(stamps) - start >= 25 / 50 - 0.02
