"""The broker's epoch follows a Sentinel-managed primary: ``epoch.lua`` ends
it when the primary is another server, once, and keeps it otherwise."""

from __future__ import annotations

import redis

from dataservice.broker.failover import EPOCH, keep_epoch
from dataservice.redis.keys import EPOCH_KEY, EPOCH_SERVER_KEY, admission_key

KEYS = [EPOCH_KEY, EPOCH_SERVER_KEY, admission_key("interactive"), admission_key("batch")]


def test_the_first_claim_keeps_the_epoch_and_another_primary_ends_it_once(
    redis_client: redis.Redis,
) -> None:
    redis_client.delete(*KEYS)
    redis_client.set(EPOCH_KEY, "e1")
    redis_client.hset(admission_key("interactive"), mapping={"epoch": "e1", "held": 3})
    assert EPOCH(redis_client, KEYS, ["10.0.0.1:6379", "e2"]) == 0
    assert redis_client.get(EPOCH_KEY) == b"e1"
    assert EPOCH(redis_client, KEYS, ["10.0.0.1:6379", "e3"]) == 0
    assert redis_client.get(EPOCH_KEY) == b"e1"
    # The replica promoted: one process ends the epoch, the next finds it done.
    assert EPOCH(redis_client, KEYS, ["10.0.0.2:6379", "e4"]) == 1
    assert EPOCH(redis_client, KEYS, ["10.0.0.2:6379", "e5"]) == 0
    assert redis_client.get(EPOCH_KEY) == b"e4"
    assert redis_client.get(EPOCH_SERVER_KEY) == b"10.0.0.2:6379"
    # admit.lua's copy goes, the rest of the books stay.
    assert redis_client.hgetall(admission_key("interactive")) == {b"held": b"3"}
    assert not redis_client.exists(admission_key("batch"))


def test_a_client_of_one_server_has_no_primary_to_follow(redis_client: redis.Redis) -> None:
    redis_client.delete(*KEYS)
    assert keep_epoch(redis_client, ["interactive", "batch"]) is False
    assert not redis_client.exists(EPOCH_SERVER_KEY)
