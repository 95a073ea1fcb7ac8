"""A batch: many writes and deletes in one message, one outcome each.

The message was verified and its caller admitted as a whole (one signature,
one pass through the caller's limits charged for every operation). Here each
operation becomes the envelope it would have had on its own and goes
through what a single request would, apart:

1. its fields (:func:`~dataservice.codec.validate_request`): a bad one is
   answered ``INVALID_ARGUMENT`` alone;
2. its authorisation (operation and scope): ``PERMISSION_DENIED`` alone,
   before any lookup;
3. its deadline: one already past is dropped, unanswered, as a late request is.

What is left is applied a group at a time (:func:`groups`): at most
``max_ops_per_transaction`` operations of distinct records, in key order,
each group one transaction under one point-write permit
(:meth:`~dataservice.store.RecordStore.apply_group`), whose statements keep
to the earliest deadline among them and to ``max_transaction_ms`` from its
start. Groups run one after another: a batch never holds two permits, and a
permit is one active transaction. A group that fails for the database's sake
(lost connection, deadlock, time) is answered with that failure for each of
its operations; nothing of it was applied, or, if its COMMIT went through
unseen, a retry under the same keys is answered from the keys' records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

from google.protobuf.message import DecodeError

from dataservice.auth import allow_operation
from dataservice.codec import validate_operation
from dataservice.config import CallerPolicy, LaneConfig, Limits
from dataservice.enums import OperationClass
from dataservice.errors import InvalidArgument
from dataservice.identifiers import REQUEST_ID_RE
from dataservice.proto import pb
from dataservice.refusals import Reason, Refusal, Rejected
from dataservice.store import IdempotencyConflict, Mutation, RecordStore, RevisionMismatch
from dataservice.store.connections import now_ms
from dataservice.store.idempotency import Outcome, Recorded
from dataservice.worker.database import Database
from dataservice.worker.failures import RecordMissing
from dataservice.worker.operations import RecordSource, keyed
from dataservice.worker.steps import Answer, Reply


@dataclass(frozen=True, slots=True)
class Answered:
    """What one operation of a batch comes to: its answer's result part, or
    why it was refused."""

    request_id: str
    deadline_ms: int
    operation: str
    result: pb.ResponseEnvelope | Refusal


@dataclass(frozen=True, slots=True)
class _Pending:
    operation: pb.BatchOperation
    mutation: Mutation


def groups(pending: Sequence[_Pending], size: int) -> Iterator[list[_Pending]]:
    """``pending`` in key order, cut into groups of at most ``size`` distinct
    records; a record written twice goes in two groups, in the order sent."""
    group: list[_Pending] = []
    keys: set[tuple[str, str]] = set()
    # sorted() is stable: operations on one record keep their order.
    for item in sorted(pending, key=lambda p: p.mutation.key):
        key = item.mutation.key
        if len(group) >= size or key in keys:
            yield group
            group, keys = [], set()
        group.append(item)
        keys.add(key)
    if group:
        yield group


def _answer(
    operation: pb.BatchOperation, recorded: Recorded | None
) -> pb.ResponseEnvelope | Refusal:
    if recorded is None:
        return IdempotencyConflict("the key was used for a different request")
    if recorded.outcome is Outcome.REVISION_MISMATCH:
        return RevisionMismatch(recorded.revision)
    if operation.WhichOneof("operation") == "write":
        if recorded.revision is None:
            return IdempotencyConflict("the key was used for a delete")
        return pb.ResponseEnvelope(
            write=pb.WriteRecordResponse(
                object_id=operation.write.object_id,
                revision=recorded.revision,
                created=recorded.created,
            )
        )
    if recorded.outcome is Outcome.NOT_FOUND or recorded.revision is None:
        return RecordMissing()
    return pb.ResponseEnvelope(
        delete=pb.DeleteRecordResponse(
            object_id=operation.delete.object_id, revision=recorded.revision
        )
    )


def operation_ids(envelope: pb.RequestEnvelope) -> list[tuple[str, int]]:
    """A batch envelope's operations' request ids and deadlines (none for a
    single request's envelope)."""
    if envelope.WhichOneof("operation") != "batch":
        return []
    return [(op.request_id, op.deadline_unix_ms) for op in envelope.batch.operations]


def claimed_operations(body: object) -> list[tuple[str, int]]:
    """The operations an unverified batch message names, where a refusal of
    the whole message is answered (as a single request's goes to the caller
    it names): well-formed ids only, none if it does not parse."""
    if not isinstance(body, bytes):
        return []
    try:
        signed = pb.SignedRequest.FromString(body)
        envelope = pb.RequestEnvelope.FromString(signed.envelope)
    except (DecodeError, ValueError, RecursionError):
        return []
    return [(i, d) for i, d in operation_ids(envelope) if REQUEST_ID_RE.fullmatch(i)]


def fan_out(reply: Reply, operations: Sequence[tuple[str, int]], grace_ms: int) -> Reply:
    """A refusal of a whole batch message, answered to each of its operations
    (under its id, kept no longer than its deadline allows); the reply as it
    is for a message that names none."""
    if not operations:
        return reply
    response = pb.ResponseEnvelope.FromString(reply.body)
    answers = []
    for request_id, deadline_ms in operations:
        response.request_id = request_id
        expires_at_ms = min(reply.expires_at_ms, deadline_ms + grace_ms)
        answers.append(Answer(request_id, response.SerializeToString(), expires_at_ms))
    return dataclasses.replace(reply, body=b"", answers=tuple(answers))


class Batch:
    """The batch operation: ``run`` answers each operation of a verified,
    admitted batch envelope (those that were late: not at all)."""

    op_class: ClassVar[OperationClass] = OperationClass.POINT_WRITE

    def __init__(
        self,
        database: Database,
        store: RecordStore,
        limits: Limits,
        lane: LaneConfig,
        source: RecordSource,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._database = database
        self._store = store
        self._limits = limits
        self._group_size = lane.max_ops_per_transaction
        self._transaction_ms = lane.max_transaction_ms
        self._source = source
        self._clock = clock

    def run(self, envelope: pb.RequestEnvelope, policy: CallerPolicy) -> list[Answered]:
        """Each operation's answer (``policy``: the batch's caller's); those
        that were late, none."""
        caller = envelope.caller
        answered: list[Answered] = []
        pending: list[_Pending] = []
        # A batch's operations mostly share a scope: each (operation, scope) is
        # authorised once.
        allowed: dict[tuple[str, str], Rejected | None] = {}
        now = self._clock()
        for operation in envelope.batch.operations:
            name = operation.WhichOneof("operation") or ""
            request = operation.write if name == "write" else operation.delete
            try:
                validate_operation(name, request, operation.idempotency_key, self._limits)
            except InvalidArgument as exc:
                refusal = Rejected(Reason.MALFORMED, exc.message, caller=caller)
                answered.append(
                    Answered(operation.request_id, operation.deadline_unix_ms, name, refusal)
                )
                continue
            key = (name, request.scope)
            if key not in allowed:
                try:
                    allow_operation(policy, caller, name, request.scope)
                    allowed[key] = None
                except Rejected as rejected:
                    allowed[key] = rejected
            denied = allowed[key]
            if denied is not None:
                answered.append(
                    Answered(operation.request_id, operation.deadline_unix_ms, name, denied)
                )
                continue
            if operation.deadline_unix_ms <= now:
                continue  # late: dropped, as a late request is
            mutation = Mutation(
                request.scope,
                request.object_id,
                operation.write.payload if name == "write" else None,
                request.expected_revision,
                keyed(caller, operation.idempotency_key, name, request),
            )
            pending.append(_Pending(operation, mutation))
        for group in groups(pending, self._group_size):
            answered += self._apply(group)
        return answered

    def _apply(self, group: list[_Pending]) -> list[Answered]:
        """One group, one transaction under one permit; each operation's answer."""
        deadline_ms = min(item.operation.deadline_unix_ms for item in group)
        # The transaction's time bound: its last statement is sent before it.
        bound_ms = min(deadline_ms, self._clock() + self._transaction_ms)
        mutations = [item.mutation for item in group]
        try:
            outcomes: list[Recorded | None] = self._database.run(
                self.op_class, bound_ms, lambda bounds: self._store.apply_group(mutations, bounds)
            )
        except Refusal as refusal:
            return [_answered(item.operation, refusal) for item in group]
        changes = [
            (m.scope, m.object_id, recorded.revision, m.payload is None)
            for m, recorded in zip(mutations, outcomes, strict=True)
            if recorded is not None
            and recorded.outcome is Outcome.OK
            and recorded.revision is not None
        ]
        if changes:
            self._source.changed_many(changes)
        return [
            _answered(item.operation, _answer(item.operation, recorded))
            for item, recorded in zip(group, outcomes, strict=True)
        ]


def _answered(operation: pb.BatchOperation, result: pb.ResponseEnvelope | Refusal) -> Answered:
    name = operation.WhichOneof("operation") or ""
    return Answered(operation.request_id, operation.deadline_unix_ms, name, result)
