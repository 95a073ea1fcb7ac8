"""Client-side adaptive throttling: the SRE rule, its recovery and the retry budget
(dataservice/client/throttle.py), on a clock and dice of the test's own."""

from __future__ import annotations

import pytest

from dataservice.client.throttle import MAX_REJECTION, MIN_REQUESTS, RETRY_FLOOR, Throttle
from dataservice.config.model import ThrottleConfig
from dataservice.enums import LaneName
from dataservice.errors import ResourceExhausted
from dataservice.refusals import Reason

LANE = LaneName.INTERACTIVE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_nothing_is_refused_while_the_service_accepts_what_it_is_sent() -> None:
    clock = Clock()
    throttle = Throttle(ThrottleConfig(), clock=clock, rng=lambda: 0.0)
    for _ in range(1000):
        clock.now += 0.01
        throttle.check(LANE)
        throttle.outcome(LANE, 1, 1)
    assert throttle.rejection_probability(LANE) == 0.0


def test_at_three_times_what_is_accepted_a_third_is_refused_here() -> None:
    clock = Clock()
    # Dice that never refuse: every request is counted and sent.
    throttle = Throttle(ThrottleConfig(k=2.0, window_ms=1000), clock=clock, rng=lambda: 1.0)
    # 300 requests a second counted, 100 of them accepted: (300 - 2 x 100) / 301.
    for n in range(300):
        clock.now += 1 / 300
        throttle.check(LANE)
        throttle.outcome(LANE, 1, int(n % 3 == 0))
    assert throttle.rejection_probability(LANE) == pytest.approx(100 / 301, abs=0.02)


def test_a_local_refusal_is_the_services_error_with_its_last_retry_after() -> None:
    clock = Clock()
    throttle = Throttle(ThrottleConfig(), clock=clock, rng=lambda: 0.0)
    throttle.outcome(LANE, MIN_REQUESTS, 0, 0.25)
    with pytest.raises(ResourceExhausted) as caught:
        throttle.check(LANE)
    assert caught.value.reason == Reason.THROTTLED
    assert caught.value.retry_after == 0.25


def test_about_k_times_what_is_accepted_is_sent_and_a_recovery_is_seen_within_a_window() -> None:
    clock = Clock()
    config = ThrottleConfig(k=2.0, window_ms=500)
    throttle = Throttle(config, clock=clock)
    # Overload: 300 offered a second, the service accepts 100 a second of what is sent.
    sent = accepted = 0
    for n in range(3000):
        clock.now += 1 / 300
        try:
            throttle.check(LANE)
        except ResourceExhausted:
            continue
        sent += 1
        taken = accepted < (n + 1) / 3
        accepted += taken
        throttle.outcome(LANE, 1, int(taken))
    assert sent <= 2.2 * accepted, (sent, accepted)
    assert sent >= 1.6 * accepted, (sent, accepted)
    # Recovered: everything sent is accepted; within one window nothing is refused.
    clock.now += config.window_ms / 1000
    assert throttle.rejection_probability(LANE) == 0.0


def test_a_quiet_caller_is_never_throttled_and_nobody_entirely() -> None:
    clock = Clock()
    throttle = Throttle(ThrottleConfig(), clock=clock, rng=lambda: 0.0)
    # A few refusals: too few requests to say anything about the service.
    throttle.outcome(LANE, MIN_REQUESTS - 1, 0)
    throttle.check(LANE)
    assert throttle.rejection_probability(LANE) == 0.0
    # Everything refused: at most MAX_REJECTION is refused here, so what is
    # still sent can find the service accepting again.
    throttle.outcome(LANE, 1000, 0)
    assert throttle.rejection_probability(LANE) == MAX_REJECTION


def test_retries_stop_while_throttling_and_stay_within_their_budget() -> None:
    clock = Clock()
    throttle = Throttle(ThrottleConfig(), clock=clock, rng=lambda: 1.0)
    for _ in range(100):
        clock.now += 0.001
        throttle.check(LANE)
        throttle.outcome(LANE, 1, 1)
    # 100 requests in the window: 10 retries (10 %), at least RETRY_FLOOR.
    allowed = sum(throttle.may_retry(LANE) for _ in range(50))
    assert allowed == max(RETRY_FLOOR, 10)
    # The service refusing most of what is sent: no retry at all.
    for _ in range(400):
        clock.now += 0.0005
        throttle.check(LANE)
        throttle.outcome(LANE, 1, 0)
    assert throttle.rejection_probability(LANE) > 0
    assert not throttle.may_retry(LANE)


def test_disabled_it_never_refuses_and_leaves_retries_to_the_retry_settings() -> None:
    clock = Clock()
    throttle = Throttle(ThrottleConfig(enabled=False), clock=clock, rng=lambda: 0.0)
    for _ in range(1000):
        clock.now += 0.0001
        throttle.check(LANE)
        throttle.outcome(LANE, 1, 0)
    assert throttle.rejection_probability(LANE) == 0.0
    assert all(throttle.may_retry(LANE) for _ in range(100))
