"""Admission: a lane's queue is bounded by messages and bytes, and a request
that could not be served before its deadline is refused instead of joining it.

The check and the push are one Lua script (``admit.lua``), run by the
broker channel (:mod:`dataservice.broker.redis`) in place of kombu's plain LPUSH,
so concurrent producers cannot overshoot: the queue never holds more than
``admission.max_messages``, and queued plus in-flight envelopes never exceed
``admission.max_bytes``, however many publish at once. A refusal is a fast,
retryable ``RESOURCE_EXHAUSTED`` whose retry-after is the time the queue needs
to drain enough at its measured rate. Workers give the bytes back, and count
the completion that the rate is measured from, in the same Redis transaction
that stores the answer.

"Could not be served in time" is the queue ahead of the request at the lane's
measured drain rate, plus how long a request of its operation takes once
dequeued: the workers measure that (the p90 of answered requests, per
operation) and say it every second (:func:`publish_service_times`); an
estimate the workers stopped renewing more than ``SERVICE_STALE_MS`` ago is not
relied on, and without one the queue alone decides, as at a cold start. The
drain rate refuses only once a window measured the lane busy (messages waiting
in the list): what a quiet lane drained is a floor, not what it can drain.

What waits is the lane's admitted requests not yet done, less those the
workers have in hand (drain rate x mean service time): the workers' prefetch
waits as much as the list, and a message a worker holds while it waits for a
permit (more threads than permits: the batch lane) is in hand, its wait part
of the service time that the p90 adds for the request itself.
A queue that stands is also held to a target wait (``admission.target_wait_ms``,
controlled delay): once no publish has found nothing waiting for
``STANDING_AFTER_MS``, in a lane measured busy lately, a request is admitted
only if its expected wait is within the target, and after a refusal for it,
until the wait is back within three quarters of it. A burst into an idle lane
may still queue up to its deadline; sustained overload keeps a short queue
whose answers come well inside their deadlines, and the rest is
refused at publish instead of timing out in the queue.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis
from redis.asyncio import Redis as AsyncRedis

from dataservice.codec.requests import OPERATIONS
from dataservice.config.model import Config
from dataservice.errors import ResourceExhausted
from dataservice.limits.pacing import Pacing
from dataservice.redis.keys import EPOCH_KEY, admission_key, held_key, pace_key
from dataservice.redis.scripts import LuaScript
from dataservice.refusals import LIMIT_MESSAGES, Reason, Refusal

# The request's deadline (Unix ms) as a message header. Celery's own `expires`
# is not used: a message Celery drops as expired never reaches the handler, so
# its bytes would never be given back to admission.
DEADLINE_HEADER = "ds_deadline_ms"
# The bytes admission counted for a message, carried with it so that the
# worker gives back exactly that, whatever the message's body was.
SIZE_HEADER = "ds_size"
# Who is publishing, for publish-side pacing (not trusted: the workers verify
# the signed envelope and apply the authoritative limit).
CALLER_HEADER = "ds_caller"
# The request's operation, for its service time (advisory too: a caller that
# names another only misleads admission about its own request).
OPERATION_HEADER = "ds_op"
# How many operations a batch message carries (absent: one). Admission counts
# operations, not messages; the worker gives back what the header said, and
# charges the caller's rate for what the signed envelope holds.
OPS_HEADER = "ds_ops"
# A service time the workers have not renewed for this long is not relied on.
SERVICE_STALE_MS = 5000
# A queue that has had something waiting for this long stands: not one burst
# but arrivals outrunning the drain (controlled delay's interval).
STANDING_AFTER_MS = 100
SERVICE_PREFIX = "service:"
MEAN_PREFIX = "mean:"

ADMIT = LuaScript("admit.lua", __package__)
_WITHDRAW = LuaScript("withdraw.lua", __package__)
_SERVICE = LuaScript("service.lua", __package__)


class AdmissionRefused(Refusal):
    """The lane's queue is full or too long for the request's deadline, or the
    caller is over its rate. ``sent``: how many messages of the same publish
    went out before this one."""

    reason: Reason

    def __init__(self, reason: Reason, retry_after_ms: int, sent: int = 0) -> None:
        super().__init__(
            f"admission refused the request ({reason.value})",
            reason=reason,
            retry_after_ms=retry_after_ms,
        )
        self.sent = sent
        # The broker's epoch those went out in.
        self.epoch = ""

    def error(self, accepted: tuple[object, ...] = ()) -> ResourceExhausted:
        """The publisher's error for this refusal (``accepted``: what went before it)."""
        rate = self.reason is Reason.RATE_LIMITED
        return ResourceExhausted(
            LIMIT_MESSAGES[self.reason] + ("; not queued" if rate else "; retry later"),
            retry_after=self.retry_after_ms / 1000,
            reason=self.reason,
            accepted=accepted,
        )


@dataclass(frozen=True, slots=True)
class LaneAdmission:
    max_messages: int
    max_bytes: int
    target_wait_ms: int
    default_deadline_ms: int
    max_deadline_ms: int
    stats_key: str
    held_key: str


# How long past its deadline a held request still counts (admit.lua's
# HELD_GRACE_MS; a test keeps the two equal), and on RabbitMQ, where a
# message expires at its deadline unseen (HELD_GRACE_ELSEWHERE_MS).
HELD_GRACE_MS = 5000
HELD_GRACE_ELSEWHERE_MS = 250


def books_expiry_ms(lane: LaneAdmission) -> int:
    """How long a lane's books (``stats_key``, ``held_key``) outlive its last
    publish: its longest deadline and a minute (``admit.lua``'s ARGV[7])."""
    return lane.max_deadline_ms + 60_000


def held_member(request_id: str, size: int, ops: int = 1) -> str:
    """A request among its lane's held ones (``held_key``): its id, the
    operations of a batch, and the envelope bytes admission counted for it,
    as ``admit.lua`` builds it too."""
    return f"{request_id}:{size}" if ops <= 1 else f"{request_id}:{ops}:{size}"


def message_ops(message: dict[str, Any]) -> int:
    """The operations a message carries, as its header says (1 unless a batch)."""
    value = message.get("headers", {}).get(OPS_HEADER)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return 1
    return value


def held_size(member: str) -> int:
    """The bytes a :func:`held_member` counts."""
    return int(member.rsplit(":", 1)[1])


def lane_admissions(config: Config) -> dict[str, dict[str, Any]]:
    """Admission bounds by queue name, as plain data: they travel in the broker's
    transport options, which Celery reports (as JSON) to monitoring tools."""
    return {
        lane.queue: asdict(
            LaneAdmission(
                max_messages=lane.admission.max_messages,
                max_bytes=lane.admission.max_bytes,
                target_wait_ms=lane.admission.target_wait_ms or 0,
                default_deadline_ms=lane.default_deadline_ms,
                max_deadline_ms=lane.max_deadline_ms,
                stats_key=admission_key(lane.queue),
                held_key=held_key(lane.queue),
            )
        )
        for lane in (config.lanes.interactive, config.lanes.batch)
    }


def lane_admission_bounds(config: Config) -> dict[str, LaneAdmission]:
    """:func:`lane_admissions`, as the admission script's callers use them."""
    return {queue: LaneAdmission(**lane) for queue, lane in lane_admissions(config).items()}


def envelope_size(message: dict[str, Any]) -> int:
    """The envelope's size, from the base64 body kombu stores (without decoding it)."""
    body = message.get("body", "")
    if message.get("properties", {}).get("body_encoding") != "base64" or not isinstance(body, str):
        return len(body)
    return len(body) * 3 // 4 - (len(body) - len(body.rstrip("=")))


def _admitted_size(message: dict[str, Any]) -> int:
    """The size the publisher's channel recorded in the message, else measured here."""
    size = message.get("headers", {}).get(SIZE_HEADER)
    return size if isinstance(size, int) else envelope_size(message)


def remaining_ms(message: dict[str, Any], fallback_ms: int) -> int:
    """The time the request has left, from its deadline header, else ``fallback_ms``."""
    value = message.get("headers", {}).get(DEADLINE_HEADER)
    if not isinstance(value, int) or isinstance(value, bool):
        return fallback_ms
    return value - time.time_ns() // 1_000_000


def caller_pacing(config: Config) -> dict[str, tuple[int, float]]:
    """Each caller's emission interval (µs) and burst, as the workers' gate applies them
    (plain data: it travels in the broker's transport options, like the bounds)."""
    return {
        caller: (policy.rate.interval_us, policy.rate.burst)
        for caller, policy in config.callers.items()
    }


def admit(
    client: redis.Redis,
    queue_key: str,
    lane: LaneAdmission,
    encoded: str,
    message: dict[str, Any],
    pacing: Pacing | None = None,
) -> str:
    """Push ``encoded`` onto the lane's queue and return the broker's epoch
    (:data:`~dataservice.redis.keys.EPOCH_KEY`) it was pushed in, or raise
    AdmissionRefused.

    With ``pacing``, a message whose caller header names a known caller is
    also held to that caller's rate (:mod:`dataservice.limits.pacing`)."""
    answer = ADMIT(client, *admit_call(queue_key, lane, encoded, message, pacing))
    return admitted(answer, pacing, caller_of(message))


def admit_call(
    queue_key: str,
    lane: LaneAdmission,
    encoded: str,
    message: dict[str, Any],
    pacing: Pacing | None = None,
    *,
    elsewhere: bool = False,
) -> tuple[list[str], list[Any]]:
    """The keys and arguments of :data:`ADMIT` for :func:`admit`'s push (for a
    client that runs the script itself, on an asyncio connection); with
    ``elsewhere`` (the queue is on another broker), for admission alone:
    nothing is pushed, and the caller publishes once admitted."""
    keys = [queue_key, lane.stats_key, lane.held_key, EPOCH_KEY]
    operation = message.get("headers", {}).get(OPERATION_HEADER)
    args: list[Any] = [
        encoded,
        _admitted_size(message),
        lane.max_messages,
        lane.max_bytes,
        remaining_ms(message, lane.max_deadline_ms),
        lane.default_deadline_ms,
        books_expiry_ms(lane),
        SERVICE_PREFIX + operation if operation in OPERATIONS else "",
        SERVICE_STALE_MS,
        lane.target_wait_ms,
        STANDING_AFTER_MS,
        secrets.token_hex(8),
        str(message.get("headers", {}).get("id", "")),
    ]
    ops = message_ops(message)
    caller = message.get("headers", {}).get(CALLER_HEADER)
    # One step charges a batch's every operation, paced (config/rate.py, Rate.paced).
    step = pacing.step(caller, ops) if pacing is not None else None
    if step is not None:
        keys.append(pace_key(str(caller)))
        args += [step.rate.interval_us, step.rate.burst]
    else:
        args += [0, 0]
    mean = MEAN_PREFIX + operation if operation in OPERATIONS else ""
    args += [ops, "1" if elsewhere else "", mean, step.lease if step is not None else 0]
    return keys, args


def withdraw(
    client: redis.Redis,
    lane: LaneAdmission,
    message: dict[str, Any],
    reason: Reason | None,
) -> None:
    """Take a message admitted ``elsewhere`` (:func:`admit_call`) back out of
    admission's books: the broker refused it (``reason``, counted as a
    refusal) or was not reached (None)."""
    _WITHDRAW(client, *_withdraw_call(lane, message, reason))


async def withdraw_async(
    client: AsyncRedis, lane: LaneAdmission, message: dict[str, Any], reason: Reason | None
) -> None:
    """:func:`withdraw`, on an asyncio client."""
    await _WITHDRAW.run_async(client, *_withdraw_call(lane, message, reason))


def _withdraw_call(
    lane: LaneAdmission, message: dict[str, Any], reason: Reason | None
) -> tuple[list[str], list[Any]]:
    size, ops = _admitted_size(message), message_ops(message)
    member = held_member(str(message.get("headers", {}).get("id", "")), size, ops)
    return [lane.stats_key, lane.held_key], [member, size, ops, reason.value if reason else ""]


def admitted(answer: Any, pacing: Pacing | None = None, caller: object = None) -> str:
    """The epoch :data:`ADMIT` (or the publish interface, which answers as it
    does) answered with, or its refusal raised; a lease it took for
    ``caller`` goes to ``pacing``."""
    reason = answer[0].decode() if isinstance(answer[0], bytes) else str(answer[0])
    if reason:
        raise AdmissionRefused(Reason(reason), int(answer[1]))
    if pacing is not None and len(answer) > 2 and int(answer[2]) > 0:
        pacing.granted(caller, int(answer[2]))
    return answer[1].decode() if isinstance(answer[1], bytes) else str(answer[1])


def caller_of(message: dict[str, Any]) -> object:
    """The caller a message's header names (None: none)."""
    return message.get("headers", {}).get(CALLER_HEADER)


def publish_service_times(
    client: redis.Redis,
    lane: LaneAdmission,
    p90_ms: dict[str, float],
    mean_ms: dict[str, float],
) -> None:
    """Say how long each operation's answered requests take once dequeued:
    their p90 and their mean (``service.lua``, stamped with Redis's clock)."""
    pairs: list[Any] = []
    for operation, ms in sorted(p90_ms.items()):
        if operation in OPERATIONS:
            pairs += [SERVICE_PREFIX + operation, round(ms, 1)]
    for operation, ms in sorted(mean_ms.items()):
        if operation in OPERATIONS:
            pairs += [MEAN_PREFIX + operation, round(ms, 1)]
    if pairs:
        _SERVICE(client, [lane.stats_key, lane.held_key], [books_expiry_ms(lane), *pairs])
