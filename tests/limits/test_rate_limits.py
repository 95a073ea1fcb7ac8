"""Per-caller limits: the shared gate in Redis, its fallback when Redis is
away, and a client that honours the retry-after of a rate refusal."""

from __future__ import annotations

import uuid

import pytest
import redis

from dataservice import ReadMode, ResourceExhausted
from dataservice.config.model import CallerPolicy, Config
from dataservice.config.settings import Settings
from dataservice.errors import NotFound
from dataservice.limits.gate import Gate
from dataservice.redis.keys import inflight_key, pace_key, rate_key
from dataservice.refusals import Rejected
from tests.harness.clients import ClientKind, make_client
from tests.harness.support import counter, now_ms, with_retry

LIMITED = "tests-limited"


@pytest.fixture
def gate(config: Config, redis_client: redis.Redis) -> Gate:
    for key in redis_client.scan_iter(f"ds:*:{LIMITED}*"):
        redis_client.delete(key)
    return Gate(redis_client, config)


def _enter(gate: Gate, policy: CallerPolicy, *, capped: bool = False) -> object:
    return gate.enter(policy, LIMITED, uuid.uuid4().hex, now_ms() + 2000, now_ms(), capped=capped)


def _reason(gate: Gate, policy: CallerPolicy, *, capped: bool = False) -> str:
    try:
        _enter(gate, policy, capped=capped)
    except Rejected as rejected:
        return rejected.reason.value
    return "admitted"


@pytest.mark.slow
def test_without_redis_each_replica_keeps_to_its_share(config: Config) -> None:
    fallbacks: list[None] = []
    unreachable = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    gate = Gate(unreachable, config, on_fallback=lambda: fallbacks.append(None))
    policy = config.callers[LIMITED].model_copy(update={"rate_per_s": 100.0, "burst": 20})
    outcomes = [_reason(gate, policy) for _ in range(5)]
    # 20 / 10 replicas = a burst of 2 here; never unlimited.
    assert outcomes == ["admitted", "admitted", "rate_limited", "rate_limited", "rate_limited"]
    assert len(fallbacks) == 1  # Redis is tried again only after a pause

    gate = Gate(unreachable, config)
    request_id = uuid.uuid4().hex
    generous = policy.model_copy(update={"rate_per_s": 10_000.0, "burst": 1000})
    gate.enter(generous, LIMITED, request_id, now_ms() + 2000, now_ms(), capped=False)
    with pytest.raises(Rejected, match="replayed"):
        gate.enter(generous, LIMITED, request_id, now_ms() + 2000, now_ms(), capped=False)
    cap = max(1, generous.max_interactive // config.budget.max_replicas)
    for _ in range(cap):
        _enter(gate, generous, capped=True)
    assert _reason(gate, generous, capped=True) == "concurrency_limited"


@pytest.mark.usefixtures("interactive_worker")
def test_a_client_holds_back_until_the_retry_after(
    client_kind: ClientKind,
    settings: Settings,
    config: Config,
    scope: str,
    redis_client: redis.Redis,
) -> None:
    # Neither the service's rate nor admission's pace remembers an earlier run.
    redis_client.delete(rate_key(LIMITED), pace_key(LIMITED))
    single = with_retry(config, max_attempts=1)
    refused_by_service = counter(
        "dataservice_rejections", lane="interactive", reason="rate_limited"
    )
    outcomes: list[str] = []
    refusals: list[ResourceExhausted] = []
    with make_client(client_kind, LIMITED, settings, single) as client:
        for _ in range(40):
            try:
                client.read(scope, "missing", mode=ReadMode.PRIMARY)
            except NotFound:
                outcomes.append("served")
            except ResourceExhausted as exc:
                refusals.append(exc)
                outcomes.append("refused")
    assert all(r.reason == "rate_limited" and r.retry_after > 0 for r in refusals)
    served = outcomes.count("served")
    sent_and_refused = (
        counter("dataservice_rejections", lane="interactive", reason="rate_limited")
        - refused_by_service
    )
    assert served >= config.callers[LIMITED].burst
    assert outcomes.count("refused") > 0
    # Every slot went back with its answer.
    assert redis_client.zcard(inflight_key(LIMITED)) == 0
    # Most refusals never left the process: the service saw only a few.
    assert sent_and_refused < outcomes.count("refused") / 2, (served, sent_and_refused)
