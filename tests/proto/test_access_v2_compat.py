"""Wire compatibility of access.v2 across schema revisions.

Two sides meet on the wire during every rolling deploy, so both directions are
checked against a hand-kept older revision of the schema
(``schemas/access_v2_r0.proto``), compiled at test time into a private
descriptor pool so it never clashes with the generated module in the default
pool:

(a) golden bytes written by today's messages (``fixtures/v2/*.bin``, made by
    ``make_fixtures.py``) still decode to the same values;
(b) an older reader decodes today's bytes: known fields are equal, newer fields
    are kept as unknown fields and survive a re-serialize into today's reader;
(c) today's reader decodes an older writer's bytes, and the codec refuses
    them: an older caller never sets ``issued_at_unix_ms``, which every request
    now needs (callers must upgrade to sign requests anyway);
(d) an older reader sees no operation in a ``list`` envelope;
(e) nor in a ``batch`` or ``read_many`` one, nor a result in a ``read_many``
    answer, and what it passes on is today's message still.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet
from grpc_tools import protoc  # type: ignore[import-untyped]

from dataservice.codec import decode_cursor, decode_request, encode_cursor, validate_request
from dataservice.config.model import Limits
from dataservice.config.settings import Settings
from dataservice.errors import InvalidArgument
from dataservice.proto import pb

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE / "schemas"
R0_PROTO = "access_v2_r0.proto"
FIXTURE_DIR = HERE / "fixtures" / "v2"
MAKE_FIXTURES = HERE / "make_fixtures.py"

WIRETYPE_VARINT = 0
# Operations a batch or read_many envelope may carry in these checks.
MAX_OPS = 10

# The values each golden fixture must decode to, written out independently of
# make_fixtures.py: if the script or the schema changes what the bytes mean,
# these disagree.
_DEADLINE = 1_735_689_600_000
_ISSUED_AT = 1_735_689_570_000
_UPDATED_AT = 1_735_689_000_123
_PAYLOAD = b"\x00\x01payload\xff\xfe\x80"
EXPECTED: dict[str, Message] = {
    "request_read": pb.RequestEnvelope(
        caller="billing",
        request_id="req-read-1",
        deadline_unix_ms=_DEADLINE,
        issued_at_unix_ms=_ISSUED_AT,
        read=pb.ReadRecordRequest(
            scope="tenant-a", object_id="invoice:42", mode=pb.READ_MODE_PRIMARY
        ),
    ),
    "request_read_reply_channel": pb.RequestEnvelope(
        caller="billing",
        request_id="req-read-2",
        reply_channel="chan-7f3a",
        deadline_unix_ms=_DEADLINE,
        issued_at_unix_ms=_ISSUED_AT,
        read=pb.ReadRecordRequest(
            scope="tenant-a", object_id="invoice:42", mode=pb.READ_MODE_PRIMARY
        ),
    ),
    "request_write": pb.RequestEnvelope(
        caller="billing",
        request_id="req-write-1",
        deadline_unix_ms=_DEADLINE,
        issued_at_unix_ms=_ISSUED_AT,
        idempotency_key="idem-write-1",
        write=pb.WriteRecordRequest(
            scope="tenant-a", object_id="invoice:42", payload=_PAYLOAD, expected_revision=3
        ),
    ),
    "request_delete": pb.RequestEnvelope(
        caller="billing",
        request_id="req-delete-1",
        deadline_unix_ms=_DEADLINE,
        issued_at_unix_ms=_ISSUED_AT,
        idempotency_key="idem-delete-1",
        delete=pb.DeleteRecordRequest(
            scope="tenant-a", object_id="invoice:42", expected_revision=4
        ),
    ),
    "request_list": pb.RequestEnvelope(
        caller="billing",
        request_id="req-list-1",
        deadline_unix_ms=_DEADLINE,
        issued_at_unix_ms=_ISSUED_AT,
        list=pb.ListRecordsRequest(
            scope="tenant-a", page_size=25, cursor="Cgh0ZW5hbnQtYRIKaW52b2ljZTo0MQ"
        ),
    ),
    "request_batch": pb.RequestEnvelope(
        caller="billing",
        request_id="req-batch-1",
        deadline_unix_ms=_DEADLINE,
        issued_at_unix_ms=_ISSUED_AT,
        batch=pb.BatchRequest(
            operations=[
                pb.BatchOperation(
                    request_id="req-batch-1-w",
                    deadline_unix_ms=_DEADLINE,
                    idempotency_key="idem-batch-1-w",
                    write=pb.WriteRecordRequest(
                        scope="tenant-a", object_id="invoice:44", payload=_PAYLOAD
                    ),
                ),
                pb.BatchOperation(
                    request_id="req-batch-1-d",
                    deadline_unix_ms=_DEADLINE - 1000,
                    idempotency_key="idem-batch-1-d",
                    delete=pb.DeleteRecordRequest(
                        scope="tenant-a", object_id="invoice:40", expected_revision=2
                    ),
                ),
            ]
        ),
    ),
    "request_read_many": pb.RequestEnvelope(
        caller="billing",
        request_id="req-many-1",
        deadline_unix_ms=_DEADLINE,
        issued_at_unix_ms=_ISSUED_AT,
        read_many=pb.ReadManyRequest(
            reads=[
                pb.ReadRecordRequest(
                    scope="tenant-a", object_id="invoice:42", mode=pb.READ_MODE_ALLOW_CACHED
                ),
                pb.ReadRecordRequest(
                    scope="tenant-b", object_id="invoice:7", mode=pb.READ_MODE_ALLOW_CACHED
                ),
            ]
        ),
    ),
    "response_batch": pb.ResponseEnvelope(
        request_id="req-batch-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        batch=pb.BatchResponse(
            answers=[
                pb.ResponseEnvelope(
                    request_id="req-batch-1-w",
                    status=pb.Status(code=pb.STATUS_CODE_OK),
                    write=pb.WriteRecordResponse(object_id="invoice:44", revision=1, created=True),
                ),
                pb.ResponseEnvelope(
                    request_id="req-batch-1-d",
                    status=pb.Status(
                        code=pb.STATUS_CODE_CONFLICT, message="the record is at revision 3"
                    ),
                ),
            ]
        ),
    ),
    "response_read_many": pb.ResponseEnvelope(
        request_id="req-many-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        read_many=pb.ReadManyResponse(
            results=[
                pb.ReadManyResult(
                    status=pb.Status(code=pb.STATUS_CODE_OK),
                    record=pb.Record(
                        object_id="invoice:42",
                        revision=3,
                        payload=_PAYLOAD,
                        updated_at_unix_ms=_UPDATED_AT,
                    ),
                ),
                pb.ReadManyResult(
                    status=pb.Status(
                        code=pb.STATUS_CODE_PERMISSION_DENIED,
                        message="the caller may not use scope 'tenant-b'",
                        reason="scope_denied",
                    )
                ),
            ]
        ),
    ),
    "response_read": pb.ResponseEnvelope(
        request_id="req-read-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        read=pb.ReadRecordResponse(
            record=pb.Record(
                object_id="invoice:42",
                revision=3,
                payload=_PAYLOAD,
                updated_at_unix_ms=_UPDATED_AT,
            )
        ),
    ),
    "response_write": pb.ResponseEnvelope(
        request_id="req-write-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        write=pb.WriteRecordResponse(object_id="invoice:42", revision=4, created=False),
    ),
    "response_delete": pb.ResponseEnvelope(
        request_id="req-delete-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        delete=pb.DeleteRecordResponse(object_id="invoice:42", revision=4),
    ),
    "response_list": pb.ResponseEnvelope(
        request_id="req-list-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        list=pb.ListRecordsResponse(
            records=[
                pb.Record(
                    object_id="invoice:42",
                    revision=4,
                    payload=_PAYLOAD,
                    updated_at_unix_ms=_UPDATED_AT,
                ),
                pb.Record(object_id="invoice:43", revision=1, updated_at_unix_ms=_UPDATED_AT),
            ],
            next_cursor="Cgh0ZW5hbnQtYRIKaW52b2ljZTo0Mw",
        ),
    ),
    "response_error": pb.ResponseEnvelope(
        request_id="req-write-2",
        status=pb.Status(
            code=pb.STATUS_CODE_RESOURCE_EXHAUSTED,
            message="the batch lane is full",
            retry_after_ms=250,
        ),
    ),
    "record": pb.Record(
        object_id="invoice:42", revision=3, payload=_PAYLOAD, updated_at_unix_ms=_UPDATED_AT
    ),
    "list_cursor": pb.ListCursor(scope="tenant-a", after_object_id="invoice:41"),
}
REQUEST_FIXTURES = sorted(name for name in EXPECTED if name.startswith("request_"))
# ListCursor is newer than r0; every other fixture's message type existed then.
R0_READABLE_FIXTURES = sorted(name for name in EXPECTED if name != "list_cursor")


@dataclass(frozen=True)
class Schema:
    """An older access.v2 revision, loaded into its own descriptor pool."""

    pool: descriptor_pool.DescriptorPool
    file: FileDescriptor

    def has(self, name: str) -> bool:
        return name in self.file.message_types_by_name

    def message(self, name: str) -> Any:
        """The class of ``access.v2.<name>`` in this revision (built at run time, untyped)."""
        descriptor = self.pool.FindMessageTypeByName(f"access.v2.{name}")
        return message_factory.GetMessageClass(descriptor)


@pytest.fixture(scope="module")
def r0(tmp_path_factory: pytest.TempPathFactory) -> Schema:
    out = tmp_path_factory.mktemp("r0") / "access_v2_r0.binpb"
    status = protoc.main(
        [
            "protoc",
            f"-I{SCHEMAS}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            R0_PROTO,
        ]
    )
    assert status == 0, f"protoc could not compile {SCHEMAS / R0_PROTO}"
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file_proto in files.file:
        pool.Add(file_proto)
    return Schema(pool=pool, file=pool.FindFileByName(R0_PROTO))


@pytest.fixture(scope="module")
def limits() -> Limits:
    return Settings.from_env({}).load().limits


def fixture_bytes(name: str) -> bytes:
    return (FIXTURE_DIR / f"{name}.bin").read_bytes()


def unknown_fields(message: Message) -> dict[int, object]:
    """Unknown field number -> value (the stubs give UnknownFieldSet no __iter__)."""
    fields = UnknownFieldSet(message)
    return {fields[i].field_number: fields[i].data for i in range(len(fields))}


def known_field_mismatches(old: Message, new: Message, path: str = "") -> list[str]:
    """Fields the older message knows whose value differs from today's message.

    Fields are matched by number. Fields the older revision has but today's
    schema dropped are skipped here; the schema test checks they are reserved.
    """
    problems: list[str] = []
    current_fields = new.DESCRIPTOR.fields_by_number
    for old_field in old.DESCRIPTOR.fields:
        new_field = current_fields.get(old_field.number)
        if new_field is None:
            continue
        where = f"{path}{old_field.name}"
        old_value = getattr(old, old_field.name)
        new_value = getattr(new, new_field.name)
        if old_field.message_type is None:
            if old_field.is_repeated:
                old_value, new_value = list(old_value), list(new_value)
            if old_value != new_value:
                problems.append(f"{where}: {old_value!r} != {new_value!r}")
        elif old_field.is_repeated:
            if len(old_value) != len(new_value):
                problems.append(f"{where}: {len(old_value)} items != {len(new_value)}")
                continue
            for index, (old_item, new_item) in enumerate(zip(old_value, new_value, strict=True)):
                problems += known_field_mismatches(old_item, new_item, f"{where}[{index}].")
        elif old.HasField(old_field.name) != new.HasField(new_field.name):
            problems.append(f"{where}: presence differs")
        elif old.HasField(old_field.name):
            problems += known_field_mismatches(old_value, new_value, f"{where}.")
    return problems


# --- the older revision itself ------------------------------------------------


def _reserved(message: descriptor_pb2.DescriptorProto) -> tuple[set[int], set[str]]:
    numbers = {n for r in message.reserved_range for n in range(r.start, r.end)}
    return numbers, set(message.reserved_name)


def _current_file_proto() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(proto)
    return proto


def test_r0_schema_loads_into_its_own_pool_without_touching_the_default_pool(r0: Schema) -> None:
    old_read = r0.message("ReadRecordRequest")
    assert "consistent" in old_read.DESCRIPTOR.fields_by_name
    assert "consistent" not in pb.ReadRecordRequest.DESCRIPTOR.fields_by_name
    assert old_read.DESCRIPTOR.full_name == pb.ReadRecordRequest.DESCRIPTOR.full_name
    assert not r0.has("ListRecordsRequest")
    assert not r0.has("ListCursor")


def test_current_schema_keeps_every_r0_field_or_reserves_its_number_and_name(
    r0: Schema,
) -> None:
    current = {m.name: m for m in _current_file_proto().message_type}
    problems: list[str] = []
    for name, old_message in r0.file.message_types_by_name.items():
        if name not in current:
            problems.append(f"message {name} was removed")
            continue
        new_descriptor: Descriptor = getattr(pb, name).DESCRIPTOR
        reserved_numbers, reserved_names = _reserved(current[name])
        for old_field in old_message.fields:
            new_field = new_descriptor.fields_by_number.get(old_field.number)
            where = f"{name}.{old_field.name} = {old_field.number}"
            if new_field is None:
                if old_field.number not in reserved_numbers:
                    problems.append(f"{where}: removed but its number is not reserved")
                if old_field.name not in reserved_names:
                    problems.append(f"{where}: removed but its name is not reserved")
                continue
            if new_field.name != old_field.name:
                problems.append(f"{where}: renamed to {new_field.name}")
            if (new_field.type, new_field.is_repeated) != (old_field.type, old_field.is_repeated):
                problems.append(f"{where}: type or cardinality changed")
            old_oneof = old_field.containing_oneof and old_field.containing_oneof.name
            new_oneof = new_field.containing_oneof and new_field.containing_oneof.name
            if old_oneof != new_oneof:
                problems.append(f"{where}: moved from oneof {old_oneof} to {new_oneof}")
    for name, old_enum in r0.file.enum_types_by_name.items():
        new_values = {v.number: v.name for v in pb.DESCRIPTOR.enum_types_by_name[name].values}
        for value in old_enum.values:
            if new_values.get(value.number) != value.name:
                problems.append(f"enum {name}: {value.name} = {value.number} changed")
    assert problems == []


# --- (a) golden fixtures ----------------------------------------------------------


def test_every_committed_fixture_has_expected_values() -> None:
    committed = {path.stem for path in FIXTURE_DIR.glob("*.bin")}
    assert committed == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_fixture_decodes_to_expected_values(name: str) -> None:
    expected = EXPECTED[name]
    decoded = type(expected).FromString(fixture_bytes(name))
    assert decoded == expected
    assert unknown_fields(decoded) == {}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_todays_writer_still_produces_the_golden_bytes(name: str) -> None:
    assert EXPECTED[name].SerializeToString(deterministic=True) == fixture_bytes(name)


@pytest.mark.parametrize("name", REQUEST_FIXTURES)
def test_golden_request_fixture_passes_the_codec(name: str, limits: Limits) -> None:
    assert decode_request(fixture_bytes(name), limits, max_ops=MAX_OPS) == EXPECTED[name]


def test_golden_list_cursors_still_decode_for_their_scope() -> None:
    request = pb.RequestEnvelope.FromString(fixture_bytes("request_list"))
    assert decode_cursor(request.list.cursor, "tenant-a") == "invoice:41"
    response = pb.ResponseEnvelope.FromString(fixture_bytes("response_list"))
    assert decode_cursor(response.list.next_cursor, "tenant-a") == "invoice:43"
    # The raw cursor fixture is what the base64url string wraps.
    assert encode_cursor("tenant-a", "invoice:41") == request.list.cursor
    assert pb.ListCursor.FromString(fixture_bytes("list_cursor")) == EXPECTED["list_cursor"]


def test_make_fixtures_reproduces_the_committed_bytes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(MAKE_FIXTURES), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    regenerated = {path.name: path.read_bytes() for path in tmp_path.glob("*.bin")}
    committed = {path.name: path.read_bytes() for path in FIXTURE_DIR.glob("*.bin")}
    stale = sorted(
        n for n in regenerated.keys() | committed.keys() if regenerated.get(n) != committed.get(n)
    )
    assert not stale, (
        f"golden fixtures differ from make_fixtures.py output: {stale}. Golden bytes stand for "
        "what older builds wrote; add new fixtures under new names, and only rerun "
        "`python tests/proto/make_fixtures.py` when the change is intended."
    )


# --- (b) today's writer, older reader ---------------------------------------------


def _r0_type_name(name: str) -> str:
    return EXPECTED[name].DESCRIPTOR.name


@pytest.mark.parametrize("name", R0_READABLE_FIXTURES)
def test_older_reader_decodes_todays_bytes_with_known_fields_equal(r0: Schema, name: str) -> None:
    old = r0.message(_r0_type_name(name)).FromString(fixture_bytes(name))
    assert known_field_mismatches(old, EXPECTED[name]) == []


@pytest.mark.parametrize("name", R0_READABLE_FIXTURES)
def test_todays_fields_survive_a_reserialize_by_the_older_reader(r0: Schema, name: str) -> None:
    old = r0.message(_r0_type_name(name)).FromString(fixture_bytes(name))
    passed_through = type(EXPECTED[name]).FromString(old.SerializeToString())
    assert passed_through == EXPECTED[name]


def test_older_reader_keeps_read_mode_as_unknown_field(r0: Schema) -> None:
    old = r0.message("RequestEnvelope").FromString(fixture_bytes("request_read"))
    assert old.WhichOneof("operation") == "read"
    assert old.read.consistent is False  # mode is field 4, never the old field 3
    assert unknown_fields(old.read) == {4: pb.READ_MODE_PRIMARY}


def test_older_reader_keeps_the_reply_channel_as_unknown_field(r0: Schema) -> None:
    # A relay on r0 passes it through; a worker that does not know it answers
    # under the request id (ds:result:...), as before reply channels.
    old = r0.message("RequestEnvelope").FromString(fixture_bytes("request_read_reply_channel"))
    assert unknown_fields(old).get(6) == b"chan-7f3a"


@pytest.mark.parametrize("name", REQUEST_FIXTURES)
def test_older_reader_keeps_issued_at_as_unknown_field(r0: Schema, name: str) -> None:
    old = r0.message("RequestEnvelope").FromString(fixture_bytes(name))
    assert unknown_fields(old).get(5) == _ISSUED_AT


@pytest.mark.parametrize(
    ("name", "operation", "field_number", "revision"),
    [("request_write", "write", 4, 3), ("request_delete", "delete", 3, 4)],
)
def test_older_reader_keeps_expected_revision_as_unknown_field(
    r0: Schema, name: str, operation: str, field_number: int, revision: int
) -> None:
    old = r0.message("RequestEnvelope").FromString(fixture_bytes(name))
    assert old.WhichOneof("operation") == operation
    assert unknown_fields(getattr(old, operation)) == {field_number: revision}


@pytest.mark.parametrize("name", REQUEST_FIXTURES)
def test_request_passed_through_an_older_reader_still_validates(
    r0: Schema, name: str, limits: Limits
) -> None:
    # A relay on r0 must not strip issued_at, or today's codec would refuse the request.
    old = r0.message("RequestEnvelope").FromString(fixture_bytes(name))
    assert decode_request(old.SerializeToString(), limits, max_ops=MAX_OPS) == EXPECTED[name]


@pytest.mark.parametrize("name", ["record", "response_read"])
def test_older_reader_keeps_record_timestamp_as_unknown_field(r0: Schema, name: str) -> None:
    old = r0.message(_r0_type_name(name)).FromString(fixture_bytes(name))
    record = old if name == "record" else old.read.record
    assert record.object_id == "invoice:42"
    assert record.revision == 3
    assert record.payload == _PAYLOAD
    assert unknown_fields(record) == {4: _UPDATED_AT}


# --- (c) older writer, today's reader ---------------------------------------------


def _old_envelope(r0: Schema, idempotency_key: str = "", **operation: Message) -> Any:
    """An r0 RequestEnvelope with ``operation`` (e.g. ``read=...``) set."""
    envelope = r0.message("RequestEnvelope")(
        caller="billing",
        request_id="req-old-1",
        deadline_unix_ms=_DEADLINE,
        idempotency_key=idempotency_key,
    )
    for name, value in operation.items():
        getattr(envelope, name).CopyFrom(value)
    return envelope


def _old_request(r0: Schema, operation: str) -> Any:
    """An r0 envelope for ``operation`` as an older caller sent it."""
    if operation == "read":
        read = r0.message("ReadRecordRequest")(
            scope="tenant-a", object_id="invoice:42", consistent=True
        )
        return _old_envelope(r0, read=read)
    if operation == "write":
        write = r0.message("WriteRecordRequest")(
            scope="tenant-a", object_id="invoice:42", payload=_PAYLOAD
        )
        return _old_envelope(r0, idempotency_key="idem-old-1", write=write)
    delete = r0.message("DeleteRecordRequest")(scope="tenant-a", object_id="invoice:42")
    return _old_envelope(r0, delete=delete)


@pytest.mark.parametrize("operation", ["read", "write", "delete"])
def test_older_callers_envelope_parses_but_validation_names_issued_at(
    r0: Schema, limits: Limits, operation: str
) -> None:
    data = _old_request(r0, operation).SerializeToString()

    envelope = pb.RequestEnvelope.FromString(data)

    assert envelope.WhichOneof("operation") == operation
    assert (envelope.caller, envelope.request_id, envelope.deadline_unix_ms) == (
        "billing",
        "req-old-1",
        _DEADLINE,
    )
    assert envelope.issued_at_unix_ms == 0
    with pytest.raises(InvalidArgument, match="issued_at_unix_ms is missing"):
        decode_request(data, limits)


@pytest.mark.parametrize("consistent", [True, False])
def test_old_read_request_decodes_with_unspecified_mode(r0: Schema, consistent: bool) -> None:
    old_read = r0.message("ReadRecordRequest")(
        scope="tenant-a", object_id="invoice:42", consistent=consistent
    )
    data = _old_envelope(r0, read=old_read).SerializeToString()

    envelope = pb.RequestEnvelope.FromString(data)

    assert envelope.WhichOneof("operation") == "read"
    assert envelope.read.scope == "tenant-a"
    assert envelope.read.object_id == "invoice:42"
    assert envelope.read.mode == pb.READ_MODE_UNSPECIFIED
    # The reserved field 3 is kept as an unknown field, not reinterpreted.
    assert unknown_fields(envelope.read) == ({3: 1} if consistent else {})


@pytest.mark.parametrize("consistent", [True, False])
def test_codec_rejects_old_read_request_without_mode(
    r0: Schema, limits: Limits, consistent: bool
) -> None:
    old_read = r0.message("ReadRecordRequest")(
        scope="tenant-a", object_id="invoice:42", consistent=consistent
    )
    envelope = pb.RequestEnvelope.FromString(_old_envelope(r0, read=old_read).SerializeToString())
    # issued_at is checked first; past it, an old `consistent=True` read must still
    # be refused rather than silently served from the cache.
    envelope.issued_at_unix_ms = _ISSUED_AT
    with pytest.raises(InvalidArgument, match="mode must be"):
        validate_request(envelope, limits)


def test_old_write_envelope_decodes_unconditional_and_lacks_only_issued_at(
    r0: Schema, limits: Limits
) -> None:
    envelope = pb.RequestEnvelope.FromString(_old_request(r0, "write").SerializeToString())

    assert envelope == pb.RequestEnvelope(
        caller="billing",
        request_id="req-old-1",
        deadline_unix_ms=_DEADLINE,
        idempotency_key="idem-old-1",
        write=pb.WriteRecordRequest(scope="tenant-a", object_id="invoice:42", payload=_PAYLOAD),
    )
    assert envelope.write.expected_revision == 0
    envelope.issued_at_unix_ms = _ISSUED_AT
    validate_request(envelope, limits)


def test_old_delete_envelope_without_idempotency_key_is_refused_for_it_too(
    r0: Schema, limits: Limits
) -> None:
    envelope = pb.RequestEnvelope.FromString(_old_request(r0, "delete").SerializeToString())

    assert envelope.delete == pb.DeleteRecordRequest(scope="tenant-a", object_id="invoice:42")
    assert envelope.delete.expected_revision == 0
    # Older callers could leave the key out of a delete; today it is required.
    envelope.issued_at_unix_ms = _ISSUED_AT
    with pytest.raises(InvalidArgument, match="idempotency_key is missing"):
        validate_request(envelope, limits)


def test_old_cache_record_decodes_with_zero_timestamp(r0: Schema) -> None:
    old = r0.message("Record")(object_id="invoice:42", revision=7, payload=_PAYLOAD)

    record = pb.Record.FromString(old.SerializeToString())

    assert record == pb.Record(object_id="invoice:42", revision=7, payload=_PAYLOAD)
    assert record.updated_at_unix_ms == 0


def test_old_responses_decode_with_todays_reader(r0: Schema) -> None:
    old_response = r0.message("ResponseEnvelope")
    old_status = r0.message("Status")
    ok = old_status(code=pb.STATUS_CODE_OK)
    read = old_response(request_id="req-old-1", status=ok)
    read.read.record.CopyFrom(r0.message("Record")(object_id="invoice:42", revision=2))
    error = old_response(
        request_id="req-old-2",
        status=old_status(code=pb.STATUS_CODE_UNAVAILABLE, message="down", retry_after_ms=100),
    )

    assert pb.ResponseEnvelope.FromString(read.SerializeToString()) == pb.ResponseEnvelope(
        request_id="req-old-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        read=pb.ReadRecordResponse(record=pb.Record(object_id="invoice:42", revision=2)),
    )
    assert pb.ResponseEnvelope.FromString(error.SerializeToString()) == pb.ResponseEnvelope(
        request_id="req-old-2",
        status=pb.Status(code=pb.STATUS_CODE_UNAVAILABLE, message="down", retry_after_ms=100),
    )


# --- (d) the list operation and an older reader -----------------------------------


def test_list_envelope_has_no_operation_for_older_reader(r0: Schema) -> None:
    old = r0.message("RequestEnvelope").FromString(fixture_bytes("request_list"))

    assert old.WhichOneof("operation") is None
    assert (old.caller, old.request_id, old.deadline_unix_ms) == (
        "billing",
        "req-list-1",
        _DEADLINE,
    )
    assert set(unknown_fields(old)) == {5, 13}  # issued_at and list


def test_list_response_has_no_result_for_older_reader(r0: Schema) -> None:
    old = r0.message("ResponseEnvelope").FromString(fixture_bytes("response_list"))

    assert old.WhichOneof("result") is None
    assert old.status.code == pb.STATUS_CODE_OK
    assert set(unknown_fields(old)) == {13}


def test_list_envelope_passed_through_an_older_reader_still_validates(
    r0: Schema, limits: Limits
) -> None:
    old = r0.message("RequestEnvelope").FromString(fixture_bytes("request_list"))

    envelope = decode_request(old.SerializeToString(), limits)

    assert envelope == EXPECTED["request_list"]


# --- (e) batches, read_many and an older reader ------------------------------------


@pytest.mark.parametrize(("name", "field"), [("request_batch", 14), ("request_read_many", 15)])
def test_many_operation_envelopes_have_no_operation_for_older_reader(
    r0: Schema, name: str, field: int
) -> None:
    old = r0.message("RequestEnvelope").FromString(fixture_bytes(name))

    assert old.WhichOneof("operation") is None
    assert old.request_id == EXPECTED[name].request_id  # type: ignore[attr-defined]
    assert set(unknown_fields(old)) == {5, field}  # issued_at, and the operations


@pytest.mark.parametrize(("name", "field"), [("response_batch", 14), ("response_read_many", 15)])
def test_many_operation_answers_have_no_result_for_older_reader(
    r0: Schema, name: str, field: int
) -> None:
    old = r0.message("ResponseEnvelope").FromString(fixture_bytes(name))

    assert old.WhichOneof("result") is None
    assert old.status.code == pb.STATUS_CODE_OK
    assert set(unknown_fields(old)) == {field}


@pytest.mark.parametrize(
    "name", ["request_batch", "request_read_many", "response_batch", "response_read_many"]
)
def test_many_operations_passed_through_an_older_reader_are_todays_message(
    r0: Schema, name: str
) -> None:
    expected = EXPECTED[name]
    old = r0.message(expected.DESCRIPTOR.name).FromString(fixture_bytes(name))

    assert type(expected).FromString(old.SerializeToString()) == expected


def test_todays_reader_takes_a_single_operation_message_as_it_always_has(limits: Limits) -> None:
    """Single-operation messages stay valid beside batches: an older caller's
    write (no batch) decodes and validates unchanged."""
    envelope = decode_request(fixture_bytes("request_write"), limits, max_ops=MAX_OPS)

    assert envelope.WhichOneof("operation") == "write"
    assert envelope == EXPECTED["request_write"]
