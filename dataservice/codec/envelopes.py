"""Envelopes: a caller's operation into a ``RequestEnvelope``, an answer into
a ``ResponseEnvelope``, and an answer's bytes back into a result or its error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import DecodeError

from dataservice.codec.records import record_from_pb
from dataservice.codec.requests import validate_operation, validate_request
from dataservice.config.model import Limits
from dataservice.enums import StatusCode
from dataservice.errors import InternalError, InvalidArgument, RequestError, error_for
from dataservice.proto import pb
from dataservice.types import (
    DeleteOp,
    DeleteResult,
    ListOp,
    Operation,
    Page,
    ReadMany,
    ReadManyOp,
    ReadOp,
    Result,
    WriteOp,
    WriteResult,
)

# Each operation's oneof member and message.
_MESSAGES: dict[type[Any], tuple[str, type[Any]]] = {
    ReadOp: ("read", pb.ReadRecordRequest),
    WriteOp: ("write", pb.WriteRecordRequest),
    DeleteOp: ("delete", pb.DeleteRecordRequest),
    ListOp: ("list", pb.ListRecordsRequest),
}


def request_envelope(
    caller: str,
    operation: Operation,
    *,
    request_id: str,
    deadline_ms: int,
    issued_at_ms: int,
    idempotency_key: str,
    limits: Limits,
) -> pb.RequestEnvelope:
    """The envelope for ``operation``, checked by the rules the worker applies."""
    envelope = pb.RequestEnvelope(
        caller=caller,
        request_id=request_id,
        deadline_unix_ms=deadline_ms,
        issued_at_unix_ms=issued_at_ms,
        idempotency_key=idempotency_key,
    )
    if isinstance(operation, ReadManyOp):
        envelope.read_many.reads.extend(_message(read) for read in operation.reads)
    else:
        member = _MESSAGES.get(type(operation), ("", None))[0]
        getattr(envelope, member).CopyFrom(_message(operation))
    # Fail fast, before anything is sent, with the same rules the worker applies.
    validate_request(envelope, limits)
    return envelope


def _message(operation: Operation) -> Any:
    """The request message of one operation."""
    build = _BUILDERS.get(type(operation))
    if build is None:
        raise InvalidArgument(f"unknown operation type {type(operation).__name__}")
    return build(operation)


def _not_negative(value: int, name: str) -> int:
    if value < 0:
        raise InvalidArgument(f"{name} must not be negative")
    return value


# Each operation's message, its fields named as the operation's (less the
# idempotency key, an envelope field); an absent cursor is the empty string
# on the wire, a read mode its number.
_BUILDERS: dict[type[Any], Callable[[Any], Any]] = {
    ReadOp: lambda o: pb.ReadRecordRequest(scope=o.scope, object_id=o.object_id, mode=o.mode),
    WriteOp: lambda o: pb.WriteRecordRequest(
        scope=o.scope,
        object_id=o.object_id,
        payload=o.payload,
        expected_revision=_not_negative(o.expected_revision, "expected_revision"),
    ),
    DeleteOp: lambda o: pb.DeleteRecordRequest(
        scope=o.scope,
        object_id=o.object_id,
        expected_revision=_not_negative(o.expected_revision, "expected_revision"),
    ),
    ListOp: lambda o: pb.ListRecordsRequest(
        scope=o.scope,
        page_size=_not_negative(o.page_size, "page_size"),
        cursor=o.cursor or "",
    ),
}


def batch_operation(
    operation: WriteOp | DeleteOp,
    *,
    request_id: str,
    deadline_ms: int,
    idempotency_key: str,
    limits: Limits,
) -> pb.BatchOperation:
    """One write or delete as a batch carries it, checked by the rules the
    worker applies to it (:func:`~dataservice.codec.requests.validate_operation`)."""
    member = "write" if isinstance(operation, WriteOp) else "delete"
    message = _message(operation)
    validate_operation(member, message, idempotency_key, limits)
    batched = pb.BatchOperation(
        request_id=request_id, deadline_unix_ms=deadline_ms, idempotency_key=idempotency_key
    )
    getattr(batched, member).CopyFrom(message)
    return batched


def batch_envelope(
    caller: str,
    request_id: str,
    issued_at_ms: int,
    operations: Sequence[pb.BatchOperation],
) -> pb.RequestEnvelope:
    """One envelope carrying ``operations`` (:func:`batch_operation`), its
    own deadline the latest of theirs."""
    envelope = pb.RequestEnvelope(
        caller=caller,
        request_id=request_id,
        deadline_unix_ms=max(op.deadline_unix_ms for op in operations),
        issued_at_unix_ms=issued_at_ms,
    )
    envelope.batch.operations.extend(operations)
    return envelope


def lone_envelope(
    caller: str, issued_at_ms: int, operation: pb.BatchOperation
) -> pb.RequestEnvelope:
    """A batch operation sent on its own: the envelope it has alone."""
    envelope = pb.RequestEnvelope(
        caller=caller,
        request_id=operation.request_id,
        deadline_unix_ms=operation.deadline_unix_ms,
        issued_at_unix_ms=issued_at_ms,
        idempotency_key=operation.idempotency_key,
    )
    member = operation.WhichOneof("operation") or ""
    getattr(envelope, member).CopyFrom(getattr(operation, member))
    return envelope


def error_response(
    request_id: str, code: StatusCode, message: str, retry_after_ms: int = 0, reason: str = ""
) -> pb.ResponseEnvelope:
    status = pb.Status(
        code=int(code),  # type: ignore[arg-type]
        message=message,
        retry_after_ms=retry_after_ms,
        reason=reason,
    )
    return pb.ResponseEnvelope(request_id=request_id, status=status)


def decode_response(body: bytes, request_id: str) -> Result:
    """The result in an encoded ``ResponseEnvelope``, or its typed error."""
    return result_of(parse_response(body, request_id), request_id)


def parse_response(body: bytes, request_id: str) -> pb.ResponseEnvelope:
    """An encoded ``ResponseEnvelope``; ``InternalError`` if it does not parse."""
    response = pb.ResponseEnvelope()
    try:
        response.ParseFromString(body)
    except DecodeError:
        raise InternalError(
            "the service sent an unreadable answer", request_id=request_id
        ) from None
    return response


def result_of(response: pb.ResponseEnvelope, request_id: str) -> Result:
    """The result a parsed ``ResponseEnvelope`` carries, or its typed error
    (a batch's whole answer is taken apart by its handles instead)."""
    if response.status.code != pb.STATUS_CODE_OK:
        raise _error(response.status, request_id)
    kind = response.WhichOneof("result")
    if kind == "read":
        return record_from_pb(response.read.record)
    if kind == "write":
        w = response.write
        return WriteResult(object_id=w.object_id, revision=w.revision, created=w.created)
    if kind == "delete":
        return DeleteResult(object_id=response.delete.object_id, revision=response.delete.revision)
    if kind == "list":
        page = response.list
        return Page(
            records=tuple(record_from_pb(r) for r in page.records),
            next_cursor=page.next_cursor or None,
        )
    if kind == "read_many":
        return ReadMany(
            tuple(
                record_from_pb(one.record)
                if one.status.code == pb.STATUS_CODE_OK
                else _error(one.status, request_id)
                for one in response.read_many.results
            )
        )
    raise InternalError("the service sent an answer without a result", request_id=request_id)


def _error(status: pb.Status, request_id: str) -> RequestError:
    code = StatusCode(status.code) if status.code in StatusCode._value2member_map_ else None
    return error_for(
        code or StatusCode.INTERNAL,
        status.message,
        request_id=request_id,
        retry_after=status.retry_after_ms / 1000,
        reason=status.reason,
    )
