"""Many reads in one message (``read_many``), answered together.

Each read is checked and authorised on its own, before any lookup: a
malformed id is ``INVALID_ARGUMENT`` and a scope the caller may not read is
``PERMISSION_DENIED``, for that read alone. The rest go to the lane's
:class:`~dataservice.handler.source.RecordSource` at once, a mode at a
time (the cache in one round trip, the misses a ``SELECT ... IN`` per
permit). The answer holds one result per read, in the request's order; once
it would outgrow ``limits.max_response_bytes``, a record that does not fit
is answered ``RESOURCE_EXHAUSTED`` (``response_full``) and the client asks
for it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from dataservice.codec import validate_operation
from dataservice.config.model import Limits
from dataservice.enums import OperationClass, ReadMode
from dataservice.errors import InvalidArgument
from dataservice.handler.failures import RecordMissing, ResponseFull, verdict
from dataservice.proto import pb
from dataservice.refusals import Reason, Refusal, Rejected
from dataservice.security.auth import Authorised, allow_scope

if TYPE_CHECKING:
    from dataservice.handler.source import RecordSource

# The envelope and status around the results, and the most one result that
# is not a record takes (a status with its message).
_RESPONSE_OVERHEAD = 512
_STATUS_BYTES = 160

_MISSING = RecordMissing()


class ReadMany:
    op_class: ClassVar[OperationClass] = OperationClass.POINT_READ

    def __init__(self, source: RecordSource, limits: Limits) -> None:
        self._source = source
        self._limits = limits

    def run(self, request: Authorised) -> pb.ResponseEnvelope:
        envelope = request.envelope
        reads = envelope.read_many.reads
        outcomes: list[pb.Record | Refusal | None] = [None] * len(reads)
        # Positions of each key, by mode: a key asked twice is read once.
        wanted: dict[ReadMode, dict[tuple[str, str], list[int]]] = {}
        for i, read in enumerate(reads):
            refusal = self._refused(request, read)
            if refusal is not None:
                outcomes[i] = refusal
            else:
                key = (read.scope, read.object_id)
                wanted.setdefault(ReadMode(read.mode), {}).setdefault(key, []).append(i)
        for mode, positions in wanted.items():
            found = self._source.read_many(
                list(positions),
                mode,
                envelope.deadline_unix_ms,
                envelope.request_id,
                envelope.issued_at_unix_ms,
            )
            for key, where in positions.items():
                outcome = found.get(key)
                for i in where:
                    outcomes[i] = _MISSING if outcome is None else outcome
        return pb.ResponseEnvelope(read_many=self._answer(outcomes))

    def _refused(self, request: Authorised, read: pb.ReadRecordRequest) -> Refusal | None:
        caller = request.envelope.caller
        try:
            validate_operation("read", read, "", self._limits)
            allow_scope(request.policy, caller, read.scope)
        except InvalidArgument as exc:
            return Rejected(Reason.MALFORMED, exc.message, caller=caller)
        except Rejected as rejected:
            return rejected
        return None

    def _answer(self, outcomes: list[pb.Record | Refusal | None]) -> pb.ReadManyResponse:
        """The results in order, within the response's byte bound."""
        response = pb.ReadManyResponse()
        # Room for every result that is not a record is kept from the start.
        room = self._limits.max_response_bytes - _RESPONSE_OVERHEAD
        room -= _STATUS_BYTES * len(outcomes)
        for outcome in _statuses(outcomes):
            result = response.results.add()
            refusal: Refusal
            if isinstance(outcome, pb.Record):
                size = outcome.ByteSize()
                if size <= room:
                    room -= size - _STATUS_BYTES
                    result.status.code = pb.STATUS_CODE_OK
                    result.record.CopyFrom(outcome)
                    continue
                refusal = ResponseFull()
            else:
                refusal = outcome
            answer = verdict(refusal)
            result.status.code = int(answer.code)  # type: ignore[assignment]
            result.status.message = answer.message
            result.status.retry_after_ms = answer.retry_after_ms
            if answer.reason is not None:
                result.status.reason = answer.reason.value
        return response


def _statuses(outcomes: list[pb.Record | Refusal | None]) -> Iterator[pb.Record | Refusal]:
    for outcome in outcomes:
        yield _MISSING if outcome is None else outcome
