"""The wire format's golden vectors: what a caller in any language checks its
encoding, its signature, its publish call and its reading of answers against.

    python -m dataservice_tools.vectors --write    # after a deliberate change of the wire format
    python -m dataservice_tools.vectors --check    # exit 1 when the file differs

The vectors live beside the schema, in ``dataservice/proto/access/v2/vectors.json``
(docs/protocol.md, "Writing a caller"). They are made here from fixed inputs
through the Python client's own code: the envelope as the client builds it, its
``SignedRequest`` under a fixed key, the arguments of ``FCALL ds_publish_v2``,
and answers as the workers encode them, with what each means. The suite
(``tests/proto/test_golden_vectors.py``) makes them again and fails when they
differ from the file: a change of the wire format shows as a change of the file.

The key is a test key, not a secret: ``vectors`` signs with key ``vectors-1``,
whose secret is the 32 bytes 0x00..0x1f.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from dataservice.broker import library
from dataservice.codec.envelopes import batch_envelope, batch_operation, request_envelope
from dataservice.config.model import Limits, load_config
from dataservice.enums import LaneName, ReadMode
from dataservice.proto import pb
from dataservice.security.auth import sign
from dataservice.security.callers import CallerKey, Secret
from dataservice.types import DeleteOp, ListOp, Operation, ReadManyOp, ReadOp, WriteOp

PATH = Path(str(resources.files("dataservice"))) / "proto" / "access" / "v2" / "vectors.json"
CALLER = "vectors"
KEY = CallerKey(CALLER, "vectors-1", Secret(bytes(range(32))))
# In 2096: a test still publishes these requests, and admission refuses one
# whose deadline has passed by Redis's clock.
ISSUED_AT_MS = 4_000_000_000_000
DEADLINE_MS = ISSUED_AT_MS + 2_000
BATCH_DEADLINE_MS = ISSUED_AT_MS + 300_000
UPDATED_AT_MS = 3_999_999_000_123
# The broker's epoch in a publish's answer: any token the caller keeps as it is.
EPOCH = "e4000000000000000" + f"{1:032x}"


def _request_id(n: int) -> str:
    return f"{n:032x}"


def _dict(message: Any) -> dict[str, Any]:
    shown: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, use_integers_for_enums=False
    )
    return shown


def _request(
    name: str,
    lane: LaneName,
    envelope: pb.RequestEnvelope,
    operation: str,
    ops: int,
) -> dict[str, Any]:
    encoded = envelope.SerializeToString()
    signed = sign(encoded, KEY)
    args = library.publish_args(
        lane, envelope.request_id, CALLER, envelope.deadline_unix_ms, operation, ops, signed
    )
    return {
        "name": name,
        "lane": lane.value,
        "envelope": _dict(envelope),
        "envelope_hex": encoded.hex(),
        "signature_hex": pb.SignedRequest.FromString(signed).signature.hex(),
        "signed_request_hex": signed.hex(),
        # FCALL ds_publish_v2 0 <these>: every argument as the string Redis gets.
        "publish_args": [a.decode() if isinstance(a, bytes) else str(a) for a in args[2:-1]],
    }


def requests(limits: Limits) -> list[dict[str, Any]]:
    """One vector per kind of request."""
    singles: list[tuple[str, LaneName, Operation, str, str]] = [
        ("read, a cached copy allowed", LaneName.INTERACTIVE,
         ReadOp("orders", "o-1"), "", ""),
        ("read from the primary", LaneName.INTERACTIVE,
         ReadOp("orders", "o-1", ReadMode.PRIMARY), "", ""),
        ("read, answered on a reply channel", LaneName.INTERACTIVE,
         ReadOp("orders", "o-1"), "", "replies-1"),
        ("write", LaneName.INTERACTIVE,
         WriteOp("orders", "o-2", b"\x00\x01 payload \xff"), "k-2", ""),
        ("write at an expected revision", LaneName.INTERACTIVE,
         WriteOp("orders", "o-3", b"{}", expected_revision=3), "k-3", ""),
        ("delete", LaneName.INTERACTIVE, DeleteOp("orders", "o-4"), "k-4", ""),
        ("list, first page", LaneName.INTERACTIVE, ListOp("orders", page_size=10), "", ""),
        ("read_many", LaneName.INTERACTIVE,
         ReadManyOp((ReadOp("orders", "o-1"), ReadOp("orders", "o-5", ReadMode.PRIMARY))), "", ""),
    ]  # fmt: skip
    vectors = []
    for n, (name, lane, operation, key, channel) in enumerate(singles, start=1):
        envelope = request_envelope(
            CALLER, operation, request_id=_request_id(n), deadline_ms=DEADLINE_MS,
            issued_at_ms=ISSUED_AT_MS, idempotency_key=key, limits=limits,
        )  # fmt: skip
        if channel:
            envelope.reply_channel = channel
        kind = envelope.WhichOneof("operation") or ""
        ops = len(envelope.read_many.reads) if kind == "read_many" else 1
        vectors.append(_request(name, lane, envelope, kind, ops))
    operations = [
        batch_operation(
            WriteOp("orders", "o-6", b"first"), request_id=_request_id(101),
            deadline_ms=BATCH_DEADLINE_MS, idempotency_key="k-6", limits=limits,
        ),
        batch_operation(
            DeleteOp("orders", "o-7"), request_id=_request_id(102),
            deadline_ms=BATCH_DEADLINE_MS, idempotency_key="k-7", limits=limits,
        ),
    ]  # fmt: skip
    batch = batch_envelope(CALLER, _request_id(100), ISSUED_AT_MS, operations)
    vectors.append(_request("batch of a write and a delete", LaneName.BATCH, batch, "batch", 2))
    return vectors


def _record(object_id: str, revision: int, payload: bytes) -> pb.Record:
    return pb.Record(
        object_id=object_id, revision=revision, payload=payload, updated_at_unix_ms=UPDATED_AT_MS
    )


def _status(code: int, message: str = "", retry_after_ms: int = 0, reason: str = "") -> pb.Status:
    return pb.Status(code=code, message=message, retry_after_ms=retry_after_ms, reason=reason)  # type: ignore[arg-type]


def _answered(n: int, status: pb.Status, **result: Any) -> pb.ResponseEnvelope:
    return pb.ResponseEnvelope(request_id=_request_id(n), status=status, **result)


# Refusals and failures: (name, request number, code, message, retry after ms, reason).
_REFUSALS: list[tuple[str, int, int, str, int, str]] = [
    ("not found", 2, pb.STATUS_CODE_NOT_FOUND, "no such record", 0, ""),
    ("conflict", 5, pb.STATUS_CODE_CONFLICT, "the record is not at the expected revision", 0, ""),
    ("rate limited", 1, pb.STATUS_CODE_RESOURCE_EXHAUSTED, "over the caller's rate",
     120, "rate_limited"),
    ("concurrency limited", 1, pb.STATUS_CODE_RESOURCE_EXHAUSTED, "too many requests in flight",
     25, "concurrency_limited"),
    ("no permit", 1, pb.STATUS_CODE_RESOURCE_EXHAUSTED, "no database permit free",
     50, "no_permit"),
    ("database unavailable", 4, pb.STATUS_CODE_UNAVAILABLE, "the database is unavailable",
     250, "database_unavailable"),
    ("unauthenticated: bad signature", 1, pb.STATUS_CODE_UNAUTHENTICATED,
     "the signature does not match the request", 0, "bad_signature"),
    ("permission denied: scope", 1, pb.STATUS_CODE_PERMISSION_DENIED,
     "the caller may not use this scope", 0, "scope_denied"),
    ("invalid argument", 1, pb.STATUS_CODE_INVALID_ARGUMENT, "object_id is malformed",
     0, "malformed"),
    ("deadline exceeded", 2, pb.STATUS_CODE_DEADLINE_EXCEEDED, "too little time left to run",
     0, ""),
    ("internal", 1, pb.STATUS_CODE_INTERNAL, "internal error", 0, ""),
]  # fmt: skip


def _oks() -> list[tuple[str, pb.ResponseEnvelope]]:
    ok = _status(pb.STATUS_CODE_OK)
    missing = _status(pb.STATUS_CODE_NOT_FOUND, "no such record")
    listed = pb.ListRecordsResponse(
        records=[_record("o-1", 2, b"a"), _record("o-2", 1, b"b")],
        next_cursor="CgZvcmRlcnMSA28tMg",
    )
    many = pb.ReadManyResponse(
        results=[
            pb.ReadManyResult(status=ok, record=_record("o-1", 2, b"a")),
            pb.ReadManyResult(status=missing),
        ]
    )
    written = pb.WriteRecordResponse(object_id="o-6", revision=1, created=True)
    batch = pb.BatchResponse(
        answers=[
            pb.ResponseEnvelope(request_id=_request_id(101), status=ok, write=written),
            pb.ResponseEnvelope(request_id=_request_id(102), status=missing),
        ]
    )
    read = pb.ReadRecordResponse(record=_record("o-1", 2, b"\x00\x01 payload \xff"))
    return [
        ("read: OK", _answered(1, ok, read=read)),
        ("write: OK, created", _answered(4, ok, write=pb.WriteRecordResponse(
            object_id="o-2", revision=1, created=True))),
        ("delete: OK", _answered(6, ok, delete=pb.DeleteRecordResponse(
            object_id="o-4", revision=4))),
        ("list: OK, more to come", _answered(7, ok, list=listed)),
        ("read_many: OK, one of the reads not found", _answered(8, ok, read_many=many)),
        ("batch: OK, one answer per operation", _answered(100, ok, batch=batch)),
    ]  # fmt: skip


def answers() -> list[dict[str, Any]]:
    """One vector per kind of answer: OK for each operation, and each refusal."""
    made = _oks() + [
        (name, _answered(n, _status(code, message, retry_after_ms, reason)))
        for name, n, code, message, retry_after_ms, reason in _REFUSALS
    ]
    return [
        {"name": name, "response": _dict(answer), "response_hex": answer.SerializeToString().hex()}
        for name, answer in made
    ]


def publish_answers() -> list[dict[str, Any]]:
    """What ``FCALL ds_publish_v2`` answers (docs/protocol.md, "Publishing on Redis")."""
    return [
        {"name": "queued", "answer": ["", EPOCH, 0]},
        {"name": "queued, 7 requests' worth leased", "answer": ["", EPOCH, 7]},
        {"name": "refused: the queue is full", "answer": ["queue_full", 40]},
        {"name": "refused: too many bytes queued", "answer": ["queue_bytes", 10]},
        {"name": "refused: too long for the deadline", "answer": ["queue_too_long", 350]},
        {"name": "refused: over the caller's rate", "answer": ["rate_limited", 50]},
    ]  # fmt: skip


def vectors(limits: Limits) -> dict[str, Any]:
    return {
        "about": "Golden vectors of the access.v2 wire format (docs/protocol.md, "
        '"Writing a caller"); made by python -m dataservice_tools.vectors.',
        "key": {
            "caller": KEY.caller,
            "key_id": KEY.key_id,
            "secret_hex": KEY.secret.value.hex(),
        },
        "requests": requests(limits),
        "answers": answers(),
        "publish_answers": publish_answers(),
        "base64_of_signed_request": "RFC 4648 with padding: "
        + base64.b64encode(b"\x00\xff").decode(),
    }


def text(limits: Limits) -> str:
    return json.dumps(vectors(limits), indent=1, sort_keys=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true")
    action.add_argument("--check", action="store_true")
    parser.add_argument(
        "--config",
        type=Path,
        default=Path("queues.yml"),
        help="whose limits the requests are checked against (the repository's)",
    )
    options = parser.parse_args()
    made = text(load_config(options.config).limits)
    if options.write:
        PATH.write_text(made, encoding="utf-8")
        print(f"wrote {PATH}")
        return 0
    if PATH.read_text(encoding="utf-8") != made:
        print(f"{PATH} differs from what the code makes: the wire format changed", file=sys.stderr)
        return 1
    print(f"{PATH}: as the code makes it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
