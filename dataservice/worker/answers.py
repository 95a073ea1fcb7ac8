"""Where an answer goes: the caller's result list (or the reply channel its
request named), with the request's admission bytes and in-flight slot given
back in the same transaction."""

from __future__ import annotations

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import redis

from dataservice.broker.results import Completion, ResultStore
from dataservice.enums import LaneName
from dataservice.handler import RequestHandler
from dataservice.handler.steps import Reply
from dataservice.limits.admission import held_member
from dataservice.limits.gate import Gate, HitAnswer
from dataservice.observe.metrics import DEPENDENCY_FAILURES, Dependency
from dataservice.proto import pb
from dataservice.redis.bounded import within
from dataservice.redis.keys import admission_key, held_key, reply_key, result_key

log = logging.getLogger(__name__)


def _bounded(seconds: float | None) -> AbstractContextManager[None]:
    return nullcontext() if seconds is None else within(seconds)


def int_header(value: Any) -> int | None:
    """A message header's integer, None if it is missing or not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _size(admitted_size: Any, body: object) -> int:
    """What admission counted for the request (its header), else the body's size."""
    size = int_header(admitted_size)
    if size is None:
        size = len(body) if isinstance(body, bytes) else 0
    return size


_OK = pb.Status(code=pb.STATUS_CODE_OK)
# An answer's Redis unreachable: the first wait before trying again, and the
# longest (doubling in between).
_RETRY_FIRST_S = 0.05
_RETRY_MOST_S = 1.0


class Answers:
    def __init__(
        self,
        results: ResultStore,
        handler: RequestHandler,
        queue: str,
        lane: LaneName,
        *,
        slots_with_answers: bool,
    ) -> None:
        self._results = results
        self._handler = handler
        self._admission_key = admission_key(queue)
        self._held_key = held_key(queue)
        self._lane = lane
        # The slot can go back with the answer only when both live on one Redis.
        self._slots_with_answers = slots_with_answers

    def deliver(
        self,
        task_id: str,
        reply: Reply | None,
        body: object,
        admitted_size: Any,
        ack: tuple[str, str, str] | None = None,
        admitted_ops: Any = None,
        *,
        each_within_s: float | None = None,
        retry_for_s: float = 0.0,
    ) -> bool:
        """Store the answer (if any), give the request's bytes back to
        admission and its in-flight slot back to the gate, and with ``ack``
        acknowledge its message, all in one step. False if Redis did not take it.

        ``each_within_s`` bounds each Redis call on its own: the slot's Redis
        (the limits') may be stalled while the answers' is not, and a slot
        given back late must not cost the answer its time. ``retry_for_s``:
        how long an answer whose Redis cannot be reached (restarting, say) is
        tried again, backing off; the message stays unacknowledged meanwhile."""
        size = _size(admitted_size, body)
        # The in-flight slot goes back in the answer's own transaction when
        # both live on one Redis: one round trip fewer per request.
        slot = reply.slot if reply is not None else None
        shared = slot is not None and self._slots_with_answers
        inflight = Gate.slot_member(slot) if slot is not None and shared else None
        # What admission counted for the message (its header), not what it holds.
        ops = max(int_header(admitted_ops) or 1, 1)
        held = (self._held_key, held_member(task_id, size, ops))
        done = Completion(self._admission_key, held, size, inflight, ack, ops)
        try:
            with _bounded(each_within_s):
                # Never raises: a slot not given back lapses on its own.
                self._handler.release(reply, released_in_redis=inflight is not None)
            with _bounded(each_within_s):
                self._store_retrying(reply, task_id, done, retry_for_s)
        except redis.RedisError as exc:
            # The work is done; its caller sees DEADLINE_EXCEEDED and may retry.
            DEPENDENCY_FAILURES.labels(self._lane.value, Dependency.RESULTS.value).inc()
            log.warning("could not deliver the answer to %s: %s", task_id, type(exc).__name__)
            return False
        finally:
            self._handler.finished(reply)
        return True

    def _store_retrying(
        self, reply: Reply | None, task_id: str, done: Completion, retry_for_s: float
    ) -> None:
        until = time.monotonic() + retry_for_s
        pause = _RETRY_FIRST_S
        while True:
            try:
                self._store(reply, task_id, done)
                return
            except (redis.ConnectionError, redis.TimeoutError):
                left = until - time.monotonic()
                if left <= 0:
                    raise
                DEPENDENCY_FAILURES.labels(self._lane.value, Dependency.RESULTS.value).inc()
                time.sleep(min(pause, left))
                pause = min(pause * 2, _RETRY_MOST_S)

    def _store(self, reply: Reply | None, task_id: str, done: Completion) -> None:
        if reply is None or not reply.caller:
            self._results.complete(done)
        else:
            self._results.put(
                reply.caller, task_id, reply.body, reply.expires_at_ms, done, reply.channel
            )

    def in_gate(
        self,
        caller: str,
        task_id: str,
        expires_at_ms: int,
        admitted_size: Any,
        body: object,
        ack: tuple[str, str, str],
        channel: str = "",
    ) -> HitAnswer | None:
        """The answer of a cache hit as ``hit.lua`` writes it, with ``ack``
        (kombu's unacked index and hash, the delivery tag); None when the
        answer would already have expired."""
        ttl_ms = expires_at_ms - time.time_ns() // 1_000_000
        if ttl_ms <= 0:
            return None
        size = _size(admitted_size, body)
        return HitAnswer(
            key=reply_key(caller, channel) if channel else result_key(caller, task_id),
            prefix=pb.ResponseEnvelope(request_id=task_id, status=_OK).SerializeToString(),
            ttl_ms=ttl_ms,
            admission_key=self._admission_key,
            held=(self._held_key, held_member(task_id, size)),
            size=size,
            ack=ack,
        )
