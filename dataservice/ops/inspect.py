"""What waits in a lane's queue, and what the cache holds for a record.

:func:`decoded` takes what waits in a lane's queue, as the broker shows it
without taking anything from it (the oldest message first), and decodes each
message as the service does: the kombu JSON around it, the
``SignedRequest`` in its body, the ``RequestEnvelope`` inside. It reports the
operation, caller, scope, sizes, time left before the deadline and age; a
payload and the record's id only when asked (``payload=True``: the command
asks for a reader of the callers file). :func:`cached` lists a record's
entries in both formats and the live generations, with revisions, sizes and
time to live, and its tombstone; never an entry's body.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass

import redis
from google.protobuf.message import DecodeError

from dataservice.cache.formats import unframe
from dataservice.enums import CacheFormat
from dataservice.proto import pb
from dataservice.redis.keys import record_key, tombstone_key


@dataclass(frozen=True, slots=True)
class Waiting:
    position: int  # 0: the next to be taken
    operation: str  # read, write, delete, list; "undecodable" when it is not a request
    caller: str
    scope: str
    request_id: str
    envelope_bytes: int
    payload_bytes: int
    deadline_left_ms: int | None
    age_ms: int | None
    object_id: str | None = None  # only with payload=True
    payload: bytes | None = None  # only with payload=True


def decoded(entries: list[bytes], *, payload: bool = False) -> list[Waiting]:
    """A queue's entries as stored (the oldest first:
    :meth:`~dataservice.broker.base.Broker.peek`), decoded."""
    now_ms = time.time_ns() // 1_000_000
    return [_decode(position, item, now_ms, payload) for position, item in enumerate(entries)]


def _undecodable(position: int, size: int) -> Waiting:
    return Waiting(position, "undecodable", "", "", "", size, 0, None, None)


def _decode(position: int, item: bytes, now_ms: int, show: bool) -> Waiting:
    try:
        message = json.loads(item)
        body = base64.b64decode(message["body"])
        signed = pb.SignedRequest.FromString(body)
        envelope = pb.RequestEnvelope.FromString(signed.envelope)
    except (ValueError, KeyError, TypeError, binascii.Error, DecodeError):
        return _undecodable(position, len(item))
    kind = envelope.WhichOneof("operation") or "none"
    request = getattr(envelope, kind) if kind != "none" else None
    data = bytes(getattr(request, "payload", b""))
    return Waiting(
        position=position,
        operation=kind,
        caller=envelope.caller,
        scope=str(getattr(request, "scope", "")),
        request_id=envelope.request_id,
        envelope_bytes=len(signed.envelope),
        payload_bytes=len(data),
        deadline_left_ms=envelope.deadline_unix_ms - now_ms if envelope.deadline_unix_ms else None,
        age_ms=now_ms - envelope.issued_at_unix_ms if envelope.issued_at_unix_ms else None,
        object_id=str(getattr(request, "object_id", "")) if show else None,
        payload=data if show else None,
    )


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    generation: int
    format: str  # v1, v2, or "tombstone"
    revision: int | None  # None: absent
    size: int
    ttl_ms: int | None  # None: absent, or no expiry


def cached(client: redis.Redis, scope: str, object_id: str, generation: int) -> list[Entry]:
    """The record's entries in both formats for the generations a replica
    may read or fill (``generation`` and the ones either side), then its tombstone."""
    entries = []
    for gen in sorted({generation - 1, generation, generation + 1} - {0}):
        for fmt in CacheFormat:
            key = record_key(fmt.value, scope, object_id, gen)
            value: bytes | None = client.get(key)  # type: ignore[assignment]
            framed = unframe(value) if value is not None else None
            entries.append(
                Entry(
                    key,
                    gen,
                    fmt.value,
                    framed[0] if framed else None,
                    len(value) if value is not None else 0,
                    _ttl(client, key),
                )
            )
    key = tombstone_key(scope, object_id)
    tomb: bytes | None = client.get(key)  # type: ignore[assignment]
    entries.append(
        Entry(
            key,
            generation,
            "tombstone",
            int(tomb) if tomb is not None else None,
            len(tomb or b""),
            _ttl(client, key),
        )
    )
    return entries


def _ttl(client: redis.Redis, key: str) -> int | None:
    ttl = int(client.pttl(key))
    return ttl if ttl >= 0 else None
