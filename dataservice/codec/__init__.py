"""The wire format's Python side (``access.v2``, see ``docs/protocol.md``).

- :mod:`.requests`: decode and validate a request envelope; list cursors.
- :mod:`.envelopes`: build a request from an operation; build and read answers.
- :mod:`.records`: a record's one conversion to and from its message.
"""

from dataservice.codec.envelopes import (
    batch_envelope,
    batch_operation,
    decode_response,
    error_response,
    lone_envelope,
    parse_response,
    request_envelope,
    result_of,
)
from dataservice.codec.records import record_from_pb, record_to_pb
from dataservice.codec.requests import (
    decode_cursor,
    decode_request,
    encode_cursor,
    operation_count,
    page_size,
    validate_batch,
    validate_operation,
    validate_read_many,
    validate_request,
)

__all__ = [
    "batch_envelope",
    "batch_operation",
    "decode_cursor",
    "decode_request",
    "decode_response",
    "encode_cursor",
    "error_response",
    "lone_envelope",
    "operation_count",
    "page_size",
    "parse_response",
    "record_from_pb",
    "record_to_pb",
    "request_envelope",
    "result_of",
    "validate_batch",
    "validate_operation",
    "validate_read_many",
    "validate_request",
]
