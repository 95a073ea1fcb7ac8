"""Property tests: nothing but InvalidArgument escapes ``decode_request``.

``decode_request`` is the first code that sees a caller's bytes, so for any
input it must either return a ``pb.RequestEnvelope`` or raise
``InvalidArgument``. The tests below feed it 2,400 inputs in total,
deterministically (``derandomize=True``), and each asserts that its full
example count really ran:

- 300 random byte strings;
- 1,000 envelopes covering every operation, serialized and then mutated at the
  byte level (bit flips, truncation, insertion, deletion, duplication,
  splicing with another envelope, varint boundary values, overlong varints,
  huge length prefixes, unknown field numbers and wire types, and merged
  sub-messages that override fields, e.g. ``read.mode = 99``);
- 650 valid envelopes with exactly one field corrupted (50 per field, thirteen
  fields including unknown read modes such as 99), which must be accepted
  unchanged or rejected by that field's own check;
- 150 envelopes with every field arbitrary, plus unknown trailing fields;
- 300 valid envelopes, which must be accepted and decoded unchanged.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataservice.codec import decode_request, encode_cursor
from dataservice.codec.requests import MAX_CURSOR_CHARS
from dataservice.config.settings import Settings
from dataservice.errors import InvalidArgument
from dataservice.identifiers import (
    CALLER_RE,
    IDEMPOTENCY_KEY_RE,
    OBJECT_ID_RE,
    REQUEST_ID_RE,
    SCOPE_RE,
)
from dataservice.proto import pb

LIMITS = Settings.from_env({}).load().limits

RANDOM_EXAMPLES = 300
MUTATED_EXAMPLES = 1_000
CORRUPTED_EXAMPLES_PER_FIELD = 50
ARBITRARY_EXAMPLES = 150
VALID_EXAMPLES = 300

FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=False)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
UINT32_MAX, UINT64_MAX = 2**32 - 1, 2**64 - 1
VARINT_BOUNDARIES = [
    0,
    1,
    2**7 - 1,
    2**7,
    2**14 - 1,
    2**14,
    2**31 - 1,
    2**31,
    UINT32_MAX,
    2**32,
    INT64_MAX,
    2**63,
    UINT64_MAX,
]
# Used, reserved (3 in ReadRecordRequest), future and out-of-range numbers;
# 0 and 2**29 are not legal field numbers at all. 100-102 are SignedRequest's,
# which a bare envelope decoder must never take for envelope fields.
FIELD_NUMBERS = [*range(7), *range(9, 17), 100, 101, 102, 127, 19_000, 2**29 - 1, 2**29]
# Legal field numbers that no RequestEnvelope field uses.
UNUSED_FIELD_NUMBERS = [6, 9, 14, 15, 16, 100, 101, 102, 127, 19_000, 2**29 - 1]
OPERATION_FIELDS = {"read": 10, "write": 11, "delete": 12, "list": 13}


# --- wire encoding ----------------------------------------------------------------


def varint(value: int) -> bytes:
    value &= UINT64_MAX  # negative int64 values are sent as ten-byte varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def tag(field_number: int, wire_type: int) -> bytes:
    return varint((field_number << 3) | wire_type)


def length_delimited(field_number: int, body: bytes) -> bytes:
    return tag(field_number, 2) + varint(len(body)) + body


def unknown_field(field_number: int, wire_type: int, value: int, body: bytes) -> bytes:
    if wire_type == 0:
        return tag(field_number, 0) + varint(value)
    if wire_type == 1:
        return tag(field_number, 1) + (value & UINT64_MAX).to_bytes(8, "little")
    if wire_type == 2:
        return length_delimited(field_number, body)
    if wire_type == 3:  # an empty group: start and end
        return tag(field_number, 3) + tag(field_number, 4)
    if wire_type == 5:
        return tag(field_number, 5) + (value & UINT32_MAX).to_bytes(4, "little")
    return tag(field_number, wire_type)  # 4 (stray end group), 6, 7: invalid


def unknown_fields(field_numbers: list[int] = FIELD_NUMBERS) -> st.SearchStrategy[bytes]:
    return st.builds(
        unknown_field,
        st.sampled_from(field_numbers),
        st.sampled_from([0, 1, 2, 3, 5]),
        st.sampled_from(VARINT_BOUNDARIES),
        st.binary(max_size=16),
    )


# --- field values -----------------------------------------------------------------

# Proto strings must be valid UTF-8, so no surrogates.
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=80)


def text_for(pattern: Any, edge_cases: list[str]) -> st.SearchStrategy[str]:
    """Hand-picked edge cases, arbitrary text and valid values for ``pattern``."""
    return st.one_of(
        st.sampled_from(edge_cases),
        any_text,
        st.from_regex(pattern, fullmatch=True),
    )


valid_scope = st.from_regex(SCOPE_RE, fullmatch=True)
valid_object_id = st.from_regex(OBJECT_ID_RE, fullmatch=True)

caller_text = text_for(CALLER_RE, ["", "A", "-a", "a\n", "é", "a" * 65, "a" * 64])
request_id_text = text_for(REQUEST_ID_RE, ["", "a b", "a\x00", "r" * 65, "r" * 64])
scope_text = text_for(SCOPE_RE, ["", "A", "a:b", ".a", "s" * 65, "s" * 64])
object_id_text = text_for(OBJECT_ID_RE, ["", "a b", "é", "o" * 129, "o" * 128, ":"])
idempotency_text = text_for(IDEMPOTENCY_KEY_RE, ["a b", "\x7f", "k" * 129, "k" * 128])
int64s = st.one_of(
    st.sampled_from([0, -1, INT64_MIN, 1, INT64_MAX]), st.integers(INT64_MIN, INT64_MAX)
)
uint64s = st.one_of(
    st.sampled_from([0, 1, INT64_MAX, 2**63, UINT64_MAX]), st.integers(0, UINT64_MAX)
)
read_modes = st.one_of(st.sampled_from([0, 99, 3, -1, 1, 2]), st.integers(-(2**31), 2**31 - 1))
uint32s = st.one_of(st.sampled_from([0, 1, 100, 101, UINT32_MAX]), st.integers(0, UINT32_MAX))


def payloads() -> st.SearchStrategy[bytes]:
    """Small random payloads, and payloads right at the configured limit."""
    near_limit = [LIMITS.max_payload_bytes + d for d in (-1, 0, 1)]
    return st.one_of(
        st.binary(max_size=64),
        st.sampled_from(near_limit).map(lambda size: b"\xa5" * size),
    )


oversized_payloads = st.sampled_from([1, 2, 1000]).map(
    lambda extra: b"\xa5" * (LIMITS.max_payload_bytes + extra)
)


def cursors(scope: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["a", "====", "A" * (MAX_CURSOR_CHARS + 1), "!!!!", "\x00", ""]),
        st.builds(encode_cursor, scope, valid_object_id),
        st.binary(max_size=48).map(lambda raw: base64.urlsafe_b64encode(raw).decode().rstrip("=")),
        any_text,
    )


# --- envelopes --------------------------------------------------------------------


def _operation(
    name: str,
    scope: st.SearchStrategy[str],
    object_id: st.SearchStrategy[str],
    mode: st.SearchStrategy[int],
    cursor: st.SearchStrategy[str],
    payload: st.SearchStrategy[bytes],
) -> st.SearchStrategy[dict[str, Any]]:
    if name == "read":
        built: st.SearchStrategy[Any] = st.builds(
            pb.ReadRecordRequest, scope=scope, object_id=object_id, mode=mode
        )
    elif name == "write":
        built = st.builds(
            pb.WriteRecordRequest,
            scope=scope,
            object_id=object_id,
            payload=payload,
            expected_revision=uint64s,
        )
    elif name == "delete":
        built = st.builds(
            pb.DeleteRecordRequest, scope=scope, object_id=object_id, expected_revision=uint64s
        )
    else:
        built = st.builds(pb.ListRecordsRequest, scope=scope, page_size=uint32s, cursor=cursor)
    return built.map(lambda message: {name: message})


def arbitrary_envelopes() -> st.SearchStrategy[pb.RequestEnvelope]:
    """Every operation (or none) with field values that may or may not be valid."""
    operation = st.one_of(
        st.just({}),
        *(
            _operation(
                name, scope_text, object_id_text, read_modes, cursors(scope_text), payloads()
            )
            for name in OPERATION_FIELDS
        ),
    )
    return st.builds(
        lambda caller, request_id, deadline, issued_at, key, op: pb.RequestEnvelope(
            caller=caller,
            request_id=request_id,
            deadline_unix_ms=deadline,
            issued_at_unix_ms=issued_at,
            idempotency_key=key,
            **op,
        ),
        caller_text,
        request_id_text,
        int64s,
        int64s,
        st.one_of(st.just(""), idempotency_text),
        operation,
    )


@st.composite
def valid_envelopes(
    draw: st.DrawFn, operations: tuple[str, ...] = tuple(OPERATION_FIELDS)
) -> pb.RequestEnvelope:
    """Envelopes the codec must accept, for each of ``operations``."""
    name = draw(st.sampled_from(operations))
    scope = draw(valid_scope)
    operation = draw(
        _operation(
            name,
            st.just(scope),
            valid_object_id,
            st.sampled_from([pb.READ_MODE_ALLOW_CACHED, pb.READ_MODE_PRIMARY]),
            st.one_of(st.just(""), st.builds(encode_cursor, st.just(scope), valid_object_id)),
            payloads().map(lambda payload: payload[: LIMITS.max_payload_bytes]),
        )
    )
    mutation = name in {"write", "delete"}
    key = draw(st.from_regex(IDEMPOTENCY_KEY_RE, fullmatch=True)) if mutation else ""
    return pb.RequestEnvelope(
        caller=draw(st.from_regex(CALLER_RE, fullmatch=True)),
        request_id=draw(st.from_regex(REQUEST_ID_RE, fullmatch=True)),
        deadline_unix_ms=draw(st.integers(1, INT64_MAX)),
        issued_at_unix_ms=draw(st.integers(1, INT64_MAX)),
        idempotency_key=key,
        **operation,
    )


# One field of a valid envelope replaced by an arbitrary value: the operations
# that have the field, the values to put in it, and the first word of the
# InvalidArgument message of the check that may reject it.
CORRUPTIONS: dict[str, tuple[tuple[str, ...], st.SearchStrategy[Any], set[str]]] = {
    "caller": (tuple(OPERATION_FIELDS), caller_text, {"caller"}),
    "request_id": (tuple(OPERATION_FIELDS), request_id_text, {"request_id"}),
    "deadline_unix_ms": (tuple(OPERATION_FIELDS), int64s, {"deadline_unix_ms"}),
    "issued_at_unix_ms": (tuple(OPERATION_FIELDS), int64s, {"issued_at_unix_ms"}),
    "idempotency_key": (tuple(OPERATION_FIELDS), idempotency_text, {"idempotency_key"}),
    # None drops the operation; a name switches to an empty operation of that kind
    # (and a mutation's idempotency key then rides on a read or list, or a
    # mutation arrives without the key it requires).
    "operation": (
        tuple(OPERATION_FIELDS),
        st.sampled_from([None, *OPERATION_FIELDS]),
        {"unknown", "scope", "idempotency_key"},
    ),
    "scope": (tuple(OPERATION_FIELDS), scope_text, {"scope", "cursor"}),
    "object_id": (("read", "write", "delete"), object_id_text, {"object_id"}),
    "mode": (("read",), read_modes, {"mode"}),
    "payload": (("write",), st.one_of(oversized_payloads, payloads()), {"payload"}),
    "page_size": (("list",), uint32s, set()),
    "expected_revision": (("write", "delete"), uint64s, set()),
    "cursor": (("list",), cursors(st.one_of(valid_scope, scope_text)), {"cursor"}),
}


def corrupt(message: pb.RequestEnvelope, field: str, value: Any) -> None:
    if field == "operation":
        if value is None:
            message.ClearField("operation")
        else:
            getattr(message, value).SetInParent()
    elif field in pb.RequestEnvelope.DESCRIPTOR.fields_by_name:
        setattr(message, field, value)
    else:
        operation = message.WhichOneof("operation")
        assert operation is not None
        setattr(getattr(message, operation), field, value)


@st.composite
def corrupted_envelopes(draw: st.DrawFn) -> pb.RequestEnvelope:
    """A valid envelope with one field (any of CORRUPTIONS) replaced."""
    field = draw(st.sampled_from(sorted(CORRUPTIONS)))
    operations, values, _ = CORRUPTIONS[field]
    message = draw(valid_envelopes(operations))
    corrupt(message, field, draw(values))
    return message


# --- byte-level mutations ---------------------------------------------------------

Mutation = tuple[Any, ...]
positions = st.integers(0, 2**17)

mutations: st.SearchStrategy[Mutation] = st.one_of(
    st.tuples(st.just("flip"), positions, st.integers(1, 255)),
    st.tuples(st.just("truncate"), positions),
    st.tuples(st.just("insert"), positions, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), positions, st.integers(1, 8)),
    st.tuples(st.just("duplicate"), positions, st.integers(1, 64), positions),
    st.tuples(
        st.just("splice"),
        positions,
        arbitrary_envelopes().map(lambda m: m.SerializeToString()),
        positions,
    ),
    st.tuples(
        st.just("varint"),
        positions,
        st.sampled_from(FIELD_NUMBERS),
        st.sampled_from(VARINT_BOUNDARIES),
    ),
    st.tuples(st.just("overlong_varint"), positions, st.sampled_from(FIELD_NUMBERS)),
    st.tuples(
        st.just("huge_length"),
        positions,
        st.sampled_from(FIELD_NUMBERS),
        st.sampled_from(
            [2**31 - 1, 2**31, UINT32_MAX, 2**32, UINT64_MAX, LIMITS.max_request_bytes]
        ),
    ),
    st.tuples(st.just("unknown_field"), positions, unknown_fields()),
    # A trailing sub-message merges into the operation already present: this
    # overrides one of its fields (e.g. read.mode = 99) or switches the oneof.
    st.tuples(
        st.just("merge"),
        st.sampled_from(sorted(OPERATION_FIELDS.values())),
        st.sampled_from([4, 1, 2, 3, 5]),
        st.sampled_from([99, -1, *VARINT_BOUNDARIES]),
    ),
)


def mutate(data: bytes, mutation: Mutation) -> bytes:
    kind, *args = mutation
    size = len(data)
    if kind == "merge":
        operation_field, inner_field, value = args
        return data + length_delimited(operation_field, tag(inner_field, 0) + varint(value))
    if kind == "flip":
        if not data:
            return data
        at = args[0] % size
        return data[:at] + bytes([data[at] ^ args[1]]) + data[at + 1 :]
    at = args[0] % (size + 1)
    if kind == "truncate":
        return data[:at]
    if kind in {"insert", "unknown_field"}:
        inserted: bytes = args[1]
        return data[:at] + inserted + data[at:]
    if kind == "delete":
        return data[:at] + data[at + args[1] :]
    if kind == "duplicate":
        chunk = data[at : at + args[1]]
        dest = args[2] % (size + 1)
        return data[:dest] + chunk + data[dest:]
    if kind == "splice":
        other: bytes = args[1]
        return data[:at] + other[args[2] % (len(other) + 1) :]
    if kind == "varint":
        return data[:at] + tag(args[1], 0) + varint(args[2]) + data[at:]
    if kind == "overlong_varint":
        return data[:at] + tag(args[1], 0) + b"\xff" * 10 + b"\x01" + data[at:]
    if kind == "huge_length":
        return data[:at] + tag(args[1], 2) + varint(args[2]) + b"\x00" * 4 + data[at:]
    raise AssertionError(f"unknown mutation {kind}")


def _mutated(message: pb.RequestEnvelope, steps: list[Mutation]) -> bytes:
    data = message.SerializeToString()
    for step in steps:
        data = mutate(data, step)
    return data


mutated_envelopes = st.builds(
    _mutated,
    st.one_of(valid_envelopes(), corrupted_envelopes(), arbitrary_envelopes()),
    st.lists(mutations, min_size=1, max_size=4),
)


# --- the property -----------------------------------------------------------------


def decode_or_rejection(data: bytes) -> pb.RequestEnvelope | InvalidArgument:
    """The decoded envelope, or the InvalidArgument the codec raised.

    Any other exception propagates and fails the test with the input that
    caused it.
    """
    try:
        result = decode_request(data, LIMITS)
    except InvalidArgument as rejection:
        return rejection
    assert isinstance(result, pb.RequestEnvelope)
    return result


def outcome(result: pb.RequestEnvelope | InvalidArgument) -> str:
    """ "accepted", or the first word of the rejection: the check that failed."""
    if isinstance(result, InvalidArgument):
        return result.message.split()[0]
    return "accepted"


def run(examples: int, strategy: st.SearchStrategy[Any], check: Callable[[Any], object]) -> int:
    """Run ``check`` on ``examples`` inputs from ``strategy``; return how many ran."""
    ran = 0

    @settings(FUZZ, max_examples=examples)
    @given(strategy)
    def property_holds(value: Any) -> None:
        nonlocal ran
        ran += 1
        check(value)

    property_holds()
    return ran


def test_random_bytes_are_decoded_or_rejected() -> None:
    """300 random byte strings up to 512 bytes."""
    ran = run(RANDOM_EXAMPLES, st.binary(max_size=512), decode_or_rejection)
    assert ran >= RANDOM_EXAMPLES


@pytest.mark.slow
def test_mutated_envelopes_are_decoded_or_rejected() -> None:
    """1,000 serialized envelopes (every operation) after 1-4 byte-level mutations."""
    outcomes: Counter[str] = Counter()

    def check(data: bytes) -> None:
        outcomes[outcome(decode_or_rejection(data))] += 1

    ran = run(MUTATED_EXAMPLES, mutated_envelopes, check)
    assert ran >= MUTATED_EXAMPLES
    # Mutations reach past the parser: some inputs fail a field check, some pass.
    parse_failures = outcomes["request"]
    assert 0 < parse_failures < ran - outcomes["accepted"], outcomes
    assert outcomes["accepted"] > 0, outcomes


@pytest.mark.parametrize("field", sorted(CORRUPTIONS))
def test_envelope_with_one_corrupted_field_is_accepted_unchanged_or_rejected_for_it(
    field: str,
) -> None:
    """50 valid envelopes per field (650 in all) with that one field replaced.

    Any rejection must come from that field's own check, and for every field
    but page_size and expected_revision (where any value is allowed) at least
    one value is rejected.
    """
    operations, values, checks = CORRUPTIONS[field]
    outcomes: Counter[str] = Counter()

    @st.composite
    def corrupted(draw: st.DrawFn) -> pb.RequestEnvelope:
        message = draw(valid_envelopes(operations))
        corrupt(message, field, draw(values))
        return message

    def check(message: pb.RequestEnvelope) -> None:
        result = decode_or_rejection(message.SerializeToString())
        outcomes[outcome(result)] += 1
        if isinstance(result, pb.RequestEnvelope):
            assert result == message
        else:
            assert outcome(result) in checks, result.message

    ran = run(CORRUPTED_EXAMPLES_PER_FIELD, corrupted(), check)
    assert ran >= CORRUPTED_EXAMPLES_PER_FIELD
    if checks:
        assert outcomes.keys() & checks, f"{field}: its check never fired: {outcomes}"


def test_arbitrary_envelopes_are_decoded_unchanged_or_rejected() -> None:
    """150 envelopes with every field arbitrary, some followed by unknown fields."""

    def check(case: tuple[pb.RequestEnvelope, bytes]) -> None:
        message, trailer = case
        result = decode_or_rejection(message.SerializeToString() + trailer)
        if isinstance(result, pb.RequestEnvelope):
            # Unknown fields may ride along, but every known field must survive.
            result.DiscardUnknownFields()
            assert result == message

    trailer = st.one_of(st.just(b""), unknown_fields(UNUSED_FIELD_NUMBERS))
    ran = run(ARBITRARY_EXAMPLES, st.tuples(arbitrary_envelopes(), trailer), check)
    assert ran >= ARBITRARY_EXAMPLES


def test_valid_envelopes_are_accepted_unchanged() -> None:
    """300 valid envelopes, every operation: accepted and decoded to the same message."""
    operations: Counter[str | None] = Counter()

    def check(message: pb.RequestEnvelope) -> None:
        operations[message.WhichOneof("operation")] += 1
        assert decode_request(message.SerializeToString(), LIMITS) == message

    ran = run(VALID_EXAMPLES, valid_envelopes(), check)
    assert ran >= VALID_EXAMPLES
    assert set(operations) == set(OPERATION_FIELDS)


def test_example_counts_add_up_to_at_least_two_thousand() -> None:
    total = (
        RANDOM_EXAMPLES
        + MUTATED_EXAMPLES
        + CORRUPTED_EXAMPLES_PER_FIELD * len(CORRUPTIONS)
        + ARBITRARY_EXAMPLES
        + VALID_EXAMPLES
    )
    assert total == 2_400
