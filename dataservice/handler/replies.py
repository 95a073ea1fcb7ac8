"""How the handler's outcomes become answers: encoded, counted, logged.

A refusal is counted under what it was (a reason, a dependency, a timeout's
stage: :mod:`dataservice.handler.failures`) and logged without its details
reaching the caller; every answer's encoding is timed; and a request's end
(its answer stored, or its drop) closes its trace into the request histogram
and its log line (:mod:`dataservice.observe.requestlog`).
"""

from __future__ import annotations

import logging
from collections import Counter

from dataservice.codec import error_response
from dataservice.codec.requests import MESSAGE_OPERATIONS
from dataservice.enums import LaneName, StatusCode
from dataservice.handler.durations import RecentDurations
from dataservice.handler.failures import Verdict, verdict
from dataservice.handler.steps import Reply
from dataservice.observe import trace as tracing
from dataservice.observe.metrics import DEPENDENCY_FAILURES, REJECTIONS, TIMEOUTS, Stage
from dataservice.observe.requestlog import DROPPED, Mode, RequestLog
from dataservice.proto import pb
from dataservice.refusals import Reason, Refusal

log = logging.getLogger("dataservice.handler.handler")

# Limits and the way to the database refuse by the hundred under a flood or
# a reconnect; the counter tells the story. (A dependency that failed is
# logged as a warning, whatever its reason.)
_ROUTINE_REFUSALS = frozenset(
    {
        Reason.RATE_LIMITED,
        Reason.CONCURRENCY_LIMITED,
        Reason.NO_PERMIT,
        Reason.RECONNECTING,
        Reason.COALESCING,
        Reason.RECORDS_CHANGING,
    }
)


def ok_reply(caller: str, task_id: str, response: pb.ResponseEnvelope, expires_at_ms: int) -> Reply:
    response.request_id = task_id
    response.status.code = pb.STATUS_CODE_OK
    with tracing.timed(Stage.ENCODE):
        body = response.SerializeToString()
    return Reply(caller, body, expires_at_ms, StatusCode.OK)


class Replies:
    """One lane's refusals and answers."""

    def __init__(self, lane: LaneName, requests: Mode) -> None:
        self._lane = lane.value
        self._log = RequestLog(lane.value, requests, MESSAGE_OPERATIONS)
        # How long answered requests take once dequeued, per operation: what
        # admission adds to a queue's wait (dataservice/worker/servicetimes.py says it).
        self.service_times: RecentDurations[str] = RecentDurations()

    def refused(self, task_id: str, refusal: Refusal, caller: str, expires_at_ms: int) -> Reply:
        return self.answer(caller, task_id, self._counted(task_id, refusal), expires_at_ms)

    def refusal(self, request_id: str, refusal: Refusal) -> pb.ResponseEnvelope:
        """One operation of a batch refused on its own: its answer, counted and
        logged as a request's would be."""
        answer = self._counted(request_id, refusal)
        reason = answer.reason.value if answer.reason is not None else ""
        return error_response(
            request_id, answer.code, answer.message, answer.retry_after_ms, reason
        )

    def _counted(self, task_id: str, refusal: Refusal) -> Verdict:
        answer = verdict(refusal)
        if answer.reason is not None:
            REJECTIONS.labels(self._lane, answer.reason.value).inc()
        if answer.dependency is not None:
            DEPENDENCY_FAILURES.labels(self._lane, answer.dependency.value).inc()
            log.warning("request %s: %s", task_id, refusal.message)
        elif answer.reason is not None:
            routine = answer.reason in _ROUTINE_REFUSALS
            log.log(
                logging.DEBUG if routine else logging.INFO,
                "rejected request %s: %s",
                task_id,
                answer.reason.value,
            )
        else:
            log.debug("request %s: %s", task_id, type(refusal).__name__)
        if answer.stage is not None:
            TIMEOUTS.labels(self._lane, answer.stage.value).inc()
        return answer

    def refused_reads(self, answer: pb.ReadManyResponse) -> None:
        """Count the reads of a read_many refused by a check, each once."""
        reasons = Counter(r.status.reason for r in answer.results if r.status.reason)
        for reason, count in reasons.items():
            REJECTIONS.labels(self._lane, reason).inc(count)

    def answer(self, caller: str, task_id: str, answer: Verdict, expires_at_ms: int) -> Reply:
        reason = answer.reason.value if answer.reason is not None else ""
        with tracing.timed(Stage.ENCODE):
            body = error_response(
                task_id, answer.code, answer.message, answer.retry_after_ms, reason
            ).SerializeToString()
        return Reply(caller, body, expires_at_ms, answer.code, reason=reason)

    def finished(self, reply: Reply | None, status: str | None = None) -> None:
        """The request is answered (``reply``, stored or not) or dropped
        (None): its trace ends, into the request histogram and its log line."""
        trace = tracing.detach()
        if trace is None:
            return
        status = reply.code.name if reply is not None else status or DROPPED
        elapsed_s = trace.elapsed_s()
        if status == StatusCode.OK.name and trace.operation:
            self.service_times.record(trace.operation, elapsed_s * 1000)
        reason = reply.reason if reply is not None else trace.dropped
        self._log.finish(trace, status, reason, elapsed_s)
