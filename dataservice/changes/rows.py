"""The records table's row events, read for what the cache needs of them.

Per changed row the consumer needs three columns of each row image: the key
(``scope``, ``object_id``) and the ``revision``. mysql-replication decodes
every column of every image into Python values, about 90 µs a row here: a
batch's 500-row upsert (both images of each row) took 45 ms to decode before
a single cache entry could go. :func:`record_changes` instead walks the
event's row bytes once, with a plan made from the table map's column types:
the three columns are decoded, every other column is skipped by its width or
its length prefix.

An event it cannot plan for is decoded by the library as before: a column
type outside the plan, a table map without column names, an image without
the three columns (a row image other than FULL), a null in one of them, or
bytes that do not add up to the event's rows (:func:`read_keys` answers
None and leaves the event as it found it). Both ways give the same changes
(``tests/changes/test_binlog_rows.py`` compares them on the same binlog).

This is the one module that uses mysql-replication's event internals: the
packet wrapper's ``read``, ``unread`` and ``read_bytes``, the event's
``event_size``, ``complete``, ``columns`` (``type``, ``name``, ``unsigned``,
``character_set_name``, ``max_length``, ``length_size``, ``fsp``) and its
present-column bitmaps. ``tests/changes/test_binlog_rows.py`` pins each of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pymysqlreplication.constants import FIELD_TYPE
from pymysqlreplication.row_event import DeleteRowsEvent, RowsEvent, UpdateRowsEvent


class RecordChange(NamedTuple):
    """One changed record. A tuple: a 500-row transaction makes a thousand."""

    scope: str
    object_id: str
    # A write's new revision; a delete's revision plus one.
    floor: int


# The columns read, by name, and their place in a decoded image.
_SCOPE, _OBJECT_ID, _REVISION = 0, 1, 2
_WANTED = {"scope": _SCOPE, "object_id": _OBJECT_ID, "revision": _REVISION}
_KEY_TYPES = frozenset({FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING, FIELD_TYPE.BLOB})
_INTEGER_TYPES = frozenset(
    {FIELD_TYPE.TINY, FIELD_TYPE.SHORT, FIELD_TYPE.INT24, FIELD_TYPE.LONG, FIELD_TYPE.LONGLONG}
)
# Bytes of a value of fixed width (the row format's, not the column's display).
_FIXED = {
    FIELD_TYPE.TINY: 1,
    FIELD_TYPE.SHORT: 2,
    FIELD_TYPE.INT24: 3,
    FIELD_TYPE.LONG: 4,
    FIELD_TYPE.LONGLONG: 8,
    FIELD_TYPE.FLOAT: 4,
    FIELD_TYPE.DOUBLE: 8,
    FIELD_TYPE.YEAR: 1,
    FIELD_TYPE.DATE: 3,
    FIELD_TYPE.TIMESTAMP: 4,
    FIELD_TYPE.DATETIME: 8,
}
# Temporal types of the newer format: a base width plus (fsp + 1) // 2 bytes.
_FRACTIONAL = {FIELD_TYPE.DATETIME2: 5, FIELD_TYPE.TIMESTAMP2: 4, FIELD_TYPE.TIME2: 3}


@dataclass(frozen=True, slots=True)
class _Step:
    """One present column of an image: how to pass it, and what it is."""

    # Bytes of a fixed-width value; 0 for one behind a length prefix.
    width: int
    # Bytes of the length prefix; 0 for a fixed-width value.
    prefix: int
    # _SCOPE, _OBJECT_ID or _REVISION; -1 for a column passed over.
    field: int
    encoding: str
    signed: bool


def record_changes(event: Any) -> list[RecordChange]:
    """Every record a rows event of the records table changed, with the
    lowest revision a cache fill may still bring for it."""
    if not event.complete:
        return []
    read = read_keys(event)
    return read if read is not None else library_changes(event)


def read_keys(event: Any) -> list[RecordChange] | None:
    """The changes, read straight from the event's rows; None, the event
    untouched, when it is not one this module plans for."""
    update = isinstance(event, UpdateRowsEvent)
    plan = _plan(event, update)
    if plan is None:
        return None
    first, second = plan
    packet = event.packet
    data: bytes = packet.read(event.event_size - packet.read_bytes)
    changes = _walk(data, first, second, update, isinstance(event, DeleteRowsEvent))
    if changes is None:
        packet.unread(data)
    return changes


_Plan = tuple[list["_Step"], list["_Step"]]


class _LastPlan:
    """The last table map's plan, by the table map's own columns (one object
    per table map event, shared by its transaction's row events) and bitmaps."""

    entry: tuple[Any, bytes, bytes, _Plan | None] = (None, b"", b"", None)


def _plan(event: Any, update: bool) -> _Plan | None:
    """The steps of each image's present columns; None: not planned for."""
    columns = event.columns
    first_bitmap = event.columns_present_bitmap
    second_bitmap = event.columns_present_bitmap2 if update else first_bitmap
    known, known_first, known_second, plan = _LastPlan.entry
    if known is columns and (known_first, known_second) == (first_bitmap, second_bitmap):
        return plan
    plan = None
    steps = [_step(column) for column in columns]
    if None not in steps:
        planned = [step for step in steps if step is not None]
        first = _present(planned, first_bitmap)
        second = _present(planned, second_bitmap) if update else first
        if first is not None and second is not None:
            plan = (first, second)
    _LastPlan.entry = (columns, first_bitmap, second_bitmap, plan)
    return plan


def _walk(
    data: bytes,
    first: Sequence[_Step],
    second: Sequence[_Step],
    update: bool,
    delete: bool,
) -> list[RecordChange] | None:
    """Every row's change; None where the bytes are not what the plan says."""
    changes: list[RecordChange] = []
    pos, end = 0, len(data)
    while pos < end:
        image, pos = _image(data, pos, first)
        if image is None:
            return None
        if not update:
            scope, object_id, revision = image
            changes.append(RecordChange(scope, object_id, revision + 1 if delete else revision))
            continue
        after, pos = _image(data, pos, second)
        if after is None:
            return None
        if (image[_SCOPE], image[_OBJECT_ID]) != (after[_SCOPE], after[_OBJECT_ID]):
            # A key that moved: the old one is gone as if deleted.
            changes.append(RecordChange(image[_SCOPE], image[_OBJECT_ID], image[_REVISION] + 1))
        changes.append(RecordChange(after[_SCOPE], after[_OBJECT_ID], after[_REVISION]))
    return changes if pos == end else None


def _image(data: bytes, pos: int, steps: Sequence[_Step]) -> tuple[list[Any] | None, int]:
    """One row image from ``pos``: [scope, object_id, revision] (None: a null
    or undecodable one of them, or bytes that run out) and where it ends."""
    size = (len(steps) + 7) // 8
    nulls = int.from_bytes(data[pos : pos + size], "little")
    pos += size
    found: list[Any] = [None, None, None]
    for bit, step in enumerate(steps):
        if nulls >> bit & 1:
            if step.field >= 0:
                return None, pos
            continue
        if step.prefix:
            length = int.from_bytes(data[pos : pos + step.prefix], "little")
            pos += step.prefix
            if step.field >= 0:
                try:
                    found[step.field] = data[pos : pos + length].decode(step.encoding)
                except UnicodeDecodeError:
                    return None, pos
            pos += length
        else:
            if step.field >= 0:
                found[step.field] = int.from_bytes(
                    data[pos : pos + step.width], "little", signed=step.signed
                )
            pos += step.width
    return (found if pos <= len(data) else None), pos


def _present(steps: Sequence[_Step], bitmap: bytes) -> list[_Step] | None:
    """The steps of the columns an image holds; None unless all three wanted are there."""
    present = int.from_bytes(bitmap, "little")
    held = [step for i, step in enumerate(steps) if present >> i & 1]
    if sorted(step.field for step in held if step.field >= 0) != [_SCOPE, _OBJECT_ID, _REVISION]:
        return None
    return held


def _step(column: Any) -> _Step | None:
    """How to pass one column; None for one outside the plan."""
    if not column.name:
        return None
    field = _WANTED.get(column.name, -1)
    kind = column.type
    if field in (_SCOPE, _OBJECT_ID) and kind not in _KEY_TYPES:
        return None
    if field == _REVISION and kind not in _INTEGER_TYPES:
        return None
    encoding = ""
    if field in (_SCOPE, _OBJECT_ID):
        encoding = _encoding(column)
        if not encoding:
            return None
    signed = not column.unsigned
    if kind in _FIXED:
        return _Step(_FIXED[kind], 0, field, encoding, signed)
    if kind in _FRACTIONAL:
        return _Step(_FRACTIONAL[kind] + (column.fsp + 1) // 2, 0, field, encoding, signed)
    if kind in (FIELD_TYPE.VARCHAR, FIELD_TYPE.STRING):
        return _Step(0, 2 if column.max_length > 255 else 1, field, encoding, signed)
    if kind == FIELD_TYPE.BLOB:
        return _Step(0, column.length_size, field, encoding, signed)
    return None


def _encoding(column: Any) -> str:
    """The Python codec of a key column's character set; "" for one Python lacks."""
    if column.character_set_name is None:
        return "utf-8"
    encoding: str = RowsEvent.charset_to_encoding(column.character_set_name)
    try:
        "".encode(encoding)
    except LookupError:
        return ""
    return encoding


def library_changes(event: Any) -> list[RecordChange]:
    """The changes, from the library's own decoding of every column."""
    changes = []
    for row in event.rows:
        if isinstance(event, UpdateRowsEvent):
            before, after = row["before_values"], row["after_values"]
            if (before["scope"], before["object_id"]) != (after["scope"], after["object_id"]):
                changes.append(
                    RecordChange(before["scope"], before["object_id"], before["revision"] + 1)
                )
            changes.append(RecordChange(after["scope"], after["object_id"], after["revision"]))
        elif isinstance(event, DeleteRowsEvent):
            values = row["values"]
            changes.append(
                RecordChange(values["scope"], values["object_id"], values["revision"] + 1)
            )
        else:
            values = row["values"]
            changes.append(RecordChange(values["scope"], values["object_id"], values["revision"]))
    return changes
