"""Request decoding and validation in dataservice.codec.

Every bad input must come back as InvalidArgument (never another exception),
and the checks happen in the documented order: size, parse, then fields.
"""

from __future__ import annotations

import base64

import pytest

from dataservice.codec import decode_cursor, decode_request, encode_cursor, page_size
from dataservice.codec.requests import MAX_CURSOR_CHARS
from dataservice.config.model import Limits
from dataservice.config.settings import Settings
from dataservice.enums import StatusCode
from dataservice.errors import InvalidArgument
from dataservice.proto import pb

DEADLINE = 1_735_689_600_000
ISSUED_AT = DEADLINE - 30_000


@pytest.fixture(scope="module")
def limits() -> Limits:
    """The limits shipped in queues.yml."""
    return Settings.from_env({}).load().limits


def small_limits(*, default_page: int = 10, max_page: int = 20) -> Limits:
    return Limits(
        max_payload_bytes=16,
        max_request_bytes=16 + 1024,
        max_response_bytes=16 + 1024,
        list_default_page_size=default_page,
        list_max_page_size=max_page,
    )


def envelope(**fields: object) -> pb.RequestEnvelope:
    """A valid envelope with a read operation unless ``fields`` says otherwise."""
    values: dict[str, object] = {
        "caller": "billing",
        "request_id": "req-1",
        "deadline_unix_ms": DEADLINE,
        "issued_at_unix_ms": ISSUED_AT,
    }
    operations = {"read", "write", "delete", "list"}
    if not operations & fields.keys():
        values["read"] = pb.ReadRecordRequest(
            scope="tenant-a", object_id="invoice:42", mode=pb.READ_MODE_ALLOW_CACHED
        )
    values.update(fields)
    return pb.RequestEnvelope(**values)  # type: ignore[arg-type]


def valid_envelopes() -> dict[str, pb.RequestEnvelope]:
    return {
        "read": envelope(),
        "read_primary": envelope(
            read=pb.ReadRecordRequest(scope="t", object_id="o", mode=pb.READ_MODE_PRIMARY)
        ),
        "write": envelope(
            idempotency_key="k-1",
            write=pb.WriteRecordRequest(scope="tenant-a", object_id="o", payload=b"\x00\xff"),
        ),
        "write_empty_payload": envelope(
            idempotency_key="k-3", write=pb.WriteRecordRequest(scope="t", object_id="o")
        ),
        "write_conditional": envelope(
            idempotency_key="k-4",
            write=pb.WriteRecordRequest(
                scope="t", object_id="o", payload=b"x", expected_revision=2**64 - 1
            ),
        ),
        "delete": envelope(
            idempotency_key="k-2", delete=pb.DeleteRecordRequest(scope="t", object_id="o")
        ),
        "delete_conditional": envelope(
            idempotency_key="k-5",
            delete=pb.DeleteRecordRequest(scope="t", object_id="o", expected_revision=7),
        ),
        "list": envelope(list=pb.ListRecordsRequest(scope="tenant-a")),
        "read_on_a_reply_channel": envelope(reply_channel="Chan_nel-22" + "x" * 53),
        "list_with_cursor": envelope(
            list=pb.ListRecordsRequest(
                scope="tenant-a", page_size=5, cursor=encode_cursor("tenant-a", "invoice:41")
            )
        ),
    }


def reject(data: object, limits: Limits, match: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument, match=match) as caught:
        decode_request(data, limits)
    return caught.value


@pytest.mark.parametrize("channel", ["a:b", "a*", "x" * 65, "caf\u00e9", "a b"])
def test_a_reply_channel_outside_the_request_ids_rule_is_refused(
    channel: str, limits: Limits
) -> None:
    reject(envelope(reply_channel=channel).SerializeToString(), limits, "reply_channel")


def pad_to(data: bytes, size: int) -> bytes:
    """``data`` plus one unknown bytes field (number 99) so the total is ``size``."""
    tag = _varint(99 << 3 | 2)
    for length_bytes in range(1, 6):
        filler = size - len(data) - len(tag) - length_bytes
        header = _varint(filler) if filler >= 0 else b""
        if len(header) == length_bytes:
            return data + tag + header + b"\x00" * filler
    raise AssertionError(f"cannot pad {len(data)} bytes to {size}")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# --- accepted input -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(valid_envelopes()))
def test_valid_envelope_decodes_to_the_same_message(name: str, limits: Limits) -> None:
    message = valid_envelopes()[name]
    assert decode_request(message.SerializeToString(), limits) == message


def test_unknown_fields_from_newer_callers_are_accepted(limits: Limits) -> None:
    data = envelope().SerializeToString() + b"\xf8\x07\x01"  # field 127, varint 1
    assert decode_request(data, limits).caller == "billing"


def test_invalid_argument_carries_the_invalid_argument_status(limits: Limits) -> None:
    error = reject(b"\xff", limits, "not a valid")
    assert error.code is StatusCode.INVALID_ARGUMENT


# --- the body itself ------------------------------------------------------------


@pytest.mark.parametrize(
    "body", [None, "text", bytearray(b"\x0a\x01a"), memoryview(b"\x0a\x01a"), 42]
)
def test_body_that_is_not_bytes_is_rejected(body: object, limits: Limits) -> None:
    reject(body, limits, "must be a protobuf RequestEnvelope")


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\xff", id="truncated-varint-tag"),
        pytest.param(b"\x00", id="field-number-zero"),
        pytest.param(b"\x0f", id="invalid-wire-type"),
        pytest.param(b"\x0c", id="stray-end-group"),
        pytest.param(b"\x0a\x05ab", id="length-past-the-end"),
        pytest.param(b"\x0a\xff\xff\xff\xff\x0f", id="huge-length-prefix"),
        pytest.param(b"\x18" + b"\xff" * 11, id="overlong-varint"),
        pytest.param(b"\x0a\x02\xc3\x28", id="caller-not-utf8"),
        pytest.param(b"\x0b" * 200, id="deeply-nested-groups"),
        pytest.param(b"\x52\x03\x0a\x05a", id="truncated-submessage"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", id="http-request"),
    ],
)
def test_garbage_bytes_are_rejected_as_not_an_envelope(data: bytes, limits: Limits) -> None:
    reject(data, limits, "not a valid access.v2.RequestEnvelope")


def test_request_at_max_request_bytes_is_accepted(limits: Limits) -> None:
    data = pad_to(envelope().SerializeToString(), limits.max_request_bytes)
    assert len(data) == limits.max_request_bytes
    decode_request(data, limits)


def test_request_over_max_request_bytes_is_rejected_before_parsing(limits: Limits) -> None:
    data = pad_to(envelope().SerializeToString(), limits.max_request_bytes + 1)
    reject(data, limits, f"is {len(data)} bytes; the limit is {limits.max_request_bytes}")
    # Size comes first: an oversized body is not even parsed.
    reject(b"\xff" * (limits.max_request_bytes + 1), limits, "the limit is")


def test_empty_body_is_rejected(limits: Limits) -> None:
    reject(b"", limits, "caller is missing")


# --- envelope fields ------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("caller", "caller is missing"),
        ("request_id", "request_id is missing"),
        ("deadline_unix_ms", "deadline_unix_ms is missing"),
        ("issued_at_unix_ms", "issued_at_unix_ms is missing"),
    ],
)
def test_missing_envelope_field_is_rejected(field: str, message: str, limits: Limits) -> None:
    message_without = envelope()
    message_without.ClearField(field)  # type: ignore[arg-type]
    reject(message_without.SerializeToString(), limits, message)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"caller": "Billing"}, "caller is malformed"),
        ({"caller": "-billing"}, "caller is malformed"),
        ({"caller": "b" * 65}, "caller is malformed"),
        ({"caller": "billing\n"}, "caller is malformed"),
        ({"request_id": "req 1"}, "request_id is malformed"),
        ({"request_id": "r" * 65}, "request_id is malformed"),
        ({"deadline_unix_ms": -1}, "deadline_unix_ms is missing"),
        ({"issued_at_unix_ms": -1}, "issued_at_unix_ms is missing"),
        ({"issued_at_unix_ms": -(2**63)}, "issued_at_unix_ms is missing"),
    ],
)
def test_malformed_envelope_field_is_rejected(
    fields: dict[str, object], message: str, limits: Limits
) -> None:
    reject(envelope(**fields).SerializeToString(), limits, message)


def test_envelope_field_at_maximum_length_is_accepted(limits: Limits) -> None:
    message = envelope(caller="b" * 64, request_id="r" * 64)
    assert decode_request(message.SerializeToString(), limits) == message


@pytest.mark.parametrize("operation", ["read", "write", "delete", "list"])
def test_missing_issued_at_is_rejected_for_every_operation(operation: str, limits: Limits) -> None:
    message = _with(operation)
    message.ClearField("issued_at_unix_ms")
    reject(message.SerializeToString(), limits, "issued_at_unix_ms is missing")


def test_issued_at_is_checked_before_the_operation(limits: Limits) -> None:
    # An unsigned-era envelope must be told about issued_at first, whatever else is wrong.
    message = envelope()
    message.ClearField("issued_at_unix_ms")
    message.ClearField("read")
    reject(message.SerializeToString(), limits, "issued_at_unix_ms is missing")


def test_envelope_without_operation_is_rejected(limits: Limits) -> None:
    message = envelope()
    message.ClearField("read")
    reject(message.SerializeToString(), limits, "unknown or missing operation")


def test_envelope_with_only_an_unknown_operation_is_rejected(limits: Limits) -> None:
    message = envelope()
    message.ClearField("read")
    data = message.SerializeToString() + b"\x82\x01\x00"  # field 16, empty: a future operation
    reject(data, limits, "unknown or missing operation")


# --- read -----------------------------------------------------------------------


def test_read_with_unspecified_mode_is_rejected(limits: Limits) -> None:
    message = envelope(read=pb.ReadRecordRequest(scope="t", object_id="o"))
    reject(message.SerializeToString(), limits, "mode must be")


@pytest.mark.parametrize("mode", [3, 99, -1])
def test_read_with_unknown_mode_value_is_rejected(mode: int, limits: Limits) -> None:
    message = envelope(read=pb.ReadRecordRequest(scope="t", object_id="o", mode=mode))  # type: ignore[arg-type]
    reject(message.SerializeToString(), limits, "mode must be")


@pytest.mark.parametrize("mode", [pb.READ_MODE_ALLOW_CACHED, pb.READ_MODE_PRIMARY])
def test_read_with_a_known_mode_is_accepted(mode: pb.ReadMode.ValueType, limits: Limits) -> None:
    message = envelope(read=pb.ReadRecordRequest(scope="t", object_id="o", mode=mode))
    assert decode_request(message.SerializeToString(), limits).read.mode == mode


# --- scope and object id, per operation -------------------------------------------


def _with(operation: str, scope: str = "tenant-a", object_id: str = "o") -> pb.RequestEnvelope:
    if operation == "read":
        return envelope(
            read=pb.ReadRecordRequest(scope=scope, object_id=object_id, mode=pb.READ_MODE_PRIMARY)
        )
    if operation == "write":
        return envelope(
            idempotency_key="k-1", write=pb.WriteRecordRequest(scope=scope, object_id=object_id)
        )
    if operation == "delete":
        return envelope(
            idempotency_key="k-1", delete=pb.DeleteRecordRequest(scope=scope, object_id=object_id)
        )
    return envelope(list=pb.ListRecordsRequest(scope=scope))


@pytest.mark.parametrize("operation", ["read", "write", "delete"])
def test_missing_object_id_is_rejected(operation: str, limits: Limits) -> None:
    reject(_with(operation, object_id="").SerializeToString(), limits, "object_id is missing")


@pytest.mark.parametrize("operation", ["read", "write", "delete"])
@pytest.mark.parametrize("object_id", ["has space", "o" * 129, "é", "a\x00b", "semi;colon"])
def test_malformed_object_id_is_rejected(operation: str, object_id: str, limits: Limits) -> None:
    data = _with(operation, object_id=object_id).SerializeToString()
    reject(data, limits, "object_id is malformed")


@pytest.mark.parametrize("object_id", ["o" * 128, "a:b/c+d=e@f~g.h_i-j", "0"])
def test_object_id_with_allowed_characters_is_accepted(object_id: str, limits: Limits) -> None:
    decode_request(_with("write", object_id=object_id).SerializeToString(), limits)


@pytest.mark.parametrize("operation", ["read", "write", "delete", "list"])
def test_missing_scope_is_rejected(operation: str, limits: Limits) -> None:
    reject(_with(operation, scope="").SerializeToString(), limits, "scope is missing")


@pytest.mark.parametrize("operation", ["read", "write", "delete", "list"])
@pytest.mark.parametrize("scope", ["Tenant", "tenant:a", ".tenant", "t" * 65, "ten ant", "té"])
def test_malformed_scope_is_rejected(operation: str, scope: str, limits: Limits) -> None:
    reject(_with(operation, scope=scope).SerializeToString(), limits, "scope is malformed")


# --- write payload ----------------------------------------------------------------


def _write(payload: bytes) -> bytes:
    return envelope(
        idempotency_key="k-1",
        write=pb.WriteRecordRequest(scope="t", object_id="o", payload=payload),
    ).SerializeToString()


def test_payload_exactly_at_max_payload_bytes_is_accepted(limits: Limits) -> None:
    payload = b"\xab" * limits.max_payload_bytes
    assert decode_request(_write(payload), limits).write.payload == payload


def test_payload_one_byte_over_max_payload_bytes_is_rejected(limits: Limits) -> None:
    over = limits.max_payload_bytes + 1
    reject(_write(b"\xab" * over), limits, f"payload is {over} bytes")


def test_payload_limit_follows_the_configured_limits() -> None:
    small = small_limits()
    decode_request(_write(b"x" * 16), small)
    reject(_write(b"x" * 17), small, "payload is 17 bytes; the limit is 16")


# --- idempotency keys -------------------------------------------------------------


@pytest.mark.parametrize("operation", ["read", "list"])
def test_idempotency_key_on_a_non_mutation_is_rejected(operation: str, limits: Limits) -> None:
    message = _with(operation)
    message.idempotency_key = "k-1"
    reject(message.SerializeToString(), limits, "only allowed on write and delete")


@pytest.mark.parametrize("operation", ["write", "delete"])
def test_idempotency_key_on_a_mutation_is_accepted(operation: str, limits: Limits) -> None:
    message = _with(operation)
    message.idempotency_key = "~" * 128
    assert decode_request(message.SerializeToString(), limits).idempotency_key == "~" * 128


@pytest.mark.parametrize("operation", ["write", "delete"])
@pytest.mark.parametrize("key", ["has space", "k" * 129, "tab\tkey", "ключ"])
def test_malformed_idempotency_key_is_rejected(operation: str, key: str, limits: Limits) -> None:
    message = _with(operation)
    message.idempotency_key = key
    reject(message.SerializeToString(), limits, "idempotency_key is malformed")


@pytest.mark.parametrize("operation", ["write", "delete"])
def test_mutation_without_idempotency_key_is_rejected(operation: str, limits: Limits) -> None:
    message = _with(operation)
    message.ClearField("idempotency_key")
    reject(message.SerializeToString(), limits, "idempotency_key is missing")


# --- expected revision --------------------------------------------------------------


@pytest.mark.parametrize("operation", ["write", "delete"])
@pytest.mark.parametrize("revision", [0, 1, 2**32, 2**64 - 1])
def test_expected_revision_round_trips(operation: str, revision: int, limits: Limits) -> None:
    message = _with(operation)
    getattr(message, operation).expected_revision = revision
    decoded = decode_request(message.SerializeToString(), limits)
    assert getattr(decoded, operation).expected_revision == revision
    assert decoded == message


# --- list: page size and cursors --------------------------------------------------


def test_page_size_zero_means_the_configured_default(limits: Limits) -> None:
    assert page_size(pb.ListRecordsRequest(), limits) == limits.list_default_page_size
    assert page_size(pb.ListRecordsRequest(), small_limits(default_page=7)) == 7


@pytest.mark.parametrize("requested", [1, 19, 20])
def test_page_size_up_to_the_maximum_is_kept(requested: int) -> None:
    assert page_size(pb.ListRecordsRequest(page_size=requested), small_limits()) == requested


@pytest.mark.parametrize("requested", [21, 1000, 2**32 - 1])
def test_page_size_above_the_maximum_is_capped(requested: int) -> None:
    assert page_size(pb.ListRecordsRequest(page_size=requested), small_limits()) == 20


def test_shipped_page_size_is_capped_at_list_max_page_size(limits: Limits) -> None:
    request = pb.ListRecordsRequest(page_size=limits.list_max_page_size + 1)
    assert page_size(request, limits) == limits.list_max_page_size


def test_huge_page_size_passes_validation_and_is_capped(limits: Limits) -> None:
    message = envelope(list=pb.ListRecordsRequest(scope="t", page_size=2**32 - 1))
    decoded = decode_request(message.SerializeToString(), limits)
    assert page_size(decoded.list, limits) == limits.list_max_page_size


@pytest.mark.parametrize(
    "object_id", ["invoice:42", "a", "o" * 128, "a/b+c=d", "~@:._-", "zzz", "0" * 100]
)
def test_cursor_round_trips_the_object_id(object_id: str) -> None:
    cursor = encode_cursor("tenant-a", object_id)
    assert decode_cursor(cursor, "tenant-a") == object_id


@pytest.mark.parametrize("object_id", ["invoice:42", "a/b+c=d", "o" * 128, "??>>"])
def test_cursor_is_unpadded_base64url(object_id: str) -> None:
    cursor = encode_cursor("tenant-a", object_id)
    assert not set(cursor) - set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_cursor_for_a_typical_scope_and_longest_object_id_is_accepted(limits: Limits) -> None:
    cursor = encode_cursor("tenant-a", "o" * 128)
    assert len(cursor) <= MAX_CURSOR_CHARS
    message = envelope(list=pb.ListRecordsRequest(scope="tenant-a", cursor=cursor))
    decode_request(message.SerializeToString(), limits)


def test_cursor_for_the_longest_scope_and_object_id_is_accepted(limits: Limits) -> None:
    """The service issues this cursor for such a page, so it must take it back."""
    scope, object_id = "s" * 64, "o" * 128
    cursor = encode_cursor(scope, object_id)
    assert len(cursor) <= MAX_CURSOR_CHARS
    message = envelope(list=pb.ListRecordsRequest(scope=scope, cursor=cursor))
    decode_request(message.SerializeToString(), limits)
    assert decode_cursor(cursor, scope) == object_id


def test_list_request_with_a_cursor_for_its_scope_is_accepted(limits: Limits) -> None:
    cursor = encode_cursor("tenant-a", "invoice:41")
    message = envelope(list=pb.ListRecordsRequest(scope="tenant-a", cursor=cursor))
    decoded = decode_request(message.SerializeToString(), limits)
    assert decode_cursor(decoded.list.cursor, decoded.list.scope) == "invoice:41"


def test_cursor_from_another_scope_is_rejected(limits: Limits) -> None:
    cursor = encode_cursor("tenant-b", "invoice:41")
    message = envelope(list=pb.ListRecordsRequest(scope="tenant-a", cursor=cursor))
    reject(message.SerializeToString(), limits, "cursor belongs to another scope")
    with pytest.raises(InvalidArgument, match="another scope"):
        decode_cursor(cursor, "tenant-a")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@pytest.mark.parametrize(
    ("cursor", "message"),
    [
        pytest.param("a", "cursor is malformed", id="impossible-base64-length"),
        pytest.param("é", "cursor is malformed", id="not-ascii"),
        pytest.param(_b64(b"\xff\xff"), "cursor is malformed", id="not-a-protobuf"),
        pytest.param(_b64(b"\x0a\x02\xc3\x28"), "cursor is malformed", id="scope-not-utf8"),
        pytest.param("A" * (MAX_CURSOR_CHARS + 1), "cursor is too long", id="too-long"),
        pytest.param(
            _b64(pb.ListCursor(scope="tenant-a").SerializeToString()),
            "cursor is malformed",
            id="no-object-id",
        ),
        pytest.param(
            _b64(pb.ListCursor(scope="tenant-a", after_object_id="a b").SerializeToString()),
            "cursor is malformed",
            id="malformed-object-id",
        ),
    ],
)
def test_malformed_cursor_is_rejected(cursor: str, message: str, limits: Limits) -> None:
    request = envelope(list=pb.ListRecordsRequest(scope="tenant-a", cursor=cursor))
    reject(request.SerializeToString(), limits, message)
    with pytest.raises(InvalidArgument, match=message):
        decode_cursor(cursor, "tenant-a")
