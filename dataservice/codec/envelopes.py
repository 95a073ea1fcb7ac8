"""Envelopes: a caller's operation into a ``RequestEnvelope``, an answer into
a ``ResponseEnvelope``, and an answer's bytes back into a result or its error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from google.protobuf.message import DecodeError

from dataservice.codec.records import record_from_pb
from dataservice.codec.requests import validate_request
from dataservice.config import Limits
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

# Each operation's oneof member and message; their fields carry the same
# names as the operation's, less the idempotency key (an envelope field).
_MESSAGES: dict[type[Any], tuple[str, type[Any]]] = {
    ReadOp: ("read", pb.ReadRecordRequest),
    WriteOp: ("write", pb.WriteRecordRequest),
    DeleteOp: ("delete", pb.DeleteRecordRequest),
    ListOp: ("list", pb.ListRecordsRequest),
}
_NOT_NEGATIVE = ("expected_revision", "page_size")


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
    try:
        _, message = _MESSAGES[type(operation)]
    except KeyError:
        raise InvalidArgument(f"unknown operation type {type(operation).__name__}") from None
    fields = {}
    for field in dataclasses.fields(operation):
        value = getattr(operation, field.name)
        if field.name in _NOT_NEGATIVE and value < 0:
            raise InvalidArgument(f"{field.name} must not be negative")
        if field.name != "idempotency_key":
            # An absent cursor is the empty string on the wire; a read mode its number.
            fields[field.name] = "" if value is None else value
    return message(**fields)


def batch_envelope(
    caller: str,
    request_id: str,
    issued_at_ms: int,
    operations: Sequence[pb.RequestEnvelope],
) -> pb.RequestEnvelope:
    """One envelope carrying ``operations`` (writes and deletes, each already
    built and checked by :func:`request_envelope`), with their ids, deadlines
    and keys; its own deadline is the latest of theirs."""
    batch = pb.BatchRequest()
    for envelope in operations:
        operation = batch.operations.add(
            request_id=envelope.request_id,
            deadline_unix_ms=envelope.deadline_unix_ms,
            idempotency_key=envelope.idempotency_key,
        )
        member = envelope.WhichOneof("operation")
        if member == "write":
            operation.write.CopyFrom(envelope.write)
        elif member == "delete":
            operation.delete.CopyFrom(envelope.delete)
        else:
            raise InvalidArgument(f"a batch carries writes and deletes, not a {member}")
    return pb.RequestEnvelope(
        caller=caller,
        request_id=request_id,
        deadline_unix_ms=max(e.deadline_unix_ms for e in operations),
        issued_at_unix_ms=issued_at_ms,
        batch=batch,
    )


def batch_operations(envelope: pb.RequestEnvelope) -> list[pb.RequestEnvelope]:
    """A batch's operations, each as the envelope it would have had on its
    own (caller and issue time from the batch), not yet checked: check each
    with :func:`~dataservice.codec.requests.validate_request`."""
    operations = []
    for operation in envelope.batch.operations:
        single = pb.RequestEnvelope(
            caller=envelope.caller,
            request_id=operation.request_id,
            deadline_unix_ms=operation.deadline_unix_ms,
            issued_at_unix_ms=envelope.issued_at_unix_ms,
            idempotency_key=operation.idempotency_key,
        )
        if operation.WhichOneof("operation") == "write":
            single.write.CopyFrom(operation.write)
        else:
            single.delete.CopyFrom(operation.delete)
        operations.append(single)
    return operations


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
    response = pb.ResponseEnvelope()
    try:
        response.ParseFromString(body)
    except DecodeError:
        raise InternalError(
            "the service sent an unreadable answer", request_id=request_id
        ) from None
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
