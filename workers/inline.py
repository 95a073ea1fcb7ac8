"""Cached reads answered on the worker's consumer thread (``workers/fastpath.py``).

The consumer thread verifies the request, admits it under its caller's
limits with the cache entry read in the same round trip, and either hands a
miss to the pool (keeping its place under the limits) or answers the hit,
acknowledging the message in the answer's own transaction.
"""

from __future__ import annotations

from dataservice.cache.source import CachedSource, Peeking
from dataservice.enums import CacheFormat, ReadMode
from dataservice.limits.gate import Peek
from dataservice.observe import trace as tracing
from dataservice.proto import pb
from dataservice.worker import RequestHandler
from dataservice.worker.steps import Admitted, Opened, Reply
from workers.answers import Answers, int_header
from workers.fastpath import InlineMessage, Outcome


def _cached_read(envelope: pb.RequestEnvelope) -> bool:
    return (
        envelope.WhichOneof("operation") == "read"
        and envelope.read.mode == pb.READ_MODE_ALLOW_CACHED
    )


class InlineReads:
    """The lane's inline handler (:class:`~workers.fastpath.InlineHandler`)."""

    def __init__(
        self,
        handler: RequestHandler,
        source: CachedSource,
        answers: Answers,
        *,
        ack_with_answers: bool,
        one_redis: bool,
    ) -> None:
        self._handler = handler
        self._source = source
        self._answers = answers
        self._ack_with_answers = ack_with_answers
        # The limits and the cache on the answers' Redis too: a hit can be
        # answered by the gate's own script.
        self._one_redis = one_redis
        # Requests passed on to the pool, by task id, as far as they got here
        # (verified; or admitted, their record not in the cache), until the
        # pool runs them: at most the messages this replica has reserved
        # (prefetch: one per thread).
        self._passed: dict[str, Opened | Admitted] = {}

    def take(self, task_id: str) -> Opened | Admitted | None:
        """The pool's side: how far this request got here, if it was here."""
        return self._passed.pop(task_id, None)

    def __call__(self, message: InlineMessage) -> Outcome:
        """Answer a cached read on the consumer thread; DECLINED hands the
        message to the pool (everything but an ``ALLOW_CACHED`` read, and misses).

        Only a verified, authorised read within its caller's limits reaches
        the cache here, the same order as in the pool. A miss keeps its place
        under the limits for the pool to go on from (:meth:`take`).
        When the broker is the results' Redis, the message is acknowledged in
        the answer's own transaction.
        """
        task_id, args, kwargs = message.task_id, message.args, message.kwargs
        body: object = args[0] if len(args) == 1 and not kwargs else None
        opened = self._handler.open(task_id, body, int_header(message.deadline))
        if not isinstance(opened, Opened):
            # Refused or late: answered (or dropped) here, and counted once.
            return self._answered(message, opened, body)
        if not _cached_read(opened.envelope):
            return self._declined(opened)
        read = opened.envelope.read
        source = self._source
        target = source.peek_key(read.scope, read.object_id, ReadMode(read.mode), task_id)
        peek = self._peek(message, opened, target, body)
        admitted = self._handler.admit(opened, redelivered=message.redelivered, peek=peek)
        if not isinstance(admitted, Admitted):
            return self._answered(message, admitted, body)
        if admitted.peeked.answered and target is not None:
            source.peeked_answered(target)
            self._handler.answered_by_gate(admitted)
            return Outcome.ANSWERED_AND_ACKED
        record = None
        if target is not None and admitted.peeked.looked:
            record = source.peeked(target, admitted.peeked.value)
        if record is None:
            return self._declined(admitted)
        result = pb.ResponseEnvelope(read=pb.ReadRecordResponse(record=record))
        return self._answered(message, self._handler.serve(admitted, result), body)

    def _declined(self, step: Opened | Admitted) -> Outcome:
        """Pass the request on to the pool, as far as it got; its trace goes with it."""
        self._passed[step.task_id] = step
        tracing.detach()
        return Outcome.DECLINED

    def _peek(
        self,
        message: InlineMessage,
        opened: Opened,
        target: Peeking | None,
        body: object,
    ) -> Peek | None:
        """What the gate reads once the request is admitted, in its own round
        trip: the entry, and when the entry is the answer's own encoding (v2)
        and everything lives on one Redis, the whole answer (``hit.lua``)."""
        if target is None:
            return None
        fmt, key = target.fmt, target.key
        # A hit to be compared is answered here, so that its entry comes back.
        whole = fmt is CacheFormat.V2 and self._ack_with_answers and self._one_redis
        if not whole or target.compared:
            return Peek(key, fmt=fmt)
        answer = self._answers.in_gate(
            opened.envelope.caller,
            message.task_id,
            opened.expires_at_ms,
            message.admitted_size,
            body,
            message.acknowledgement,
        )
        if answer is None:
            return Peek(key, fmt=fmt)
        return Peek(key, answer, fmt)

    def _answered(self, message: InlineMessage, reply: Reply | None, body: object) -> Outcome:
        ack = message.acknowledgement if self._ack_with_answers else None
        stored = self._answers.deliver(
            message.task_id, reply, body, message.admitted_size, ack, message.admitted_ops
        )
        return Outcome.ANSWERED_AND_ACKED if stored and ack else Outcome.ANSWERED
