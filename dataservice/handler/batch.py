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

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

from dataservice.codec import validate_operation
from dataservice.config.model import CallerPolicy, LaneConfig, Limits
from dataservice.enums import OperationClass, StatusCode
from dataservice.errors import InvalidArgument
from dataservice.handler.database import Database
from dataservice.handler.failures import RecordMissing
from dataservice.handler.operations import keyed
from dataservice.handler.source import RecordSource
from dataservice.proto import pb
from dataservice.refusals import Reason, Refusal, Rejected
from dataservice.security.auth import allow_operation
from dataservice.store import IdempotencyConflict, Mutation, RecordStore, RevisionMismatch
from dataservice.store.connections import now_ms
from dataservice.store.idempotency import Outcome, Recorded

# Builds a batch operation's answer to a refusal (counted and logged as a
# request's would be): :meth:`dataservice.handler.replies.Replies.refusal`.
RefusalAnswer = Callable[[str, Refusal], pb.ResponseEnvelope]
# An operation waiting for its group, with what it asks of the store.
_Pending = tuple[pb.BatchOperation, Mutation]


def groups(pending: Sequence[_Pending], size: int) -> Iterator[list[_Pending]]:
    """``pending`` in key order, cut into groups of at most ``size`` distinct
    records; a record written twice goes in two groups, in the order sent."""
    group: list[_Pending] = []
    keys: set[tuple[str, str]] = set()
    # sorted() is stable: operations on one record keep their order.
    for item in sorted(pending, key=lambda p: p[1].key):
        key = item[1].key
        if len(group) >= size or key in keys:
            yield group
            group, keys = [], set()
        group.append(item)
        keys.add(key)
    if group:
        yield group


def _checked(operation: pb.BatchOperation, recorded: Recorded | None) -> Recorded | Refusal:
    """A recorded outcome that is the operation's success, or why it is not."""
    if recorded is None:
        return IdempotencyConflict("the key was used for a different request")
    if recorded.outcome is Outcome.REVISION_MISMATCH:
        return RevisionMismatch(recorded.revision)
    if recorded.revision is None and operation.HasField("write"):
        return IdempotencyConflict("the key was used for a delete")
    if recorded.revision is None or recorded.outcome is Outcome.NOT_FOUND:
        return RecordMissing()
    return recorded


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

    def run(
        self, envelope: pb.RequestEnvelope, policy: CallerPolicy, refused: RefusalAnswer
    ) -> tuple[pb.BatchResponse, Counter[tuple[str, str]]]:
        """Each operation's answer (``policy``: the batch's caller's; late
        ones: none), and how many answers of each (operation, status code)."""
        caller = envelope.caller
        answers = pb.BatchResponse()
        counts: Counter[tuple[str, str]] = Counter()
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
                rejected = Rejected(Reason.MALFORMED, exc.message, caller=caller)
                _refused(answers, counts, refused, operation, rejected)
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
                _refused(answers, counts, refused, operation, denied)
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
            pending.append((operation, mutation))
        for group in groups(pending, self._group_size):
            self._apply(group, answers, counts, refused)
        return answers, counts

    def _apply(
        self,
        group: list[_Pending],
        answers: pb.BatchResponse,
        counts: Counter[tuple[str, str]],
        refused: RefusalAnswer,
    ) -> None:
        """One group, one transaction under one permit; each operation's answer."""
        deadline_ms = min(operation.deadline_unix_ms for operation, _ in group)
        mutations = [mutation for _, mutation in group]
        try:
            # The transaction's time bound, from its permit on: its last
            # statement is sent before it.
            outcomes: list[Recorded | None] = self._database.run(
                self.op_class,
                deadline_ms,
                lambda bounds: self._store.apply_group(mutations, bounds),
                hold_ms=self._transaction_ms,
            )
        except Refusal as refusal:
            for operation, _ in group:
                _refused(answers, counts, refused, operation, refusal)
            return
        changes = [
            (m.scope, m.object_id, recorded.revision, m.payload is None)
            for m, recorded in zip(mutations, outcomes, strict=True)
            if recorded is not None
            and recorded.outcome is Outcome.OK
            and recorded.revision is not None
        ]
        if changes:
            self._source.changed_many(changes)
        for (operation, mutation), recorded in zip(group, outcomes, strict=True):
            done = _checked(operation, recorded)
            if isinstance(done, Refusal):
                _refused(answers, counts, refused, operation, done)
                continue
            answer = answers.answers.add(request_id=operation.request_id)
            answer.status.code = pb.STATUS_CODE_OK
            if mutation.payload is not None:
                counts[("write", "OK")] += 1
                written = answer.write
                written.object_id = mutation.object_id
                written.revision = done.revision or 0
                written.created = done.created
            else:
                counts[("delete", "OK")] += 1
                deleted = answer.delete
                deleted.object_id = mutation.object_id
                deleted.revision = done.revision or 0


def _refused(
    answers: pb.BatchResponse,
    counts: Counter[tuple[str, str]],
    refused: RefusalAnswer,
    operation: pb.BatchOperation,
    refusal: Refusal,
) -> None:
    answer = refused(operation.request_id, refusal)
    answers.answers.append(answer)
    code = StatusCode(answer.status.code).name
    counts[(operation.WhichOneof("operation") or "", code)] += 1
