"""A record's one conversion between the service's value and the wire message.

Every format a record travels in (the answer on the wire today, the cache's
formats next) converts through these two functions, so each holds the same
fields, the revision included.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dataservice.proto import pb
from dataservice.types import Record

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def unix_ms(moment: datetime) -> int:
    """Whole milliseconds since the epoch, exactly (no float rounding)."""
    return (moment - _EPOCH) // _MS


def from_unix_ms(value: int) -> datetime:
    return _EPOCH + value * _MS


def record_to_pb(record: Record) -> pb.Record:
    return pb.Record(
        object_id=record.object_id,
        revision=record.revision,
        payload=record.payload,
        updated_at_unix_ms=unix_ms(record.updated_at),
    )


def record_from_pb(message: pb.Record) -> Record:
    return Record(
        object_id=message.object_id,
        revision=message.revision,
        payload=message.payload,
        updated_at=from_unix_ms(message.updated_at_unix_ms),
    )
