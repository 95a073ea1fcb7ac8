"""Per-caller limits shared by every replica: replay memory, rate and in-flight cap.

One Lua script (``gate.lua``) checks and records all three in Redis, so a
request is counted once, by every replica alike, and two replicas can never
both take a caller's last token or last slot.

When Redis cannot be reached the gate does not become unlimited: it falls
back to this replica's share (:mod:`dataservice.limits.local`) and tries
Redis again after ``REDIS_RETRY_S``; the fallback is logged and counted.
Both backends keep one contract (``tests/limits/test_limits_contract.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from dataservice.config.model import CallerPolicy, Config
from dataservice.enums import CacheFormat
from dataservice.limits.local import LocalLimits
from dataservice.limits.slots import RETRY_AT_CAP_MS, Entry, Slot, rejection
from dataservice.redis.keys import inflight_key, rate_key, replay_key
from dataservice.redis.scripts import LuaScript
from dataservice.refusals import Reason

log = logging.getLogger(__name__)

REDIS_RETRY_S = 1.0
_SCRIPT = LuaScript("gate.lua", __package__)
_HIT = LuaScript("hit.lua", __package__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message's delivery, to record in the same round trip once the request
    is admitted, as kombu would (``limits/delivered.lua``; the broker being
    this Redis): kombu's unacknowledged index and hash, the delivery tag, the
    message as kombu keeps it, and when it was delivered (Unix s).
    ``pending``: nothing recorded it yet, so a request answered in that round
    trip has no record to remove."""

    index: str
    unacked: str
    tag: str
    record: str
    score: float
    pending: bool = False


@dataclass(frozen=True, slots=True)
class HitAnswer:
    """What ``hit.lua`` needs to answer a hit whole: ``key``, the answer's list
    (or the reply channel the request named); ``prefix``, the encoded
    ResponseEnvelope without its result (request id and an OK status); ``ttl_ms``,
    how long the answer is kept; ``admission_key`` and ``held`` (sorted set,
    member), the request's place in its lane's admission; ``size``, the bytes
    admission counted for it; ``ack``, its message's acknowledgement (kombu's
    unacked index, its unacked hash, the delivery tag)."""

    key: str
    prefix: bytes
    ttl_ms: int
    admission_key: str
    held: tuple[str, str]
    size: int
    ack: tuple[str, str, str]

    def keys_and_args(self, delivery: Delivery | None) -> tuple[list[str], list[Any]]:
        """``hit.lua``'s own KEYS[5..9] and ARGV[9..13], with ``delivery``
        ARGV[14..15]: the one place that knows their order."""
        index, unacked, tag = self.ack
        held_key, held_member = self.held
        keys = [self.key, self.admission_key, index, unacked, held_key]
        args: list[Any] = [self.prefix, self.ttl_ms, self.size, tag, held_member]
        if delivery is not None:
            # Its unacknowledged keys and tag are the answer's own.
            args += [delivery.record, delivery.score, "1" if delivery.pending else ""]
        return keys, args


@dataclass(frozen=True, slots=True)
class Peek:
    """A cache entry to read once the request is admitted, in the same round
    trip; with ``answer``, a hit is answered there too
    (``dataservice/limits/hit.lua``). ``fmt``: the entry's format, which the
    round trip's time is counted under."""

    key: str
    answer: HitAnswer | None = None
    fmt: CacheFormat = CacheFormat.V2


@dataclass(frozen=True, slots=True)
class Peeked:
    """What the gate read for an admitted request: ``looked`` whether it read
    at all, ``value`` what the key held (None: nothing), ``answered`` whether
    the hit was answered in the same step (``Peek.answer``), ``recorded``
    whether a :class:`Delivery` was recorded."""

    looked: bool
    value: bytes | None = None
    answered: bool = False
    recorded: bool = False


NOT_LOOKED = Peeked(False)


class CallerLimits(Protocol):
    """Take a request's place under its caller's limits, or raise :class:`Rejected`."""

    def enter(self, entry: Entry) -> Slot: ...

    def leave(self, slot: Slot) -> None: ...


class RedisLimits:
    """The limits in Redis, shared by every replica; raises ``redis.RedisError``
    when Redis does not answer."""

    def __init__(self, client: redis.Redis, config: Config) -> None:
        self._redis = client
        self._skew_ms = config.auth.max_clock_skew_ms
        self._grace_ms = config.results.grace_ms

    def enter(self, entry: Entry) -> Slot:
        return self.enter_peeking(entry, None)[0]

    def enter_peeking(
        self, entry: Entry, peek: Peek | None, delivery: Delivery | None = None
    ) -> tuple[Slot, Peeked]:
        """The slot, and with ``peek`` what its key holds, read only if
        admitted; ``delivery`` is then recorded too (unless answered)."""
        caller, request_id = entry.caller, entry.request_id
        rate = entry.policy.rate.charged(entry.cost)
        # Beyond its deadline (plus the skew) a replay would be dropped as late anyway.
        remember_ms = max(1, entry.deadline_ms - entry.now_ms + self._skew_ms)
        keys = [replay_key(caller, request_id), rate_key(caller), inflight_key(caller)]
        script, more_keys = _SCRIPT, []
        more_args: list[Any] = []
        if peek is not None:
            more_keys.append(peek.key)
        if peek is not None and peek.answer is not None:
            script = _HIT
            hit_keys, more_args = peek.answer.keys_and_args(delivery)
            more_keys += hit_keys
        elif delivery is not None:
            more_keys += [delivery.index, delivery.unacked]
            more_args += [delivery.tag, delivery.record, delivery.score]
        reason, retry_ms, *peeked = script(
            self._redis,
            [*keys, *more_keys],
            [
                remember_ms,
                rate.interval_us,
                rate.burst,
                entry.policy.max_interactive if entry.capped else 0,
                request_id,
                entry.deadline_ms + self._grace_ms,
                RETRY_AT_CAP_MS,
                1 if entry.redelivered else 0,
                *more_args,
            ],
        )
        if reason:
            name = reason.decode() if isinstance(reason, bytes) else str(reason)
            raise rejection(Reason(name), caller, int(retry_ms))
        slot = Slot(caller, request_id, entry.capped, local=False, in_redis=entry.capped)
        recorded = delivery is not None
        if peek is None:
            return slot, Peeked(False, recorded=recorded)
        if peek.answer is not None:
            answered = bool(peeked) and peeked[0] == b"hit"
            # A hit's slot went back with its answer.
            return dataclasses.replace(slot, in_redis=not answered and slot.in_redis), Peeked(
                True, None, answered, recorded and not answered
            )
        value = peeked[0] if peeked and isinstance(peeked[0], bytes) else None
        return slot, Peeked(True, value, recorded=recorded)

    def leave(self, slot: Slot) -> None:
        if slot.in_redis:
            self._redis.zrem(inflight_key(slot.caller), slot.request_id)


class Gate:
    """Admits a caller's request against its shared limits, or rejects it."""

    def __init__(
        self,
        client: redis.Redis,
        config: Config,
        on_fallback: Callable[[], None] = lambda: None,
    ) -> None:
        self._shared = RedisLimits(client, config)
        self._local = LocalLimits(config, config.budget.max_replicas)
        self._redis_retry_at = 0.0
        self._on_fallback = on_fallback

    def enter(
        self,
        policy: CallerPolicy,
        caller: str,
        request_id: str,
        deadline_ms: int,
        now_ms: int,
        *,
        capped: bool,
        redelivered: bool = False,
    ) -> Slot:
        """Take the request's place, or raise :class:`~dataservice.refusals.Rejected`."""
        entry = Entry(policy, caller, request_id, deadline_ms, now_ms, capped, redelivered)
        return self.enter_peeking(entry, None)[0]

    def enter_peeking(
        self, entry: Entry, peek: Peek | None, delivery: Delivery | None = None
    ) -> tuple[Slot, Peeked]:
        """:meth:`enter`; with ``peek`` (a cache key), the same round trip
        reads it once the request is admitted (:class:`Peeked`), and records
        ``delivery``. On this replica's own limits nothing is read or recorded."""
        uncertain = False
        if time.monotonic() >= self._redis_retry_at:
            try:
                return self._shared.enter_peeking(entry, peek, delivery)
            except redis.RedisError as exc:
                log.warning("limits fall back to this replica's share: %s", type(exc).__name__)
                self._redis_retry_at = time.monotonic() + REDIS_RETRY_S
                self._on_fallback()
                # The script may have run before the reply was lost: its slot,
                # if any, is given back with this one.
                uncertain = entry.capped
        slot = self._local.enter(entry)
        return dataclasses.replace(slot, in_redis=uncertain), NOT_LOOKED

    @staticmethod
    def slot_member(slot: Slot) -> tuple[str, str] | None:
        """Where a slot may live in Redis (sorted set, member); None if nowhere."""
        if not slot.in_redis:
            return None
        return inflight_key(slot.caller), slot.request_id

    def leave(self, slot: Slot, *, released_in_redis: bool = False) -> None:
        """Give the slot back (its Redis part unless ``released_in_redis``); one
        that cannot be given back lapses at its deadline plus the grace."""
        self._local.leave(slot)
        if released_in_redis:
            return
        try:
            self._shared.leave(slot)
        except redis.RedisError as exc:
            log.warning("could not release an in-flight slot: %s", type(exc).__name__)
