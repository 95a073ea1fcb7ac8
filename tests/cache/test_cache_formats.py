"""The cache's two record formats and the frame Redis stores them in.

A record cached in either format comes back as the same record, through the
one conversion (``record_to_pb``/``record_from_pb``); both formats hold the
same fields; a body that is not a record is a ``ValueError`` and nothing else;
a stored value that is not a frame unframes to None.
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.cache.formats import CODECS, Codec, V1Json, V2Protobuf, frame, unframe
from dataservice.codec import record_from_pb, record_to_pb
from dataservice.enums import CacheFormat
from dataservice.proto import pb
from dataservice.types import Record

UINT64_MAX = 2**64 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FIELDS = {"object_id", "revision", "payload", "updated_at_unix_ms"}
PROPERTY = settings(deadline=None, derandomize=True, database=None, print_blob=False)

V1 = CODECS[CacheFormat.V1]
V2 = CODECS[CacheFormat.V2]
BOTH = pytest.mark.parametrize("codec", [V1, V2], ids=lambda c: c.format.value)


def record(**fields: object) -> Record:
    values: dict[str, object] = {
        "object_id": "invoice:42",
        "revision": 7,
        "payload": b'{"total": 12}',
        "updated_at": datetime(2026, 12, 1, 12, 0, 0, 123_000, tzinfo=UTC),
    }
    values.update(fields)
    return Record(**values)  # type: ignore[arg-type]


RECORDS = {
    "plain": record(),
    "empty payload": record(payload=b""),
    "64 KB payload": record(payload=bytes(range(256)) * 256),
    "every byte value": record(payload=bytes(range(256))),
    "not UTF-8, JSON or base64 safe": record(payload=b'\xff\xfe\x00"\\\n:=+/'),
    "largest revision": record(revision=UINT64_MAX),
    "revision past a double's exact integers": record(revision=2**53 + 1),
    "revision 0": record(revision=0),
    "before the epoch": record(updated_at=datetime(1901, 1, 1, tzinfo=UTC)),
    "id JSON must escape": record(object_id='a"b\\c\u00e9\u2028'),
}


@BOTH
@pytest.mark.parametrize("original", RECORDS.values(), ids=RECORDS.keys())
def test_a_record_comes_back_unchanged(codec: Codec, original: Record) -> None:
    body = codec.encode(record_to_pb(original))
    assert record_from_pb(codec.decode(body)) == original


@pytest.mark.parametrize("original", RECORDS.values(), ids=RECORDS.keys())
def test_both_formats_hold_the_same_fields(original: Record) -> None:
    message = record_to_pb(original)
    assert {field.name for field in pb.Record.DESCRIPTOR.fields} == FIELDS
    assert set(json.loads(V1.encode(message))) == FIELDS
    assert V1.decode(V1.encode(message)) == V2.decode(V2.encode(message)) == message


def test_v1_is_compact_utf8_json_with_a_base64_payload() -> None:
    message = pb.Record(object_id="é", revision=3, payload=b"\x00\xff", updated_at_unix_ms=-5)
    assert V1.encode(message) == (
        b'{"object_id":"\xc3\xa9","revision":3,"payload":"AP8=","updated_at_unix_ms":-5}'
    )


def test_codecs_has_one_codec_per_format_under_its_own_name() -> None:
    assert set(CODECS) == set(CacheFormat)
    assert all(codec.format is fmt for fmt, codec in CODECS.items())
    assert isinstance(CODECS[CacheFormat.V1], V1Json)
    assert isinstance(CODECS[CacheFormat.V2], V2Protobuf)


def v1_body(**fields: object) -> bytes:
    values: dict[str, object] = {
        "object_id": "invoice:42",
        "revision": 7,
        "payload": "AP8=",
        "updated_at_unix_ms": 1_764_590_400_000,
    }
    values.update(fields)
    return json.dumps({k: v for k, v in values.items() if v is not ...}).encode()


MALFORMED_V1 = {
    "empty": b"",
    "not UTF-8": b'{"object_id":"\xff"}',
    "UTF-16": v1_body().decode().encode("utf-16"),
    "not JSON": b"{object_id}",
    "trailing data": v1_body() + b"{}",
    "an array": b'["invoice:42", 7, "AP8=", 0]',
    "a protobuf body": V2.encode(pb.Record(object_id="x", revision=1)),
    "too deeply nested": b"[" * 100_000,
    "missing object_id": v1_body(object_id=...),
    "missing payload": v1_body(payload=...),
    "an extra field": v1_body(extra=1),
    "object_id empty": v1_body(object_id=""),
    "object_id a number": v1_body(object_id=42),
    "object_id an unpaired surrogate": v1_body(object_id="\ud800"),
    "revision a string": v1_body(revision="7"),
    "revision a float": v1_body(revision=7.0),
    "revision a bool": v1_body(revision=True),
    "revision null": v1_body(revision=None),
    "revision negative": v1_body(revision=-1),
    "revision past uint64": v1_body(revision=UINT64_MAX + 1),
    "revision with 5,000 digits": b'{"revision":' + b"9" * 5000 + b"}",
    "updated_at a float": v1_body(updated_at_unix_ms=1.5),
    "updated_at past int64": v1_body(updated_at_unix_ms=INT64_MAX + 1),
    "payload bytes as a list": v1_body(payload=[0, 255]),
    "payload not base64": v1_body(payload="AP8*"),
    "payload unpadded": v1_body(payload="AP8"),
    "payload urlsafe base64": v1_body(payload="_-8="),
    "payload with a newline": v1_body(payload="AP8=\n"),
    "payload not ASCII": v1_body(payload="AP8\u00e9"),
}

MALFORMED_V2 = {
    "empty (no object_id)": b"",
    "only a revision": pb.Record(revision=7).SerializeToString(),
    "corrupt wire format": b"\xff\xff\xff",
    "object_id not UTF-8": b"\x0a\x02\xff\xfe",
    "truncated": V2.encode(pb.Record(object_id="invoice:42", payload=b"x" * 100))[:-1],
    "a v1 body": v1_body(),
}


@pytest.mark.parametrize("body", MALFORMED_V1.values(), ids=MALFORMED_V1.keys())
def test_a_malformed_v1_body_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError, match="v1 cache body"):
        V1.decode(body)


@pytest.mark.parametrize("body", MALFORMED_V2.values(), ids=MALFORMED_V2.keys())
def test_a_malformed_v2_body_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError, match="v2 cache body"):
        V2.decode(body)


def test_a_frame_starts_with_the_revision_in_decimal() -> None:
    assert frame(42, b"body") == b"42:body"
    assert frame(UINT64_MAX, b"") == b"18446744073709551615:"
    assert unframe(b"0:") == (0, b"")
    assert unframe(b"42:a:b") == (42, b"a:b")


@pytest.mark.parametrize("revision", [-1, UINT64_MAX + 1])
def test_a_revision_no_record_can_have_is_not_framed(revision: int) -> None:
    with pytest.raises(ValueError, match="revision"):
        frame(revision, b"body")


NOT_FRAMES = {
    "empty": b"",
    "no colon": b"42",
    "no revision": b":body",
    "negative": b"-1:body",
    "signed": b"+1:body",
    "leading zero": b"07:body",
    "two zeros": b"00:body",
    "space": b" 7:body",
    "underscore": b"1_000:body",
    "not ASCII digits": "\u0661:body".encode(),
    "hex": b"0x1f:body",
    "past uint64": b"18446744073709551616:body",
    "21 digits": b"1" * 21 + b":body",
    "a bare body": b'{"object_id":"x"}',
}


@pytest.mark.parametrize("value", NOT_FRAMES.values(), ids=NOT_FRAMES.keys())
def test_a_value_that_is_not_a_frame_unframes_to_none(value: bytes) -> None:
    assert unframe(value) is None


def messages(
    updated_at_unix_ms: st.SearchStrategy[int] = st.integers(INT64_MIN, INT64_MAX),
) -> st.SearchStrategy[pb.Record]:
    return st.builds(
        pb.Record,
        object_id=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=200),
        revision=st.integers(0, UINT64_MAX),
        payload=st.binary(max_size=4096),
        updated_at_unix_ms=updated_at_unix_ms,
    )


# The instants a datetime holds: years 1 to 9999.
records = messages(st.integers(-62_135_596_800_000, 253_402_300_799_999)).map(record_from_pb)


@BOTH
@PROPERTY
@given(message=messages())
def test_any_message_round_trips(codec: Codec, message: pb.Record) -> None:
    assert codec.decode(codec.encode(message)) == message


@BOTH
@PROPERTY
@given(original=records)
def test_any_record_round_trips_through_the_one_conversion(codec: Codec, original: Record) -> None:
    assert record_from_pb(codec.decode(codec.encode(record_to_pb(original)))) == original


@PROPERTY
@given(message=messages())
def test_both_formats_decode_to_the_same_message(message: pb.Record) -> None:
    assert V1.decode(V1.encode(message)) == V2.decode(V2.encode(message))


@BOTH
@PROPERTY
@given(body=st.binary(max_size=512))
def test_nothing_but_value_error_escapes_decode(codec: Codec, body: bytes) -> None:
    with contextlib.suppress(ValueError):
        codec.decode(body)


@BOTH
@PROPERTY
@given(message=messages(), data=st.data())
def test_nothing_but_value_error_escapes_decode_of_a_damaged_body(
    codec: Codec, message: pb.Record, data: st.DataObject
) -> None:
    body = bytearray(codec.encode(message))
    body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(ValueError):
        codec.decode(bytes(body[: data.draw(st.integers(0, len(body)))]))


@PROPERTY
@given(revision=st.integers(0, UINT64_MAX), body=st.binary(max_size=512))
def test_any_frame_unframes_to_what_was_framed(revision: int, body: bytes) -> None:
    assert unframe(frame(revision, body)) == (revision, body)


@PROPERTY
@given(a=st.integers(0, UINT64_MAX), b=st.integers(0, UINT64_MAX))
def test_revisions_compare_by_length_then_bytes(a: int, b: int) -> None:
    head_a, head_b = frame(a, b"").rstrip(b":"), frame(b, b"").rstrip(b":")
    assert ((len(head_a), head_a) < (len(head_b), head_b)) == (a < b)


@PROPERTY
@given(value=st.binary(max_size=64))
def test_unframe_takes_only_what_frame_makes(value: bytes) -> None:
    parsed = unframe(value)
    assert parsed is None or frame(*parsed) == value
