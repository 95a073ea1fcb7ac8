"""What a caller's request goes through before it is published: its
envelope, its signature, the caller's pace in this process and the throttle;
and what admission's answer does to the throttle. Shared by both clients."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from dataservice.client import throttle
from dataservice.client.handle import Carrier, now_ms
from dataservice.client.pacer import PACER
from dataservice.codec import (
    batch_envelope,
    batch_operation,
    lone_envelope,
    operation_count,
    request_envelope,
)
from dataservice.config.model import Config
from dataservice.enums import LaneName
from dataservice.errors import InvalidArgument, ResourceExhausted
from dataservice.limits.admission import AdmissionRefused
from dataservice.proto import pb
from dataservice.refusals import Reason
from dataservice.security.auth import sign
from dataservice.security.callers import CallerKey
from dataservice.types import DeleteOp, Operation, WriteOp

# A batch message's own fields around its operations, and each operation's
# framing beyond its envelope's (tags, lengths): kept out of max_message_bytes.
_BATCH_FRAMING = 256
_OPERATION_FRAMING = 16


# What a batch sends an operation as: a batch's part, or an envelope of its own.
Prepared = pb.BatchOperation | pb.RequestEnvelope
H_co = TypeVar("H_co", covariant=True)
# One message for the transport: the signed body, the message id, its
# deadline, its operation and how many operations it carries.
Item = tuple[bytes, str, int, str, int]


def refusal_error(
    refusal: AdmissionRefused, accepted: tuple[object, ...] = ()
) -> ResourceExhausted:
    """The caller's error for an admission refusal (``accepted``: what went before it)."""
    return refusal.error(accepted)


def new_request_id() -> str:
    """A fresh request id: 32 random hex characters, as a UUID4's hex (cheaper)."""
    return os.urandom(16).hex()


def mutation_key(operation: Operation) -> str:
    """The key a mutation keeps across its attempts; reads and lists have none."""
    if isinstance(operation, WriteOp | DeleteOp):
        return operation.idempotency_key or new_request_id()
    return ""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Requests ready for a lane: what the transport publishes and, per
    message, what it carries."""

    lane: LaneName
    deadline_ms: int
    items: list[Item]
    messages: list[tuple[pb.RequestEnvelope, list[Prepared]]]

    @property
    def count(self) -> int:
        """The operations it carries in all."""
        return sum(len(carried) for _, carried in self.messages)


class MakeHandle(Protocol[H_co]):
    """A client's handle for one operation: (request id, deadline, epoch,
    idempotency key, the batch message's carrier if it went in one)."""

    def __call__(
        self, request_id: str, deadline_ms: int, epoch: str, key: str, carrier: Carrier | None
    ) -> H_co: ...


class Publisher:
    """One caller's way onto the lanes, without I/O: requests built, signed
    and checked against the caller's pace and the throttle before they go
    (:meth:`one`, :meth:`many`); the throttle told how admission answered
    (:meth:`accepted`, :meth:`refused`); a handle made per operation sent
    (:meth:`handles`). The clients publish in between, each its own way."""

    def __init__(self, caller: str, key: CallerKey, config: Config, channel: str) -> None:
        policy = config.callers.get(caller)
        self.caller = caller
        self._key = key
        self._config = config
        # Every answer comes on the client's reply channel.
        self._channel = channel
        self._rate = None if policy is None else policy.rate
        self.throttle = throttle.for_caller(caller, config.client.throttle)

    def deadline(self, lane: LaneName, timeout: float | None) -> int:
        """The absolute deadline (Unix ms) of a call with ``timeout`` seconds on ``lane``."""
        lane_config = self._config.lanes[lane]
        if timeout is None:
            budget_ms = lane_config.default_deadline_ms
        elif timeout < 0.001:
            raise InvalidArgument("timeout must be at least 1 ms")
        else:
            budget_ms = min(int(timeout * 1000), lane_config.max_deadline_ms)
        return now_ms() + budget_ms

    def one(self, operation: Operation, deadline_ms: int, key: str) -> Outgoing:
        """One interactive request (one attempt), or the refusal of the
        caller's pace or the throttle raised as ``ResourceExhausted`` (which
        the caller, seeing the service's refusals too, passes to :meth:`held_back`)."""
        envelope = self._envelope(operation, deadline_ms, key)
        ops = operation_count(envelope)
        self.throttle.check(LaneName.INTERACTIVE)
        PACER.take(self.caller, None if self._rate is None else self._rate.paced(ops))
        item = (
            self._sign(envelope),
            envelope.request_id,
            deadline_ms,
            envelope.WhichOneof("operation") or "",
            ops,
        )
        return Outgoing(LaneName.INTERACTIVE, deadline_ms, [item], [(envelope, [envelope])])

    def many(self, operations: Sequence[Operation], deadline_ms: int) -> Outgoing:
        """Every operation for the batch lane, all validated before any is
        sent: runs of writes and deletes packed into batch messages
        (:meth:`_pack`), the rest one message each, in the order given."""
        prepared = [self._prepared(op, deadline_ms) for op in operations]
        messages = self._pack(prepared)
        # Admission paces a batch at publish (and says how many it took); here
        # only a standing rate refusal holds it back.
        PACER.take(self.caller, None)
        self.throttle.check(LaneName.BATCH, len(prepared))
        items: list[Item] = [
            (
                self._sign(message),
                message.request_id,
                deadline_ms,
                message.WhichOneof("operation") or "",
                len(carried),
            )
            for message, carried in messages
        ]
        return Outgoing(LaneName.BATCH, deadline_ms, items, messages)

    def accepted(self, out: Outgoing) -> None:
        # Accepted once admitted: an answer comes about a window later, too
        # late for the throttle to see the service accepting again in time.
        self.throttle.outcome(out.lane, out.count, out.count)

    def refused(
        self, out: Outgoing, refusal: AdmissionRefused, made: Sequence[object] = ()
    ) -> ResourceExhausted:
        """The caller's error for admission's refusal of ``out`` (``made``: the
        handles of what it accepted before)."""
        error = refusal_error(refusal, tuple(made))
        self.throttle.refused(out.lane, error, len(error.accepted))
        if out.lane is LaneName.BATCH:
            self.held_back(error)
        return error

    def handles(
        self, out: Outgoing, epoch: str, make: MakeHandle[H_co], sent: int | None = None
    ) -> list[H_co]:
        """A handle per operation of the first ``sent`` messages (all: None)."""
        made = []
        for message, carried in out.messages[:sent]:
            # A batch message's operations are answered together, under its id.
            carrier = Carrier(message.request_id, out.deadline_ms) if len(carried) > 1 else None
            made += [
                make(one.request_id, out.deadline_ms, epoch, one.idempotency_key, carrier)
                for one in carried
            ]
        return made

    def _prepared(self, operation: Operation, deadline_ms: int) -> Prepared:
        """A write or delete as a batch carries it; anything else as its own envelope."""
        if isinstance(operation, WriteOp | DeleteOp):
            return batch_operation(
                operation,
                request_id=new_request_id(),
                deadline_ms=deadline_ms,
                idempotency_key=mutation_key(operation),
                limits=self._config.limits,
            )
        return self._envelope(operation, deadline_ms, "")

    def _pack(
        self, prepared: Sequence[Prepared]
    ) -> list[tuple[pb.RequestEnvelope, list[Prepared]]]:
        """The messages that carry ``prepared``, each with what it carries:
        consecutive writes and deletes together, at most the lane's
        ``max_ops_per_message`` (and the caller's burst, which a message's
        operations are charged against at once) within ``max_message_bytes``;
        a run of one, and every read and list, as a message of its own."""
        lane = self._config.lanes[LaneName.BATCH]
        most = lane.max_ops_per_message
        if self._rate is not None:
            most = max(1, min(most, int(self._rate.burst)))
        room = self._config.message_bytes(lane) - _BATCH_FRAMING
        messages: list[tuple[pb.RequestEnvelope, list[Prepared]]] = []
        run: list[pb.BatchOperation] = []
        size = 0

        def flush() -> None:
            nonlocal size
            if len(run) == 1:
                messages.append((lone_envelope(self.caller, now_ms(), run[0]), [run[0]]))
            elif run:
                envelope = batch_envelope(self.caller, new_request_id(), now_ms(), run)
                messages.append((envelope, list(run)))
            run.clear()
            size = 0

        for one in prepared:
            if isinstance(one, pb.RequestEnvelope):
                flush()
                messages.append((one, [one]))
                continue
            cost = one.ByteSize() + _OPERATION_FRAMING
            if run and (len(run) >= most or size + cost > room):
                flush()
            run.append(one)
            size += cost
        flush()
        return messages

    def held_back(self, error: ResourceExhausted) -> None:
        """After the service refused the caller for its rate, hold it back here."""
        if error.reason == Reason.RATE_LIMITED:
            PACER.refused(self.caller, error.retry_after)

    def _sign(self, envelope: pb.RequestEnvelope) -> bytes:
        envelope.reply_channel = self._channel
        return sign(envelope.SerializeToString(), self._key)

    def _envelope(self, operation: Operation, deadline_ms: int, key: str) -> pb.RequestEnvelope:
        return request_envelope(
            self.caller,
            operation,
            request_id=new_request_id(),
            deadline_ms=deadline_ms,
            issued_at_ms=now_ms(),
            idempotency_key=key,
            limits=self._config.limits,
        )
