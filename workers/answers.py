"""Where an answer goes: the caller's result list, with the request's
admission bytes and in-flight slot given back in the same transaction."""

from __future__ import annotations

import logging
from typing import Any

import redis

from dataservice.enums import LaneName
from dataservice.limits.gate import Gate
from dataservice.metrics import DEPENDENCY_FAILURES, Dependency
from dataservice.results import Completion, ResultStore
from dataservice.worker import RequestHandler
from dataservice.worker.steps import Reply

log = logging.getLogger(__name__)


def int_header(value: Any) -> int | None:
    """A message header's integer, None if it is missing or not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Answers:
    def __init__(
        self,
        results: ResultStore,
        handler: RequestHandler,
        admission_key: str,
        lane: LaneName,
        *,
        slots_with_answers: bool,
    ) -> None:
        self._results = results
        self._handler = handler
        self._admission_key = admission_key
        self._lane = lane
        # The slot can go back with the answer only when both live on one Redis.
        self._slots_with_answers = slots_with_answers

    def deliver(self, task_id: str, reply: Reply | None, body: object, admitted_size: Any) -> None:
        """Store the answer (if any), give the request's bytes back to
        admission and its in-flight slot back to the gate."""
        size = int_header(admitted_size)
        if size is None:
            size = len(body) if isinstance(body, bytes) else 0
        # The in-flight slot goes back in the answer's own transaction when
        # both live on one Redis: one round trip fewer per request.
        slot = reply.slot if reply is not None else None
        shared = slot is not None and self._slots_with_answers
        inflight = Gate.slot_member(slot) if slot is not None and shared else None
        done = Completion(self._admission_key, size, inflight)
        try:
            self._handler.release(reply, released_in_redis=inflight is not None)
            if reply is None or not reply.caller:
                self._results.complete(done)
            else:
                self._results.put(reply.caller, task_id, reply.body, reply.expires_at_ms, done)
        except redis.RedisError as exc:
            # The work is done; its caller sees DEADLINE_EXCEEDED and may retry.
            DEPENDENCY_FAILURES.labels(self._lane.value, Dependency.RESULTS.value).inc()
            log.warning("could not deliver the answer to %s: %s", task_id, type(exc).__name__)
