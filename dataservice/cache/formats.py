"""A cached record's two formats, and the frame each is stored in.

Both formats hold exactly the fields of ``pb.Record``, so a record reaches and
leaves the cache through its one conversion (:func:`~dataservice.codec.record_to_pb`,
:func:`~dataservice.codec.record_from_pb`), whichever format it is cached in:

- **v1**, JSON: ``{"object_id":…,"revision":…,"payload":…,"updated_at_unix_ms":…}``,
  compact, UTF-8, the payload in standard base64 (padded);
- **v2**, protobuf: the ``pb.Record`` message's wire bytes.

A body that does not decode is a ``ValueError``, in either format and whatever
went wrong in it. A record without an object id is refused in both formats,
because protobuf cannot tell an empty id from a missing one.

Redis stores ``frame(revision, body)``: the revision in canonical decimal (no
sign, no leading zero), a colon, then the body. A Lua script reads the revision
without knowing the format. Canonical decimal also lets a script compare two
revisions exactly, by length and then byte by byte: a Lua number is a double
and holds integers exactly only up to 2^53.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from dataservice.enums import CacheFormat
from dataservice.proto import pb

__all__ = ["CODECS", "Codec", "V1Json", "V2Protobuf", "frame", "unframe"]

_MAX_REVISION = 2**64 - 1  # pb.Record.revision is a uint64
_MAX_REVISION_DIGITS = len(str(_MAX_REVISION))
_SEP = b":"
_V1_FIELDS = frozenset(pb.Record.DESCRIPTOR.fields_by_name)
_V1_TEMPLATE = b'{"object_id":%b,"revision":%d,"payload":"%b","updated_at_unix_ms":%d}'
# ensure_ascii off: the body is UTF-8, not JSON's \u escapes of it.
_JSON_STRING = json.JSONEncoder(ensure_ascii=False)
_JSON = json.JSONDecoder()


class Codec(Protocol):
    """One cache format: a ``pb.Record`` to a body and back."""

    format: CacheFormat

    def encode(self, record: pb.Record) -> bytes: ...

    def decode(self, body: bytes) -> pb.Record:
        """The record in ``body``; ``ValueError`` if ``body`` is not one."""
        ...


class V1Json:
    """v1: a JSON object with the record's four fields, checked strictly on decode."""

    format = CacheFormat.V1

    def encode(self, record: pb.Record) -> bytes:
        # Written out rather than dumped from a dict: only the id can need escaping
        # (integers and base64 never do), and sparing the encoder a scan of the
        # base64 text makes a 1 KB encode about three times cheaper.
        return _V1_TEMPLATE % (
            _JSON_STRING.encode(record.object_id).encode(),
            record.revision,
            binascii.b2a_base64(record.payload, newline=False),
            record.updated_at_unix_ms,
        )

    def decode(self, body: bytes) -> pb.Record:
        try:
            # Decoded first so that only UTF-8 is accepted: json.loads would also
            # take UTF-16 and UTF-32 bytes.
            fields = _JSON.decode(body.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"v1 cache body is not JSON: {exc}") from exc
        object_id, revision, text, updated_at = _v1_fields(fields)
        try:
            payload = binascii.a2b_base64(text, strict_mode=True)
        except ValueError as exc:
            raise ValueError(f"v1 cache body's payload is not base64: {exc}") from exc
        try:
            return pb.Record(
                object_id=object_id,
                revision=revision,
                payload=payload,
                updated_at_unix_ms=updated_at,
            )
        except ValueError as exc:  # out of the field's range, or an unpaired surrogate
            raise ValueError(f"v1 cache body does not fit a record: {exc}") from exc


def _v1_fields(fields: Any) -> tuple[str, int, str, int]:
    if type(fields) is not dict or fields.keys() != _V1_FIELDS:
        raise ValueError(f"v1 cache body is not an object of exactly {sorted(_V1_FIELDS)}")
    object_id = fields["object_id"]
    revision = fields["revision"]
    payload = fields["payload"]
    updated_at = fields["updated_at_unix_ms"]
    # type() rather than isinstance(): JSON true is a bool, and a bool is an int.
    if type(object_id) is not str or not object_id:
        raise ValueError("v1 cache body: object_id must be a non-empty string")
    if type(revision) is not int:
        raise ValueError("v1 cache body: revision must be an integer")
    if type(payload) is not str:
        raise ValueError("v1 cache body: payload must be a base64 string")
    if type(updated_at) is not int:
        raise ValueError("v1 cache body: updated_at_unix_ms must be an integer")
    return object_id, revision, payload, updated_at


class V2Protobuf:
    """v2: the ``pb.Record`` message's wire bytes."""

    format = CacheFormat.V2

    def encode(self, record: pb.Record) -> bytes:
        return record.SerializeToString()

    def decode(self, body: bytes) -> pb.Record:
        try:
            record = pb.Record.FromString(body)
        except DecodeError as exc:
            raise ValueError(f"v2 cache body is not a record: {exc}") from exc
        # Most short byte strings parse as some message (b"" as an empty one); a
        # record always has its id.
        if not record.object_id:
            raise ValueError("v2 cache body has no object_id")
        return record


CODECS: Mapping[CacheFormat, Codec] = MappingProxyType(
    {CacheFormat.V1: V1Json(), CacheFormat.V2: V2Protobuf()}
)


def frame(revision: int, body: bytes) -> bytes:
    """The value Redis stores: ``b"<revision>:" + body``."""
    if not 0 <= revision <= _MAX_REVISION:
        raise ValueError(f"revision {revision} is outside 0..2^64-1")
    return b"%d:%b" % (revision, body)


def unframe(value: bytes) -> tuple[int, bytes] | None:
    """``(revision, body)`` from a stored value; None if it is not one ``frame`` makes."""
    head, sep, body = value.partition(_SEP)
    if (
        not sep
        or not head.isdigit()  # ASCII digits only, so no sign, space or underscore
        or len(head) > _MAX_REVISION_DIGITS
        or (head[:1] == b"0" and len(head) > 1)
    ):
        return None
    revision = int(head)
    if revision > _MAX_REVISION:
        return None
    return revision, body
