"""Requests taken on the worker's consumer thread (``dataservice/worker/fastpath.py``).

The consumer thread verifies each single request and admits it under its
caller's limits (with a cached read, the cache entry read in the same round
trip). A refusal, and a cache hit, is answered there, the message
acknowledged in the answer's own transaction. Everything that needs the
database goes to a pool thread as it is, admitted, and is answered there the
same way: no Celery request object, no trace, no second round trip for the
acknowledgement (the pool's lean path). A batch never comes here
(``dataservice/worker/fastpath.py`` hands it to Celery's own strategy).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dataservice.cache.source import CachedSource, Peeking
from dataservice.enums import CacheFormat, ReadMode
from dataservice.handler import RequestHandler
from dataservice.handler.steps import Admitted, Opened, Reply
from dataservice.limits.gate import Delivery, Peek
from dataservice.observe import trace as tracing
from dataservice.proto import pb
from dataservice.worker.answers import Answers, int_header
from dataservice.worker.fastpath import InlineMessage, Outcome, PoolWork

# The longest an answer written on the consumer thread may take, as long as
# the limits' calls there (dataservice/worker/app.py): the thread also runs the worker's
# control commands, heartbeats and alive file.
ANSWER_TIMEOUT_S = 0.25

# LaneRuntime.process: answer a message as far as it got here, acknowledging
# it with the answer when given kombu's keys; False if nothing was stored.
Process = Callable[..., bool]


def _cached_read(envelope: pb.RequestEnvelope) -> bool:
    return (
        envelope.WhichOneof("operation") == "read"
        and envelope.read.mode == pb.READ_MODE_ALLOW_CACHED
    )


class InlineRequests:
    """The lane's inline handler (:class:`~dataservice.worker.fastpath.InlineHandler`)."""

    def __init__(
        self,
        handler: RequestHandler,
        source: CachedSource,
        answers: Answers,
        process: Process,
        *,
        ack_with_answers: bool,
        one_redis: bool,
        record_in_gate: bool,
    ) -> None:
        self._handler = handler
        # The broker is the limits' Redis: the gate's script records a
        # message's delivery as it admits it (limits/delivered.lua).
        self._record_in_gate = record_in_gate
        self._source = source
        self._answers = answers
        self._process = process
        self._ack_with_answers = ack_with_answers
        # The limits and the cache on the answers' Redis too: a hit can be
        # answered by the gate's own script.
        self._one_redis = one_redis

    def __call__(self, message: InlineMessage) -> Outcome | PoolWork:
        """Answer a refusal or a cached read's hit here; hand what needs the
        database to the pool (:data:`PoolWork`), admitted.

        Only a verified, authorised request within its caller's limits reaches
        the cache or the pool, in the same order as the pool would check it.
        When the broker is the answers' Redis, the message is acknowledged in
        the answer's own transaction, here and in the pool alike.
        """
        task_id, args, kwargs = message.task_id, message.args, message.kwargs
        body: object = args[0] if len(args) == 1 and not kwargs else None
        opened = self._handler.open(task_id, body, int_header(message.deadline))
        if not isinstance(opened, Opened):
            # Refused or late: answered (or dropped) here, and counted once.
            return self._answered(message, opened, body)
        delivery = self._delivery(message)
        if not _cached_read(opened.envelope):
            admitted = self._handler.admit(
                opened, redelivered=message.redelivered, delivery=delivery
            )
            if not isinstance(admitted, Admitted):
                return self._answered(message, admitted, body)
            return self._in_pool(message, admitted, body)
        read = opened.envelope.read
        source = self._source
        target = source.peek_key(read.scope, read.object_id, ReadMode(read.mode), task_id)
        peek = self._peek(message, opened, target, body)
        admitted = self._handler.admit(
            opened, redelivered=message.redelivered, peek=peek, delivery=delivery
        )
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
            return self._in_pool(message, admitted, body)
        result = pb.ResponseEnvelope(read=pb.ReadRecordResponse(record=record))
        return self._answered(message, self._handler.serve(admitted, result), body)

    def _in_pool(self, message: InlineMessage, admitted: Admitted, body: object) -> PoolWork:
        """The rest of an admitted request, for a pool thread: its operation
        and its answer; its trace goes with it."""
        tracing.detach()
        ack = message.acknowledgement if self._ack_with_answers else None

        def work() -> Outcome:
            stored = self._process(
                message.task_id,
                body,
                message.deadline,
                message.admitted_size,
                message.redelivered,
                message.admitted_ops,
                started=admitted,
                ack=ack,
            )
            return Outcome.ANSWERED_AND_ACKED if stored and ack else Outcome.ANSWERED

        return PoolWork(work, recorded=admitted.peeked.recorded)

    def _delivery(self, message: InlineMessage) -> Delivery | None:
        """The message's delivery, for the gate's script to record once the
        request is admitted: only when the broker is the limits' Redis (else
        the channel records it, a round trip of its own)."""
        if not self._record_in_gate or message.record is None:
            return None
        index, unacked, tag = message.acknowledgement
        return Delivery(
            index, unacked, tag, message.record(), time.time(), pending=message.record_pending
        )

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
            opened.envelope.reply_channel,
        )
        if answer is None:
            return Peek(key, fmt=fmt)
        return Peek(key, answer, fmt)

    def _answered(self, message: InlineMessage, reply: Reply | None, body: object) -> Outcome:
        ack = message.acknowledgement if self._ack_with_answers else None
        # Within the consumer thread's bound: a stalled result Redis costs each
        # answer that long (the answer is then lost, its caller told by its
        # deadline), not the pool's socket timeout of seconds.
        stored = self._answers.deliver(
            message.task_id,
            reply,
            body,
            message.admitted_size,
            ack,
            message.admitted_ops,
            each_within_s=ANSWER_TIMEOUT_S,
        )
        return Outcome.ANSWERED_AND_ACKED if stored and ack else Outcome.ANSWERED
