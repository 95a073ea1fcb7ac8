"""Decoding and validating request envelopes, and list cursors.

Everything a caller sends passes through :func:`decode_request` before any
other code sees it: size first, then the protobuf parse, then every field.
The only exception it raises is :class:`~dataservice.errors.InvalidArgument`.
The client validates with the same :func:`validate_request` before it sends.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, get_args

from google.protobuf.message import DecodeError

from dataservice.config.model import Limits, OperationName
from dataservice.errors import InvalidArgument
from dataservice.identifiers import (
    CALLER_RE,
    IDEMPOTENCY_KEY_RE,
    OBJECT_ID_RE,
    REQUEST_ID_RE,
    SCOPE_RE,
)
from dataservice.proto import pb

# A cursor holds a scope (<= 64) and an object id (<= 128) plus framing:
# under 200 bytes, under 270 characters of base64; twice that is plenty.
MAX_CURSOR_CHARS = 512
READ_MODES = frozenset({pb.READ_MODE_ALLOW_CACHED, pb.READ_MODE_PRIMARY})
# Every operation a request may carry, as the oneof and the callers' allowlists name them.
OPERATIONS = frozenset(get_args(OperationName))
MUTATIONS = frozenset({"write", "delete"})
# What an envelope's ``operation`` may be: one of those, or many of them.
MESSAGE_OPERATIONS = OPERATIONS | {"batch", "read_many"}


def _check(pattern: re.Pattern[str], value: str, name: str) -> None:
    if not pattern.fullmatch(value):
        if not value:
            raise InvalidArgument(f"{name} is missing")
        raise InvalidArgument(f"{name} is malformed (allowed: {pattern.pattern})")


def decode_request(
    data: object, limits: Limits, *, max_bytes: int = 0, max_ops: int = 1
) -> pb.RequestEnvelope:
    """Parse and validate one request envelope: at most ``max_bytes``
    (default ``limits.max_request_bytes``), and a batch (or a read_many) of at
    most ``max_ops`` operations, whose own fields the worker checks one by one
    (:func:`validate_operation`)."""
    if not isinstance(data, bytes):
        raise InvalidArgument("the request body must be a protobuf RequestEnvelope")
    bound = max_bytes or limits.max_request_bytes
    if len(data) > bound:
        raise InvalidArgument(f"request is {len(data)} bytes; the limit is {bound}")
    envelope = pb.RequestEnvelope()
    try:
        envelope.ParseFromString(data)
    except (DecodeError, ValueError, RecursionError):
        raise InvalidArgument("request is not a valid access.v2.RequestEnvelope") from None
    operation = envelope.WhichOneof("operation")
    if operation == "batch":
        validate_batch(envelope, max_ops)
    elif operation == "read_many":
        validate_read_many(envelope, max_ops)
    else:
        validate_request(envelope, limits)
    return envelope


def validate_batch(envelope: pb.RequestEnvelope, max_ops: int) -> None:
    """A batch envelope's own fields and its shape: every operation has a
    distinct valid request id, a deadline within the envelope's and a write
    or delete. What each operation asks is checked apart, so that one bad
    operation fails alone."""
    _envelope_fields(envelope)
    if envelope.idempotency_key:
        raise InvalidArgument("a batch's idempotency keys are its operations'")
    operations = envelope.batch.operations
    if not 0 < len(operations) <= max_ops:
        raise InvalidArgument(f"a batch holds 1 to {max_ops} operations here")
    seen: set[str] = set()
    for operation in operations:
        _check(REQUEST_ID_RE, operation.request_id, "a batch operation's request_id")
        if operation.request_id in seen or operation.request_id == envelope.request_id:
            raise InvalidArgument("a batch's request ids must be distinct")
        seen.add(operation.request_id)
        if not 0 < operation.deadline_unix_ms <= envelope.deadline_unix_ms:
            raise InvalidArgument("a batch operation's deadline must be within the envelope's")
        if operation.WhichOneof("operation") is None:
            raise InvalidArgument("a batch operation has an unknown or missing operation")


def operation_count(envelope: pb.RequestEnvelope) -> int:
    """How many operations an envelope carries: admission, the caller's rate
    and a lane's bounds count these, not messages."""
    operation = envelope.WhichOneof("operation")
    if operation == "batch":
        return len(envelope.batch.operations)
    if operation == "read_many":
        return len(envelope.read_many.reads)
    return 1


def validate_read_many(envelope: pb.RequestEnvelope, max_ops: int) -> None:
    """A read_many envelope's own fields and its size in reads. Each read is
    checked apart (:func:`validate_operation`), so that one bad id fails alone."""
    _envelope_fields(envelope)
    if envelope.idempotency_key:
        raise InvalidArgument("idempotency_key is only allowed on write and delete")
    if not 0 < len(envelope.read_many.reads) <= max_ops:
        raise InvalidArgument(f"a read_many holds 1 to {max_ops} reads here")


def _envelope_fields(envelope: pb.RequestEnvelope) -> None:
    _check(CALLER_RE, envelope.caller, "caller")
    _check(REQUEST_ID_RE, envelope.request_id, "request_id")
    if envelope.reply_channel:
        # It names a Redis key (keys.reply_key): the request id's rule keeps it plain.
        _check(REQUEST_ID_RE, envelope.reply_channel, "reply_channel")
    if envelope.deadline_unix_ms <= 0:
        raise InvalidArgument("deadline_unix_ms is missing")
    if envelope.issued_at_unix_ms <= 0:
        raise InvalidArgument("issued_at_unix_ms is missing")


def validate_request(envelope: pb.RequestEnvelope, limits: Limits) -> None:
    _envelope_fields(envelope)
    operation = envelope.WhichOneof("operation")
    if operation is None or operation == "batch":
        raise InvalidArgument("unknown or missing operation")
    if operation == "read_many":
        # Each read as the worker checks it; their number, by the lane's bound.
        for read in envelope.read_many.reads:
            validate_operation("read", read, "", limits)
        validate_read_many(envelope, len(envelope.read_many.reads) or 1)
        return
    validate_operation(operation, getattr(envelope, operation), envelope.idempotency_key, limits)


def validate_operation(operation: str, request: Any, idempotency_key: str, limits: Limits) -> None:
    """What one operation asks (``request``: its message), alone or in a batch."""
    if operation in MUTATIONS:
        _check(IDEMPOTENCY_KEY_RE, idempotency_key, "idempotency_key")
    elif idempotency_key:
        raise InvalidArgument("idempotency_key is only allowed on write and delete")
    if operation == "read":
        read = request
        _check(SCOPE_RE, read.scope, "scope")
        _check(OBJECT_ID_RE, read.object_id, "object_id")
        if read.mode not in READ_MODES:
            raise InvalidArgument("mode must be READ_MODE_ALLOW_CACHED or READ_MODE_PRIMARY")
    elif operation == "write":
        write = request
        _check(SCOPE_RE, write.scope, "scope")
        _check(OBJECT_ID_RE, write.object_id, "object_id")
        if len(write.payload) > limits.max_payload_bytes:
            raise InvalidArgument(
                f"payload is {len(write.payload)} bytes; the limit is {limits.max_payload_bytes}"
            )
    elif operation == "delete":
        _check(SCOPE_RE, request.scope, "scope")
        _check(OBJECT_ID_RE, request.object_id, "object_id")
    else:
        listing = request
        _check(SCOPE_RE, listing.scope, "scope")
        if listing.cursor:
            decode_cursor(listing.cursor, listing.scope)


def page_size(request: pb.ListRecordsRequest, limits: Limits) -> int:
    """The page size to use: the default for 0, capped at the configured maximum."""
    if request.page_size == 0:
        return limits.list_default_page_size
    return min(request.page_size, limits.list_max_page_size)


def encode_cursor(scope: str, after_object_id: str) -> str:
    raw = pb.ListCursor(scope=scope, after_object_id=after_object_id).SerializeToString()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str, scope: str) -> str:
    """The object id a page starts after; the cursor must belong to ``scope``."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise InvalidArgument("cursor is too long")
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.b64decode(padded, altchars=b"-_", validate=True)
        parsed = pb.ListCursor.FromString(raw)
    except (binascii.Error, ValueError, DecodeError):
        raise InvalidArgument("cursor is malformed") from None
    if parsed.scope != scope:
        raise InvalidArgument("cursor belongs to another scope")
    if not OBJECT_ID_RE.fullmatch(parsed.after_object_id):
        raise InvalidArgument("cursor is malformed")
    return parsed.after_object_id
