"""One contract for the caller limits, run against every backend: the shared
limits in Redis (``gate.lua``) and one replica's own (its fallback, here
holding the whole limit: one replica). The two write the rate algorithm in
Lua and in Python; these cases keep them the same algorithm."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
import redis

from dataservice.config.model import CallerPolicy, Config
from dataservice.config.rate import Rate
from dataservice.limits.gate import CallerLimits, RedisLimits
from dataservice.limits.gcra import check
from dataservice.limits.local import LocalLimits
from dataservice.limits.slots import RETRY_AT_CAP_MS, Entry, Slot
from dataservice.refusals import Reason, Rejected
from tests.harness.support import now_ms

LIMITED = "tests-limited"  # 20/s, burst 5, 2 interactive requests at once


@pytest.fixture(params=["redis", "local"])
def limits(request: pytest.FixtureRequest, config: Config) -> CallerLimits:
    if request.param == "redis":
        client: redis.Redis = request.getfixturevalue("redis_client")
        return RedisLimits(client, config)
    return LocalLimits(config, replicas=1)


@pytest.fixture
def caller() -> str:
    """A caller of the test's own: its Redis keys are new."""
    return f"limits-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def policy(config: Config) -> CallerPolicy:
    return config.callers[LIMITED]


Enter = Callable[..., Slot]


@pytest.fixture
def enter(limits: CallerLimits, caller: str) -> Enter:
    def _enter(
        policy: CallerPolicy, *, capped: bool = False, request_id: str = "", cost: int = 1
    ) -> Slot:
        now = now_ms()
        rid = request_id or uuid.uuid4().hex
        return limits.enter(Entry(policy, caller, rid, now + 2000, now, capped, cost=cost))

    return _enter


def _outcome(enter: Enter, policy: CallerPolicy, *, capped: bool = False, cost: int = 1) -> str:
    try:
        enter(policy, capped=capped, cost=cost)
    except Rejected as rejected:
        return rejected.reason.value
    return "admitted"


def test_the_burst_passes_then_the_rate_holds(enter: Enter, policy: CallerPolicy) -> None:
    outcomes = [_outcome(enter, policy) for _ in range(policy.burst + 3)]
    assert outcomes[: policy.burst] == ["admitted"] * policy.burst
    assert set(outcomes[policy.burst :]) == {"rate_limited"}
    with pytest.raises(Rejected) as caught:
        enter(policy)
    # Told when a token will be there: one interval (50 ms) at most.
    assert 0 < caught.value.retry_after_ms <= 1000 / policy.rate_per_s + 1
    time.sleep(caught.value.retry_after_ms / 1000 + 0.01)
    assert _outcome(enter, policy) == "admitted"


def test_the_rate_refills_at_the_rate(enter: Enter, policy: CallerPolicy) -> None:
    fast = policy.model_copy(update={"rate_per_s": 50.0, "burst": 1})
    assert _outcome(enter, fast) == "admitted"
    assert _outcome(enter, fast) == "rate_limited"
    time.sleep(1 / fast.rate_per_s + 0.005)
    assert _outcome(enter, fast) == "admitted"


def test_a_batch_passes_on_one_token_and_its_caller_waits_out_the_rest(
    enter: Enter, policy: CallerPolicy
) -> None:
    # One message of three operations leaves two tokens of the burst of five.
    assert _outcome(enter, policy, cost=3) == "admitted"
    # A second of three passes on what is left; the third of its operations is debt.
    assert _outcome(enter, policy, cost=3) == "admitted"
    with pytest.raises(Rejected) as caught:
        enter(policy)
    # The debt (one interval) plus the interval of the request itself.
    interval_ms = 1000 / policy.rate_per_s
    assert interval_ms < caught.value.retry_after_ms <= 2 * interval_ms + 1


def test_a_batch_larger_than_the_burst_passes_once(enter: Enter, policy: CallerPolicy) -> None:
    big = 4 * policy.burst
    assert _outcome(enter, policy, cost=big) == "admitted"
    with pytest.raises(Rejected) as caught:
        enter(policy, cost=big)
    # Its caller now waits for what it took beyond the burst.
    interval_ms = 1000 / policy.rate_per_s
    assert caught.value.retry_after_ms > (big - policy.burst) * interval_ms


def test_a_sender_waits_until_a_batch_fits_where_the_service_would_take_it_on_debt() -> None:
    rate = Rate.per_second(20, 5)
    now = 1_000_000
    tat, _ = check(None, now, rate.paced(3))
    # Two tokens are left: a sender holds a second batch of three back...
    assert check(tat, now, rate.paced(3))[0] == 0
    # ...which the service, charged later by its own clock, would still take.
    assert check(tat, now, rate.charged(3))[0] == tat + 3 * rate.interval_us
    # A sender never waits for more than the burst.
    assert check(None, now, rate.paced(4 * 5))[0] == now + 20 * rate.interval_us


def test_the_in_flight_cap_holds_until_a_slot_is_given_back(
    limits: CallerLimits, enter: Enter, policy: CallerPolicy
) -> None:
    generous = policy.model_copy(update={"rate_per_s": 10_000.0, "burst": 100})
    slots = [enter(generous, capped=True) for _ in range(generous.max_interactive)]
    with pytest.raises(Rejected) as caught:
        enter(generous, capped=True)
    assert caught.value.reason is Reason.CONCURRENCY_LIMITED
    assert caught.value.retry_after_ms == RETRY_AT_CAP_MS
    # Uncapped (batch) requests are not counted against it.
    assert _outcome(enter, generous, capped=False) == "admitted"
    limits.leave(slots[0])
    assert _outcome(enter, generous, capped=True) == "admitted"


def test_a_request_refused_at_the_cap_takes_no_token(
    limits: CallerLimits, enter: Enter, policy: CallerPolicy
) -> None:
    tight = policy.model_copy(update={"rate_per_s": 0.5, "burst": 2, "max_interactive": 1})
    first = enter(tight, capped=True)
    assert _outcome(enter, tight, capped=True) == "concurrency_limited"
    limits.leave(first)
    # The refused request left the second token where it was.
    assert _outcome(enter, tight, capped=True) == "admitted"
    assert _outcome(enter, tight, capped=False) == "rate_limited"


def test_a_replayed_id_is_refused(enter: Enter, policy: CallerPolicy) -> None:
    generous = policy.model_copy(update={"rate_per_s": 10_000.0, "burst": 100})
    request_id = uuid.uuid4().hex
    enter(generous, request_id=request_id)
    with pytest.raises(Rejected) as caught:
        enter(generous, request_id=request_id)
    assert caught.value.reason is Reason.REPLAYED


def test_a_refused_id_is_still_remembered(enter: Enter, policy: CallerPolicy) -> None:
    one = policy.model_copy(update={"rate_per_s": 0.5, "burst": 1})
    enter(one)
    request_id = uuid.uuid4().hex
    assert _outcome_of(enter, one, request_id) == "rate_limited"
    assert _outcome_of(enter, one, request_id) == "replayed"


def _outcome_of(enter: Enter, policy: CallerPolicy, request_id: str) -> str:
    try:
        enter(policy, request_id=request_id)
    except Rejected as rejected:
        return rejected.reason.value
    return "admitted"


def test_callers_are_limited_apart(limits: CallerLimits, caller: str, policy: CallerPolicy) -> None:
    one = policy.model_copy(update={"rate_per_s": 0.5, "burst": 1})
    other = f"{caller}-other"
    now = now_ms()
    limits.enter(Entry(one, caller, uuid.uuid4().hex, now + 2000, now, False))
    with pytest.raises(Rejected):
        limits.enter(Entry(one, caller, uuid.uuid4().hex, now + 2000, now, False))
    limits.enter(Entry(one, other, uuid.uuid4().hex, now + 2000, now, False))
