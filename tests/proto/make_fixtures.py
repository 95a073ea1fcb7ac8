"""(Re)write the golden access.v2 fixtures from TODAY's generated messages.

Usage: python tests/proto/make_fixtures.py [--out DIR]

Writes one ``<name>.bin`` per entry of :data:`FIXTURES` into
``tests/proto/fixtures/v2`` (or DIR). Every value is a constant and the
serialization is deterministic, so two runs produce identical bytes; a test
regenerates them into a temporary directory and compares.

Only regenerate the committed files on purpose: they are what older builds of
the service wrote, so changing them weakens the compatibility tests. Add new
fixtures under new names instead of rewriting existing ones.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from google.protobuf.message import Message

from dataservice.codec import encode_cursor
from dataservice.proto import pb

FIXTURE_DIR = Path(__file__).resolve().parent / "fixtures" / "v2"

# 2025-01-01T00:00:00Z: a fixed instant, never "now".
DEADLINE_UNIX_MS = 1_735_689_600_000
# The codec requires it on every request since requests are signed.
ISSUED_AT_UNIX_MS = DEADLINE_UNIX_MS - 30_000
UPDATED_AT_UNIX_MS = 1_735_689_000_123
# Covers NUL, high bytes and bytes that are not UTF-8: the payload is opaque.
PAYLOAD = b"\x00\x01payload\xff\xfe\x80"


def _record(object_id: str, revision: int, payload: bytes) -> pb.Record:
    return pb.Record(
        object_id=object_id,
        revision=revision,
        payload=payload,
        updated_at_unix_ms=UPDATED_AT_UNIX_MS,
    )


def request_read() -> pb.RequestEnvelope:
    return pb.RequestEnvelope(
        caller="billing",
        request_id="req-read-1",
        deadline_unix_ms=DEADLINE_UNIX_MS,
        issued_at_unix_ms=ISSUED_AT_UNIX_MS,
        read=pb.ReadRecordRequest(
            scope="tenant-a", object_id="invoice:42", mode=pb.READ_MODE_PRIMARY
        ),
    )


def request_read_reply_channel() -> pb.RequestEnvelope:
    envelope = request_read()
    envelope.request_id = "req-read-2"
    envelope.reply_channel = "chan-7f3a"
    return envelope


def request_write() -> pb.RequestEnvelope:
    return pb.RequestEnvelope(
        caller="billing",
        request_id="req-write-1",
        deadline_unix_ms=DEADLINE_UNIX_MS,
        issued_at_unix_ms=ISSUED_AT_UNIX_MS,
        idempotency_key="idem-write-1",
        # Conditional, so an older reader's pass-through of the field is covered;
        # revision 3 is the record in response_read, and response_write answers 4.
        write=pb.WriteRecordRequest(
            scope="tenant-a", object_id="invoice:42", payload=PAYLOAD, expected_revision=3
        ),
    )


def request_delete() -> pb.RequestEnvelope:
    return pb.RequestEnvelope(
        caller="billing",
        request_id="req-delete-1",
        deadline_unix_ms=DEADLINE_UNIX_MS,
        issued_at_unix_ms=ISSUED_AT_UNIX_MS,
        idempotency_key="idem-delete-1",
        delete=pb.DeleteRecordRequest(
            scope="tenant-a", object_id="invoice:42", expected_revision=4
        ),
    )


def request_list() -> pb.RequestEnvelope:
    return pb.RequestEnvelope(
        caller="billing",
        request_id="req-list-1",
        deadline_unix_ms=DEADLINE_UNIX_MS,
        issued_at_unix_ms=ISSUED_AT_UNIX_MS,
        list=pb.ListRecordsRequest(
            scope="tenant-a",
            page_size=25,
            cursor=encode_cursor("tenant-a", "invoice:41"),
        ),
    )


def request_batch() -> pb.RequestEnvelope:
    """Two operations in one signed message (the batch lane)."""
    return pb.RequestEnvelope(
        caller="billing",
        request_id="req-batch-1",
        deadline_unix_ms=DEADLINE_UNIX_MS,
        issued_at_unix_ms=ISSUED_AT_UNIX_MS,
        batch=pb.BatchRequest(
            operations=[
                pb.BatchOperation(
                    request_id="req-batch-1-w",
                    deadline_unix_ms=DEADLINE_UNIX_MS,
                    idempotency_key="idem-batch-1-w",
                    write=pb.WriteRecordRequest(
                        scope="tenant-a", object_id="invoice:44", payload=PAYLOAD
                    ),
                ),
                pb.BatchOperation(
                    request_id="req-batch-1-d",
                    deadline_unix_ms=DEADLINE_UNIX_MS - 1000,
                    idempotency_key="idem-batch-1-d",
                    delete=pb.DeleteRecordRequest(
                        scope="tenant-a", object_id="invoice:40", expected_revision=2
                    ),
                ),
            ]
        ),
    )


def request_read_many() -> pb.RequestEnvelope:
    return pb.RequestEnvelope(
        caller="billing",
        request_id="req-many-1",
        deadline_unix_ms=DEADLINE_UNIX_MS,
        issued_at_unix_ms=ISSUED_AT_UNIX_MS,
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
    )


def response_read_many() -> pb.ResponseEnvelope:
    """Each read's own result, in order: a record, then a refusal."""
    return pb.ResponseEnvelope(
        request_id="req-many-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        read_many=pb.ReadManyResponse(
            results=[
                pb.ReadManyResult(
                    status=pb.Status(code=pb.STATUS_CODE_OK),
                    record=_record("invoice:42", 3, PAYLOAD),
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
    )


def response_batch() -> pb.ResponseEnvelope:
    """request_batch's answer: the write's own answer, and the delete's refusal."""
    return pb.ResponseEnvelope(
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
                        code=pb.STATUS_CODE_CONFLICT,
                        message="the record is at revision 3",
                    ),
                ),
            ]
        ),
    )


def response_read() -> pb.ResponseEnvelope:
    return pb.ResponseEnvelope(
        request_id="req-read-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        read=pb.ReadRecordResponse(record=_record("invoice:42", 3, PAYLOAD)),
    )


def response_write() -> pb.ResponseEnvelope:
    return pb.ResponseEnvelope(
        request_id="req-write-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        write=pb.WriteRecordResponse(object_id="invoice:42", revision=4, created=False),
    )


def response_delete() -> pb.ResponseEnvelope:
    return pb.ResponseEnvelope(
        request_id="req-delete-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        delete=pb.DeleteRecordResponse(object_id="invoice:42", revision=4),
    )


def response_list() -> pb.ResponseEnvelope:
    return pb.ResponseEnvelope(
        request_id="req-list-1",
        status=pb.Status(code=pb.STATUS_CODE_OK),
        list=pb.ListRecordsResponse(
            records=[_record("invoice:42", 4, PAYLOAD), _record("invoice:43", 1, b"")],
            next_cursor=encode_cursor("tenant-a", "invoice:43"),
        ),
    )


def response_error() -> pb.ResponseEnvelope:
    return pb.ResponseEnvelope(
        request_id="req-write-2",
        status=pb.Status(
            code=pb.STATUS_CODE_RESOURCE_EXHAUSTED,
            message="the batch lane is full",
            retry_after_ms=250,
        ),
    )


def record() -> pb.Record:
    """The v2 cache format."""
    return _record("invoice:42", 3, PAYLOAD)


def list_cursor() -> pb.ListCursor:
    """What a list cursor holds before base64url; callers keep cursors across deploys."""
    return pb.ListCursor(scope="tenant-a", after_object_id="invoice:41")


FIXTURES: dict[str, Callable[[], Message]] = {
    "request_read": request_read,
    "request_read_reply_channel": request_read_reply_channel,
    "request_write": request_write,
    "request_delete": request_delete,
    "request_list": request_list,
    "request_batch": request_batch,
    "request_read_many": request_read_many,
    "response_read": response_read,
    "response_write": response_write,
    "response_delete": response_delete,
    "response_list": response_list,
    "response_batch": response_batch,
    "response_read_many": response_read_many,
    "response_error": response_error,
    "record": record,
    "list_cursor": list_cursor,
}


def write_fixtures(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in FIXTURES.items():
        path = out / f"{name}.bin"
        path.write_bytes(build().SerializeToString(deterministic=True))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURE_DIR)
    args = parser.parse_args(argv)
    for path in write_fixtures(args.out):
        print(path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
