"""Publish-side pacing with leases (``dataservice/limits/pacing.py``): one step of
``admit.lua`` takes a few requests' worth from the burst's headroom, the
process spends them without the pacing key, and a caller at its rate is paced
one request at a time, exactly as without leases."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from dataservice.config.rate import Rate
from dataservice.errors import ResourceExhausted
from dataservice.limits import pacing as pacing_module
from dataservice.limits.admission import (
    CALLER_HEADER,
    DEADLINE_HEADER,
    SIZE_HEADER,
    AdmissionRefused,
    LaneAdmission,
    admit,
)
from dataservice.limits.pacing import LEASE_HOLD_S, LEASE_MAX, PaceStep, Pacing, lease_size
from dataservice.redis.keys import admission_key, held_key, pace_key
from dataservice.refusals import Reason

SECOND_US = 1_000_000


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(pacing_module.time, "monotonic", fake)
    return fake


def test_a_lease_is_a_quarter_of_the_burst_at_most_and_none_for_a_small_one() -> None:
    assert [lease_size(burst) for burst in (1, 4, 7, 8, 12, 32, 10_000)] == [
        0,
        0,
        0,
        1,
        2,
        LEASE_MAX - 1,
        LEASE_MAX - 1,
    ]


def test_a_lease_is_spent_by_the_next_publishes_then_the_script_paces_again(
    clock: _Clock,
) -> None:
    pacing = Pacing({"c": (SECOND_US // 10, 32)})
    step = pacing.step("c", 1)
    assert step == PaceStep(Rate(SECOND_US // 10, 32), LEASE_MAX - 1)
    pacing.granted("c", 3)
    assert [pacing.step("c", 1) for _ in range(3)] == [None, None, None]
    assert pacing.step("c", 1) == step


def test_what_is_not_spent_in_the_time_it_stands_for_is_dropped(clock: _Clock) -> None:
    pacing = Pacing({"slow": (SECOND_US // 10, 32), "fast": (10, 10_000)})
    pacing.granted("slow", 3)
    pacing.granted("fast", 3)
    assert pacing.step("slow", 1) is None
    assert pacing.step("fast", 1) is None
    # Three more intervals and one (0.4 s) for the slow caller; the least
    # hold for the fast one, whose three intervals are 30 µs.
    clock.now += LEASE_HOLD_S + 0.01
    assert pacing.step("fast", 1) is not None
    assert pacing.step("slow", 1) is None
    clock.now += 0.3
    assert pacing.step("slow", 1) is not None


def test_a_batch_and_an_unknown_caller_take_no_lease(clock: _Clock) -> None:
    pacing = Pacing({"c": (SECOND_US // 10, 32)})
    pacing.granted("c", 5)
    assert pacing.step("c", 4) == PaceStep(Rate(SECOND_US // 10, 32).paced(4), 0)
    assert pacing.step("stranger", 1) is None
    assert pacing.step(None, 1) is None
    pacing.granted("stranger", 5)
    assert pacing.step("stranger", 1) is None


def _lane(name: str) -> LaneAdmission:
    return LaneAdmission(
        max_messages=1_000,
        max_bytes=1 << 20,
        target_wait_ms=0,
        default_deadline_ms=5_000,
        max_deadline_ms=60_000,
        stats_key=admission_key(name),
        held_key=held_key(name),
    )


def _message(caller: str) -> dict[str, Any]:
    return {
        "body": "e30=",
        "properties": {"body_encoding": "base64"},
        "headers": {
            "id": uuid.uuid4().hex,
            CALLER_HEADER: caller,
            DEADLINE_HEADER: time.time_ns() // 1_000_000 + 30_000,
            SIZE_HEADER: 2,
        },
    }


def test_the_script_takes_a_lease_from_the_headroom_and_the_process_spends_it(
    redis_client: redis.Redis,
) -> None:
    caller, queue = f"pace-{uuid.uuid4().hex[:8]}", f"pace-q-{uuid.uuid4().hex[:8]}"
    pacing = Pacing({caller: (SECOND_US, 32)})
    lane = _lane(queue)
    try:
        admit(redis_client, queue, lane, "m", _message(caller), pacing)
        taken = int(redis_client.get(pace_key(caller)) or 0)
        # This request and the lease: LEASE_MAX intervals of a second.
        assert taken - time.time_ns() // 1000 > (LEASE_MAX - 1) * SECOND_US
        for _ in range(LEASE_MAX - 1):
            admit(redis_client, queue, lane, "m", _message(caller), pacing)
        assert int(redis_client.get(pace_key(caller)) or 0) == taken
        admit(redis_client, queue, lane, "m", _message(caller), pacing)
        assert int(redis_client.get(pace_key(caller)) or 0) > taken
        assert redis_client.llen(queue) == LEASE_MAX + 1
    finally:
        redis_client.delete(queue, lane.stats_key, lane.held_key, pace_key(caller))


def test_a_caller_at_its_burst_is_refused_at_publish_as_without_leases(
    redis_client: redis.Redis,
) -> None:
    """Burst 8 at one a second: eight publishes in a row pass, whoever pays
    for them (the script or a lease), and the ninth is refused."""
    caller, queue = f"pace-{uuid.uuid4().hex[:8]}", f"pace-q-{uuid.uuid4().hex[:8]}"
    pacing = Pacing({caller: (SECOND_US, 8)})
    lane = _lane(queue)
    try:
        for _ in range(8):
            admit(redis_client, queue, lane, "m", _message(caller), pacing)
        with pytest.raises(AdmissionRefused) as refused:
            admit(redis_client, queue, lane, "m", _message(caller), pacing)
        assert refused.value.reason is Reason.RATE_LIMITED
        assert isinstance(refused.value.error(), ResourceExhausted)
        assert redis_client.llen(queue) == 8
    finally:
        redis_client.delete(queue, lane.stats_key, lane.held_key, pace_key(caller))


def test_the_operations_guide_gives_the_leases_figures() -> None:
    text = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    assert f"a lease of up to {LEASE_MAX} requests' worth" in text
    assert f"(at least {round(LEASE_HOLD_S * 1000)} ms)" in text


def test_a_message_published_again_under_its_id_is_held_once(redis_client: redis.Redis) -> None:
    queue = f"held-q-{uuid.uuid4().hex[:8]}"
    lane = _lane(queue)
    message = _message("nobody")
    try:
        for _ in range(2):
            admit(redis_client, queue, lane, "m", message)
        assert redis_client.zcard(lane.held_key) == 1
        assert redis_client.hget(lane.stats_key, "held") == b"1"
    finally:
        redis_client.delete(queue, lane.stats_key, lane.held_key)
