"""``hit.lua``: a cached read answered by the gate's own script, byte for byte
the answer the worker would encode, with the request leaving its lane and its
message acknowledged in the same step: what ``answer.lua`` leaves for the same
answer, since both leave it by one fragment (``broker/leave_answer.lua``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

import dataservice
from dataservice.broker.results import Completion, ResultStore
from dataservice.cache.formats import CODECS, frame
from dataservice.config.model import Config
from dataservice.enums import CacheFormat
from dataservice.limits.admission import held_member
from dataservice.limits.gate import Delivery, Gate, HitAnswer, Peek
from dataservice.limits.slots import Entry
from dataservice.proto import pb
from dataservice.redis.keys import (
    admission_key,
    held_key,
    inflight_key,
    record_key,
    reply_key,
    result_key,
)
from dataservice.refusals import Reason, Rejected
from tests.harness.support import now_ms

INDEX, UNACKED = "hit-test-unacked-index", "hit-test-unacked"


def _request(
    config: Config, redis_client: redis.Redis, scope: str, size: int, answer_key: str = ""
) -> tuple:
    request_id = uuid.uuid4().hex
    tag = str(uuid.uuid4())
    redis_client.zadd(INDEX, {tag: 1.0})
    redis_client.hset(UNACKED, tag, "message")
    key = record_key("v2", scope, "a", 1)
    prefix = pb.ResponseEnvelope(
        request_id=request_id, status=pb.Status(code=pb.STATUS_CODE_OK)
    ).SerializeToString()
    held = held_key("hit-test")
    member = held_member(request_id, size)
    redis_client.zadd(held, {member: now_ms() + 60_000})
    answer = HitAnswer(
        key=answer_key or result_key("tests", request_id),
        prefix=prefix,
        ttl_ms=60_000,
        admission_key=admission_key("hit-test"),
        held=(held, member),
        size=size,
        ack=(INDEX, UNACKED, tag),
    )
    peek = Peek(key, answer)
    entry = Entry(config.callers["tests"], "tests", request_id, now_ms() + 5_000, now_ms(), True)
    return request_id, tag, peek, entry


def _cache(redis_client: redis.Redis, scope: str, record: pb.Record) -> None:
    """``record`` as its v2 entry, generation 1."""
    key = record_key("v2", scope, record.object_id, 1)
    redis_client.set(key, frame(record.revision, CODECS[CacheFormat.V2].encode(record)))


def test_a_hit_is_answered_acknowledged_and_released_in_one_step(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    record = pb.Record(object_id="a", revision=3, payload=bytes(range(256)) * 4)
    body = CODECS[CacheFormat.V2].encode(record)
    redis_client.set(record_key("v2", scope, "a", 1), frame(3, body))
    redis_client.hset(admission_key("hit-test"), mapping={"bytes": 500, "done": 0})
    request_id, tag, peek, entry = _request(config, redis_client, scope, 200)

    slot, peeked = Gate(redis_client, config).enter_peeking(entry, peek)

    assert peeked.answered
    assert not slot.in_redis
    expected = pb.ResponseEnvelope(
        request_id=request_id,
        status=pb.Status(code=pb.STATUS_CODE_OK),
        read=pb.ReadRecordResponse(record=record),
    ).SerializeToString()
    assert redis_client.lrange(result_key("tests", request_id), 0, -1) == [expected]
    assert 0 < redis_client.pttl(result_key("tests", request_id)) <= 60_000
    assert redis_client.hmget(admission_key("hit-test"), "bytes", "done") == [b"300", b"1"]
    assert redis_client.zscore(inflight_key("tests"), request_id) is None
    assert redis_client.zscore(INDEX, tag) is None
    assert not redis_client.hexists(UNACKED, tag)
    assert redis_client.zscore(held_key("hit-test"), held_member(request_id, 200)) is None


def test_a_miss_is_admitted_holding_its_slot_and_nothing_is_written(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    request_id, tag, peek, entry = _request(config, redis_client, scope, 200)

    slot, peeked = Gate(redis_client, config).enter_peeking(entry, peek)

    assert peeked.looked
    assert not peeked.answered
    assert slot.in_redis
    assert redis_client.zscore(inflight_key("tests"), request_id) is not None
    assert not redis_client.exists(result_key("tests", request_id))
    assert redis_client.zscore(INDEX, tag) is not None
    Gate(redis_client, config).leave(slot)


def test_a_hit_whose_delivery_was_never_recorded_touches_no_acknowledgement(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    """kombu's record of the delivery waits for the worker's decision: a hit
    answers it in the same step, so there is nothing to remove, and a miss
    records it (limits/delivered.lua)."""
    _cache(redis_client, scope, pb.Record(object_id="a", revision=3, payload=b"cached"))
    request_id, tag, peek, entry = _request(config, redis_client, scope, 100)
    # Another message's delivery, recorded under the same tag: a hit that
    # believed its own record was there would remove it.
    delivery = Delivery(INDEX, UNACKED, tag, "message", 1.0, pending=True)

    _, peeked = Gate(redis_client, config).enter_peeking(entry, peek, delivery)

    assert peeked.answered
    assert not peeked.recorded
    assert redis_client.lrange(result_key("tests", request_id), 0, -1)
    assert redis_client.zscore(INDEX, tag) == 1.0
    assert redis_client.hget(UNACKED, tag) == b"message"


def test_a_hit_is_answered_at_the_callers_cap_and_a_miss_is_refused_there(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    """A hit holds no slot: the caller's requests being served, up to its cap,
    do not keep it from the cache. A miss would take a slot, and is refused."""
    _cache(redis_client, scope, pb.Record(object_id="a", revision=3, payload=b"cached"))
    cap = config.callers["tests"].max_interactive
    redis_client.zadd(inflight_key("tests"), {f"busy-{n}": now_ms() + 60_000 for n in range(cap)})
    gate = Gate(redis_client, config)
    try:
        _, _, peek, entry = _request(config, redis_client, scope, 100)
        _, peeked = gate.enter_peeking(entry, peek)
        assert peeked.answered
        redis_client.delete(record_key("v2", scope, "a", 1))
        _, _, peek, entry = _request(config, redis_client, scope, 100)
        with pytest.raises(Rejected) as refused:
            gate.enter_peeking(entry, peek)
        assert refused.value.reason is Reason.CONCURRENCY_LIMITED
    finally:
        redis_client.delete(inflight_key("tests"))


def test_a_hit_lengthens_a_reply_channel_that_would_lapse_before_it(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    _cache(redis_client, scope, pb.Record(object_id="a", revision=3, payload=b"cached"))
    channel = reply_key("tests", uuid.uuid4().hex)
    redis_client.rpush(channel, b"earlier")
    redis_client.pexpire(channel, 5_000)
    _, _, peek, entry = _request(config, redis_client, scope, 100, answer_key=channel)

    Gate(redis_client, config).enter_peeking(entry, peek)

    assert redis_client.llen(channel) == 2
    assert 5_000 < redis_client.pttl(channel) <= 60_000


def test_a_hit_joins_its_reply_channel_without_shortening_its_life(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    _cache(redis_client, scope, pb.Record(object_id="a", revision=3, payload=b"cached"))
    channel = reply_key("tests", uuid.uuid4().hex)
    # An earlier answer on the channel, kept longer than this one's 60 s.
    redis_client.rpush(channel, b"earlier")
    redis_client.pexpire(channel, 120_000)
    request_id, _, peek, entry = _request(config, redis_client, scope, 100, answer_key=channel)

    _, peeked = Gate(redis_client, config).enter_peeking(entry, peek)

    assert peeked.answered
    earlier, answer = redis_client.lrange(channel, 0, -1)
    assert earlier == b"earlier"
    assert pb.ResponseEnvelope.FromString(answer).request_id == request_id
    assert redis_client.pttl(channel) > 60_000
    assert not redis_client.exists(result_key("tests", request_id))


def _books(redis_client: redis.Redis, lane: str) -> dict[bytes, bytes]:
    """A lane's admission counts, but for when its first window opened."""
    books = redis_client.hgetall(admission_key(lane))
    return {k: v for k, v in books.items() if k not in (b"rate_at", b"done_at")}


def test_a_hit_leaves_what_the_workers_answer_leaves_for_the_same_answer(
    config: Config, redis_client: redis.Redis, scope: str
) -> None:
    record = pb.Record(object_id="a", revision=7, payload=bytes(range(256)) * 3)
    redis_client.set(
        record_key("v2", scope, "a", 1), frame(7, CODECS[CacheFormat.V2].encode(record))
    )
    for lane in ("hit-test", "answer-test"):
        redis_client.delete(admission_key(lane))
        redis_client.hset(admission_key(lane), mapping={"bytes": 900, "done": 4})
    request_id, hit_tag, peek, entry = _request(config, redis_client, scope, 300)

    _, peeked = Gate(redis_client, config).enter_peeking(entry, peek)
    assert peeked.answered

    # The same answer by answer.lua: the worker's encoding, on a channel of its
    # own so that the two lists can be compared, its slot and message as the
    # hit's were before.
    encoded = pb.ResponseEnvelope(
        request_id=request_id,
        status=pb.Status(code=pb.STATUS_CODE_OK),
        read=pb.ReadRecordResponse(record=record),
    ).SerializeToString()
    answer_tag = str(uuid.uuid4())
    redis_client.zadd(INDEX, {answer_tag: 1.0})
    redis_client.hset(UNACKED, answer_tag, "message")
    member = held_member(request_id, 300)
    redis_client.zadd(held_key("answer-test"), {member: now_ms() + 60_000})
    redis_client.zadd(inflight_key("tests"), {request_id: now_ms() + 60_000})
    channel = uuid.uuid4().hex
    done = Completion(
        admission_key("answer-test"),
        (held_key("answer-test"), member),
        300,
        (inflight_key("tests"), request_id),
        (INDEX, UNACKED, answer_tag),
    )
    ResultStore(redis_client).put("tests", request_id, encoded, now_ms() + 60_000, done, channel)

    by_hit = result_key("tests", request_id)
    by_answer = reply_key("tests", channel)
    assert redis_client.lrange(by_hit, 0, -1) == redis_client.lrange(by_answer, 0, -1) == [encoded]
    assert 0 < redis_client.pttl(by_hit) <= 60_000
    assert 0 < redis_client.pttl(by_answer) <= 60_000
    assert _books(redis_client, "hit-test") == _books(redis_client, "answer-test")
    assert _books(redis_client, "hit-test") == {b"bytes": b"600", b"done": b"5", b"held": b"0"}
    assert redis_client.zscore(held_key("hit-test"), member) is None
    assert redis_client.zscore(held_key("answer-test"), member) is None
    assert redis_client.zscore(inflight_key("tests"), request_id) is None
    for tag in (hit_tag, answer_tag):
        assert redis_client.zscore(INDEX, tag) is None
        assert not redis_client.hexists(UNACKED, tag)


def test_hit_and_answer_scripts_leave_an_answer_by_one_fragment() -> None:
    package = Path(dataservice.__file__).parent
    for script in ("limits/hit.lua", "broker/answer.lua"):
        lines = (package / script).read_text().splitlines()
        assert "--#include broker/leave_answer.lua" in lines, script
        # Neither writes an answer, nor acknowledges a message, by itself.
        code = [line for line in lines if not line.lstrip().startswith("--")]
        assert not any(
            command in line for line in code for command in ("RPUSH", "PEXPIRE", "HDEL")
        ), script
    # hit.lua runs from the gate alone, its arguments built by HitAnswer there.
    loaders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if 'LuaScript("hit.lua"' in path.read_text()
    ]
    assert loaders == ["limits/gate.py"]
