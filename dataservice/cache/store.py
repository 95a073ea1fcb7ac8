"""The cache's Redis commands: each step of a read is one round trip.

:class:`CacheStore` knows the keys (:mod:`dataservice.keys`), the entry
framing (:mod:`dataservice.cache.formats`) and the scripts
(``lookup.lua``, ``fill.lua``, ``release.lua``, ``invalidate.lua``); it
knows nothing of permits, deadlines or rollouts. Every call may raise
``redis.RedisError``; the caller decides what that means.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import redis

from dataservice.cache.formats import CODECS, frame, unframe
from dataservice.enums import CacheFormat
from dataservice.keys import (
    FENCE_KEY,
    change_keys,
    filled_key,
    lock_key,
    lockwait_key,
    record_key,
    tombstone_key,
)
from dataservice.limits.scripts import LuaScript
from dataservice.proto import pb

_LOOKUP = LuaScript("lookup.lua", __package__)
_FILL = LuaScript("fill.lua", __package__)
_RELEASE = LuaScript("release.lua", __package__)
_INVALIDATE = LuaScript("invalidate.lua", __package__)

# What a leader tells its followers besides the record itself.
ABSENT = b"absent"
RETRY = b"retry"


@dataclass(frozen=True, slots=True)
class Hit:
    record: pb.Record


@dataclass(frozen=True, slots=True)
class Lead:
    token: bytes
    # When the lock was taken, by Redis's clock: a fill's expiry counts from here.
    started_ms: int


@dataclass(frozen=True, slots=True)
class Follow:
    token: bytes
    lease_left_ms: int


@dataclass(frozen=True, slots=True)
class Word:
    """What a leader told a follower: the record, ``absent``, or ``retry``."""

    record: pb.Record | None = None
    absent: bool = False


@dataclass(frozen=True, slots=True)
class Fill:
    outcome: str  # 'filled', 'late' or 'stale' (fill.lua)
    written: int


def decode_entry(fmt: CacheFormat, value: bytes) -> pb.Record | None:
    """The record in a stored entry, None if it is not a well-formed one."""
    framed = unframe(value)
    if framed is None:
        return None
    try:
        return CODECS[fmt].decode(framed[1])
    except ValueError:
        return None


class CacheStore:
    def __init__(self, client: redis.Redis, waits: redis.Redis | None = None) -> None:
        self._redis = client
        # Followers block on their own connections, with a socket timeout
        # longer than a lease; everything else is one quick command.
        self._waits = waits if waits is not None else client

    def get(
        self, fmt: CacheFormat, scope: str, object_id: str, generation: int
    ) -> pb.Record | None:
        """The cached record, or None (absent, or an entry that does not decode)."""
        value = self._redis.get(record_key(fmt.value, scope, object_id, generation))
        return decode_entry(fmt, value) if isinstance(value, bytes) else None

    def lookup(
        self, fmt: CacheFormat, scope: str, object_id: str, generation: int, lease_ms: int
    ) -> Hit | Lead | Follow | None:
        """After a miss: the entry after all, the lead, or a follower's place.
        None when the entry is there but does not decode."""
        keys = [
            record_key(fmt.value, scope, object_id, generation),
            lock_key(scope, object_id),
            lockwait_key(scope, object_id),
            filled_key(scope, object_id),
            FENCE_KEY,
        ]
        kind, first, *rest = _LOOKUP(self._redis, keys, [lease_ms])
        if kind == b"hit":
            record = decode_entry(fmt, first)
            return Hit(record) if record is not None else None
        if kind == b"lead":
            return Lead(_bytes(first), int(rest[0]))
        return Follow(_bytes(first), int(rest[0]))

    def wait(self, scope: str, object_id: str, token: bytes, timeout_s: float) -> Word | None:
        """The word of the leader holding ``token``; None if none came in time
        (or only a word of another leader, which is not for this follower)."""
        popped = self._waits.blpop([filled_key(scope, object_id)], timeout=timeout_s)
        if popped is None:
            return None
        sender, _, word = _bytes(popped[1]).partition(b"|")
        if sender != token:
            return None
        if word == ABSENT:
            return Word(absent=True)
        if word == RETRY:
            return Word()
        return Word(record=decode_entry(CacheFormat.V2, word))

    def fill(
        self,
        record: pb.Record,
        formats: Iterable[CacheFormat],
        scope: str,
        generation: int,
        started_ms: int,
        ttl_ms: int,
        token: bytes = b"",
    ) -> Fill:
        """Write ``record`` in every format at once, unless a change or a newer
        revision forbids it, and tell the lock's followers (``token``)."""
        object_id, revision = record.object_id, record.revision
        entries = {fmt: frame(revision, CODECS[fmt].encode(record)) for fmt in formats}
        word = entries.get(CacheFormat.V2) or frame(revision, CODECS[CacheFormat.V2].encode(record))
        keys = [
            tombstone_key(scope, object_id),
            lock_key(scope, object_id),
            lockwait_key(scope, object_id),
            filled_key(scope, object_id),
            *(record_key(fmt.value, scope, object_id, generation) for fmt in entries),
        ]
        args = [token, revision, started_ms, ttl_ms, word, *entries.values()]
        outcome, written = _FILL(self._redis, keys, args)
        return Fill(_bytes(outcome).decode(), int(written))

    def release(self, scope: str, object_id: str, token: bytes, *, absent: bool) -> bool:
        """Give up the lock without a fill; False if it was no longer ours."""
        keys = [lock_key(scope, object_id), lockwait_key(scope, object_id)]
        keys.append(filled_key(scope, object_id))
        return bool(_RELEASE(self._redis, keys, [token, ABSENT if absent else RETRY]))

    def invalidate(
        self, scope: str, object_id: str, floor: int, generations: Iterable[int], tomb_ms: int
    ) -> int:
        """A committed change: drop every format in each of ``generations`` and
        leave a tombstone for ``tomb_ms`` refusing fills below revision ``floor``."""
        return self.invalidate_many([(scope, object_id, floor)], generations, tomb_ms)

    def invalidate_many(
        self,
        changes: Iterable[tuple[str, str, int]],
        generations: Iterable[int],
        tomb_ms: int,
    ) -> int:
        """:meth:`invalidate` for each ``(scope, object_id, floor)``, in one
        script call (a batch's group); how many cached entries went."""
        generations = list(generations)
        keys: list[str] = []
        floors: list[int] = []
        for scope, object_id, floor in changes:
            keys += change_keys(scope, object_id, generations)
            floors.append(floor)
        if not floors:
            return 0
        per = len(keys) // len(floors)
        return int(_INVALIDATE(self._redis, keys, [tomb_ms, per, *floors]))


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
