"""The worker side of one request: signed envelope bytes in, encoded answer out.

The handler keeps only the order of the contract: open the envelope (its
size, signature and fields; :mod:`dataservice.security.auth`, no I/O), drop it
if it is late (:meth:`RequestHandler.open`), authorise it and pass the caller's
shared limits (:mod:`dataservice.limits.gate`; :meth:`RequestHandler.admit`),
run its operation (:mod:`dataservice.handler.operations`) and answer
(:meth:`RequestHandler.serve`). The three steps are separate so that a cache
hit can be answered on the worker's consumer thread
(``dataservice/worker/app.py``). Nothing here knows about Celery, SQL or Redis
keys. :meth:`RequestHandler.handle` never raises:
every refusal becomes a status code (:mod:`dataservice.handler.failures`;
:mod:`dataservice.handler.replies` encodes, counts and logs it),
and internal details stay in the log (never the payload, never a key, never
SQL text) while the caller sees a short message.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

from prometheus_client import Counter

from dataservice.codec import operation_count
from dataservice.config.model import Config, LaneConfig
from dataservice.enums import LaneName, StatusCode
from dataservice.handler.batch import Batch
from dataservice.handler.failures import INTERNAL
from dataservice.handler.operations import Operation
from dataservice.handler.replies import Replies, ok_reply
from dataservice.handler.steps import Admitted, Opened, Reply
from dataservice.limits.gate import Delivery, Gate, Peek
from dataservice.limits.slots import Entry
from dataservice.observe import trace as tracing
from dataservice.observe.metrics import (
    REJECTIONS,
    REQUESTS,
    TIMEOUTS,
    Stage,
    TimeoutStage,
)
from dataservice.observe.metrics.requests import cache_stage
from dataservice.proto import pb
from dataservice.refusals import Reason, Refusal, Rejected
from dataservice.security.auth import Authenticator
from dataservice.store.connections import now_ms

log = logging.getLogger(__name__)


def _unverified_expiry(now: int, deadline_ms: int | None, lane: LaneConfig, grace_ms: int) -> int:
    """Until the envelope is verified, the message's deadline header (not
    signed, so never beyond the lane's longest) bounds an answer's life."""
    longest = now + lane.max_deadline_ms
    return min(max(deadline_ms or longest, now), longest) + grace_ms


class RequestHandler:
    def __init__(
        self,
        config: Config,
        lane: LaneName,
        authenticator: Authenticator,
        gate: Gate,
        operations: Mapping[str, Operation],
        batch: Batch | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.lane_name = lane
        self.lane: LaneConfig = config.lanes[lane]
        self.authenticator = authenticator
        self.gate = gate
        self._operations = operations
        self._batch = batch
        self._grace_ms = config.results.grace_ms
        self._clock = clock
        self._capped = lane is LaneName.INTERACTIVE
        self._replies = Replies(lane, config.logging.requests)
        self.service_times = self._replies.service_times
        # The answer counter's children by operation and code, resolved once
        # each (both are from closed sets): a label lookup per answer showed
        # in the profile.
        self._answered: dict[tuple[str, StatusCode], Counter] = {}

    def handle(
        self,
        task_id: str,
        body: object,
        deadline_ms: int | None = None,
        *,
        redelivered: bool = False,
        started: Opened | Admitted | None = None,
    ) -> Reply | None:
        """Answer one request (``started``: as far as it got on the consumer
        thread); None when its caller has already given up."""
        if started is not None:
            tracing.resume(started.trace)
        step = started or self.open(task_id, body, deadline_ms)
        if isinstance(step, Opened):
            step = self.admit(step, redelivered=redelivered)
        return self.serve(step) if isinstance(step, Admitted) else step

    def open(self, task_id: str, body: object, deadline_ms: int | None) -> Opened | Reply | None:
        """Verify the envelope (no I/O) and drop it if it is late. The
        request's trace starts here, current on this thread."""
        trace = tracing.begin(self.lane_name.value, task_id)
        now = self._clock()
        try:
            envelope = self.authenticator.open(task_id, body, now)
        except Rejected as rejected:
            trace.caller = rejected.caller
            return self._replies.refused(
                task_id, rejected, rejected.caller, self._fallback(deadline_ms)
            )
        trace.caller = envelope.caller
        trace.operation = envelope.WhichOneof("operation") or ""
        # The caller's clock: a skew (bounded by the signature check) is not a wait.
        trace.add(Stage.ADMISSION_WAIT, max(now - envelope.issued_at_unix_ms, 0) / 1000)
        late_ms = now - envelope.deadline_unix_ms
        if late_ms >= 0:
            TIMEOUTS.labels(self.lane_name.value, TimeoutStage.QUEUE.value).inc()
            trace.dropped = "late"
            log.info("dropped request %s: deadline passed %d ms ago", task_id, late_ms)
            return None
        expires_at_ms = envelope.deadline_unix_ms + self._grace_ms
        return Opened(task_id, envelope, now, expires_at_ms, trace)

    def admit(
        self,
        opened: Opened,
        *,
        redelivered: bool = False,
        peek: Peek | None = None,
        delivery: Delivery | None = None,
    ) -> Admitted | Reply | None:
        """Authorise the request and take its place under its caller's limits
        (then, with ``peek``, read that cache entry in the same round trip, and
        maybe answer it: :class:`~dataservice.limits.gate.Peek`; and record
        its message's ``delivery``: :class:`~dataservice.limits.gate.Delivery`)."""
        task_id, envelope, expires_at_ms = opened.task_id, opened.envelope, opened.expires_at_ms
        try:
            request = self.authenticator.authorise(envelope)
            entry = Entry(
                request.policy,
                envelope.caller,
                task_id,
                envelope.deadline_unix_ms,
                opened.now_ms,
                self._capped,
                redelivered,
                # A batch or a read_many is charged to its caller's rate for
                # each of its operations.
                cost=operation_count(envelope),
            )
            with tracing.timed(Stage.GATE if peek is None else cache_stage(peek.fmt)):
                slot, peeked = self.gate.enter_peeking(entry, peek, delivery)
        except Rejected as rejected:
            if rejected.reason is Reason.REPLAYED:
                if opened.trace is not None:
                    opened.trace.dropped = "replayed"
                # The id belongs to the first delivery, which answers under it; an
                # answer here could reach its caller first (a redelivery, say).
                REJECTIONS.labels(self.lane_name.value, rejected.reason.value).inc()
                log.info("dropped request %s: replayed", task_id)
                return None
            reply = self._replies.refused(task_id, rejected, rejected.caller, expires_at_ms)
            return dataclasses.replace(reply, channel=envelope.reply_channel)
        return Admitted(task_id, request, slot, expires_at_ms, peeked, opened.trace)

    def serve(self, admitted: Admitted, result: pb.ResponseEnvelope | None = None) -> Reply:
        """Run the admitted request's operation, unless its ``result`` is
        already known (a cache hit), and answer; the reply holds its slot."""
        try:
            reply = self._serve(admitted, result)
        except BaseException:
            self.gate.leave(admitted.slot)
            raise
        if admitted.request.operation != "batch":
            self._count(admitted.request.operation, reply.code)
        # Built whole rather than by dataclasses.replace, which costs twice a
        # construction, on every answer.
        return Reply(
            reply.caller,
            reply.body,
            reply.expires_at_ms,
            reply.code,
            slot=admitted.slot,
            reason=reply.reason,
            channel=admitted.request.envelope.reply_channel,
        )

    def answered_by_gate(self, admitted: Admitted) -> None:
        """A read the gate's script answered (``Peek.answer``), slot and all."""
        self._count(admitted.request.operation, StatusCode.OK)
        self.gate.leave(admitted.slot, released_in_redis=True)
        self.finished(None, StatusCode.OK.name)

    def finished(self, reply: Reply | None, status: str | None = None) -> None:
        """The request is answered (``reply``, stored or not) or dropped (None)."""
        self._replies.finished(reply, status)

    def internal_error(self, caller: str, task_id: str, deadline_ms: int | None) -> Reply:
        # For a request whose handling failed outside the handler.
        return self._replies.answer(caller, task_id, INTERNAL, self._fallback(deadline_ms))

    def release(self, reply: Reply | None, *, released_in_redis: bool = False) -> None:
        """Give back a reply's in-flight slot (in Redis too, unless it went with the answer)."""
        if reply is not None and reply.slot is not None:
            self.gate.leave(reply.slot, released_in_redis=released_in_redis)

    def _count(self, operation: str, code: StatusCode) -> None:
        child = self._answered.get((operation, code))
        if child is None:
            child = REQUESTS.labels(self.lane_name.value, operation, code.name)
            self._answered[(operation, code)] = child
        child.inc()

    def _fallback(self, deadline_ms: int | None) -> int:
        return _unverified_expiry(self._clock(), deadline_ms, self.lane, self._grace_ms)

    def _serve(self, admitted: Admitted, response: pb.ResponseEnvelope | None) -> Reply:
        task_id, request, expires_at_ms = admitted.task_id, admitted.request, admitted.expires_at_ms
        envelope = request.envelope
        if request.operation == "batch":
            return self._serve_batch(admitted)
        try:
            if response is None:
                response = self._operations[request.operation].run(request)
        except Refusal as refusal:
            return self._replies.refused(task_id, refusal, envelope.caller, expires_at_ms)
        except Exception as exc:
            # A bug, not the request's fault: answer rather than leave the caller waiting.
            log.error("unexpected %s on %s", type(exc).__name__, task_id, exc_info=True)
            return self._replies.answer(envelope.caller, task_id, INTERNAL, expires_at_ms)
        if request.operation == "read_many":
            self._replies.refused_reads(response.read_many)
        return ok_reply(envelope.caller, task_id, response, expires_at_ms)

    def _serve_batch(self, admitted: Admitted) -> Reply:
        """Each operation of a batch answered on its own, all in one reply
        under the message's id (a ``BatchResponse``)."""
        task_id, envelope = admitted.task_id, admitted.request.envelope
        caller, lane = envelope.caller, self.lane_name.value
        if self._batch is None:
            refusal = Rejected(Reason.MALFORMED, "this lane takes no batches", caller=caller)
            return self._replies.refused(task_id, refusal, caller, admitted.expires_at_ms)
        answers, counts = self._batch.run(envelope, admitted.request.policy, self._replies.refusal)
        for (operation, code), count in counts.items():
            REQUESTS.labels(lane, operation, code).inc(count)
        response = pb.ResponseEnvelope(batch=answers)
        return ok_reply(caller, task_id, response, admitted.expires_at_ms)
