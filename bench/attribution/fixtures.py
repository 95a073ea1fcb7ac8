"""Fixed fixtures: serialization without I/O, and compression, in this process.

**Serialization.** For each system and payload size, the functions its
integrated path calls, on the same records (random payloads), with no Redis,
database or Celery in between:

===============  =========================  =========================  =========================
step             (a) plain                  (b) admitted JSON          (c) protobuf
===============  =========================  =========================  =========================
request encode   Celery's JSON of the args  JSON request, Celery JSON  ``request_envelope``,
                                                                       ``SerializeToString``
request decode   Celery's JSON              Celery's JSON              ``decode_request`` (parse
                                                                       and validate)
cache decode     ``json.loads``             v1 ``decode_entry``        v2 ``decode_entry``
response encode  Celery's result meta       ``json_response``          ``ResponseEnvelope``
response decode  the meta, then base64      ``json_response_payload``  ``decode_response``
===============  =========================  =========================  =========================

The service's request signature (HMAC) is left out: it is not serialization,
and the integrated path counts it. Each figure is CPU time
(``time.process_time_ns``, garbage collector off) per operation, the median
of rounds of enough passes to last ``min_time``; **allocated** is the
``tracemalloc`` peak of one operation above what was live before it, median
over the records.

**Compression.** zlib (levels 1 and 6, the standard library's only codec) on
text-like JSON (compressible) and random bytes (the control): compressed
size, CPU to compress and to decompress. Where it pays is derived in the
report from these figures alone.
"""

from __future__ import annotations

import functools
import json
import random
import statistics
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

from bench.attribution.callers import CALLER
from bench.attribution.wire import (
    decode_task_body,
    encode_task_body,
    json_request,
    json_response,
    json_response_payload,
    kombu_dumps,
    kombu_loads,
    plain_payload,
    plain_value,
)
from bench.formats import sample_ns
from dataservice.cache.formats import CODECS, frame
from dataservice.cache.store import decode_entry
from dataservice.codec import decode_request, decode_response, record_from_pb, request_envelope
from dataservice.config.model import Limits
from dataservice.enums import CacheFormat, ReadMode
from dataservice.proto import pb
from dataservice.types import ReadOp

STEPS = ("request encode", "request decode", "cache decode", "response encode", "response decode")
# 2026-12-01 12:00 UTC, as bench/formats.py.
UPDATED_AT_UNIX_MS = 1_796_126_400_000
DEADLINE_MS = UPDATED_AT_UNIX_MS + 2000
_OK = pb.Status(code=pb.STATUS_CODE_OK)
_WORDS = ("order", "customer", "shipped", "pending", "north", "south", "amount", "EUR", "USD",
          "item", "sku", "quantity", "price", "discount", "note", "fragile")  # fmt: skip

Step = tuple[Callable[[Any], object], list[Any]]


def records(size: int, count: int, seed: int = 7) -> list[pb.Record]:
    rng = random.Random(seed * 100_003 + size)
    return [
        pb.Record(
            object_id=f"obj-{i:06d}",
            revision=1000 + i,
            payload=rng.randbytes(size),
            updated_at_unix_ms=UPDATED_AT_UNIX_MS,
        )
        for i in range(count)
    ]


def _meta(value: Any, task_id: str) -> dict[str, Any]:
    # The keys of Celery's result meta, as its Redis backend stores them.
    return {
        "status": "SUCCESS",
        "result": value,
        "traceback": None,
        "children": [],
        "date_done": "2026-12-01T12:00:00.000000+00:00",
        "task_id": task_id,
    }


def _plain_answer(meta: tuple[str, str, str | bytes]) -> bytes:
    """What the plain caller's ``.get()`` does with the stored meta."""
    return plain_payload(kombu_loads(meta[2], meta[0], meta[1])["result"])


def _plain(recs: list[pb.Record], scope: str) -> dict[str, Step]:
    args = [encode_task_body([scope, r.object_id, True]) for r in recs]
    values = [plain_value(record_from_pb(r)) for r in recs]
    metas = [
        kombu_dumps(_meta(v, r.object_id), serializer="json")
        for v, r in zip(values, recs, strict=True)
    ]
    return {
        "request encode": (lambda r: encode_task_body([scope, r.object_id, True]), recs),
        "request decode": (lambda a: decode_task_body(a[2], a[0], a[1]), args),
        "cache decode": (json.loads, [json.dumps(v).encode() for v in values]),
        "response encode": (lambda v: kombu_dumps(_meta(v, "t"), serializer="json"), values),
        "response decode": (
            lambda m: plain_payload(kombu_loads(m[2], m[0], m[1])["result"]),
            metas,
        ),
    }


def _json(recs: list[pb.Record], scope: str) -> dict[str, Step]:
    def request(r: pb.Record) -> dict[str, Any]:
        return json_request(r.object_id, CALLER, scope, r.object_id, True, DEADLINE_MS)

    args = [encode_task_body([request(r)]) for r in recs]
    v1 = CODECS[CacheFormat.V1]
    return {
        "request encode": (lambda r: encode_task_body([request(r)]), recs),
        "request decode": (lambda a: decode_task_body(a[2], a[0], a[1]), args),
        "cache decode": (
            lambda e: decode_entry(CacheFormat.V1, e),
            [frame(r.revision, v1.encode(r)) for r in recs],
        ),
        "response encode": (lambda r: json_response(r.object_id, r), recs),
        "response decode": (json_response_payload, [json_response(r.object_id, r) for r in recs]),
    }


def _protobuf(recs: list[pb.Record], scope: str, limits: Limits) -> dict[str, Step]:
    def request(r: pb.Record) -> bytes:
        operation = ReadOp(scope, r.object_id, ReadMode.ALLOW_CACHED)
        envelope = request_envelope(
            CALLER,
            operation,
            request_id=r.object_id,
            deadline_ms=DEADLINE_MS,
            issued_at_ms=UPDATED_AT_UNIX_MS,
            idempotency_key="",
            limits=limits,
        )
        return envelope.SerializeToString()

    def response(r: pb.Record) -> bytes:
        result = pb.ReadRecordResponse(record=r)
        return pb.ResponseEnvelope(
            request_id=r.object_id, status=_OK, read=result
        ).SerializeToString()

    v2 = CODECS[CacheFormat.V2]
    return {
        "request encode": (request, recs),
        "request decode": (lambda b: decode_request(b, limits), [request(r) for r in recs]),
        "cache decode": (
            lambda e: decode_entry(CacheFormat.V2, e),
            [frame(r.revision, v2.encode(r)) for r in recs],
        ),
        "response encode": (response, recs),
        "response decode": (lambda b: decode_response(b, "id"), [response(r) for r in recs]),
    }


def cpu_ns(call: Callable[[Any], object], items: list[Any], repeats: int, min_time: float) -> float:
    """Median CPU ns per item over ``repeats`` samples of at least ``min_time`` s each."""
    passes = 1
    while sample_ns(call, items * passes) < min_time * 1e9:
        passes *= 2
    batch = items * passes
    return statistics.median(sample_ns(call, batch) / len(batch) for _ in range(repeats))


def allocated(call: Callable[[Any], object], items: list[Any]) -> float:
    """Median tracemalloc peak of one call above what was live before it, in bytes."""
    peaks = []
    tracemalloc.start()
    try:
        for item in items:
            tracemalloc.reset_peak()
            live = tracemalloc.get_traced_memory()[0]
            call(item)
            peaks.append(tracemalloc.get_traced_memory()[1] - live)
    finally:
        tracemalloc.stop()
    return statistics.median(peaks)


def _size_of(result: object) -> int | None:
    if isinstance(result, bytes | str):
        return len(result)
    if isinstance(result, tuple) and len(result) == 3 and isinstance(result[2], bytes | str):
        return len(result[2])  # kombu's (content type, encoding, body)
    return None


def serialization(
    sizes: tuple[int, ...], limits: Limits, count: int, repeats: int, min_time: float
) -> list[dict[str, Any]]:
    """Each system's steps, per payload size."""
    rows = []
    for size in sizes:
        recs = records(size, count)
        scope = f"p{size}"
        for system, steps in (
            ("a", _plain(recs, scope)),
            ("b", _json(recs, scope)),
            ("c", _protobuf(recs, scope, limits)),
        ):
            figures: dict[str, Any] = {}
            for name in STEPS:
                call, items = steps[name]
                figures[name] = {
                    "cpu_us": cpu_ns(call, items, repeats, min_time) / 1000,
                    "allocated_bytes": allocated(call, items),
                    "output_bytes": _size_of(call(items[0])) if "encode" in name else None,
                }
            rows.append({"system": system, "payload_bytes": size, "steps": figures})
    return rows


def text_json(size: int, seed: int = 11) -> bytes:
    """``size`` bytes of JSON-like text: records of words, numbers and dates."""
    rng = random.Random(seed)
    parts, length = [], 0
    while length < size:
        item = {
            "id": rng.randrange(10**6),
            "status": rng.choice(_WORDS),
            "note": " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(3, 9))),
            "amount": round(rng.uniform(1, 5000), 2),
            "updated": f"2026-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        }
        text = json.dumps(item, separators=(",", ":"))
        parts.append(text)
        length += len(text) + 1
    return ("[" + ",".join(parts) + "]").encode()[:size]


def compression(
    text_sizes: tuple[int, ...], random_sizes: tuple[int, ...], repeats: int, min_time: float
) -> list[dict[str, Any]]:
    """zlib at levels 1 and 6 on each payload: sizes and CPU both ways."""
    payloads = [("text JSON", size, text_json(size)) for size in text_sizes]
    payloads += [("random", size, random.Random(size).randbytes(size)) for size in random_sizes]
    rows = []
    for kind, size, data in payloads:
        for level in (1, 6):
            squeeze = functools.partial(zlib.compress, level=level)
            packed = squeeze(data)
            rows.append(
                {
                    "payload": kind,
                    "payload_bytes": size,
                    "level": level,
                    "compressed_bytes": len(packed),
                    "compress_us": cpu_ns(squeeze, [data], repeats, min_time) / 1000,
                    "decompress_us": cpu_ns(zlib.decompress, [packed], repeats, min_time) / 1000,
                }
            )
    return rows
