"""The cache's Redis commands: each step of a read is one round trip.

:class:`CacheStore` knows the keys (:mod:`dataservice.redis.keys`), the entry
framing (:mod:`dataservice.cache.formats`) and the scripts
(``lookup.lua``, ``fill.lua``, ``release.lua``, ``invalidate.lua``; ``share.lua``
and ``forget.lua`` are fragments of them); it
knows nothing of permits, deadlines or rollouts. Every call may raise
``redis.RedisError``; the caller decides what that means.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from dataservice.cache.formats import CODECS, frame, unframe
from dataservice.enums import CacheFormat
from dataservice.proto import pb
from dataservice.redis.keys import (
    FENCE_KEY,
    change_keys,
    filled_key,
    lock_key,
    lockwait_key,
    record_key,
    shared_key,
    tombstone_key,
)
from dataservice.redis.scripts import LuaScript, run_pipelined

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
class Shared:
    """The word of a read that overlapped the request (the cache not read)."""

    word: Word


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
class Sharing:
    """A leader's record kept for requests sent before its read ended
    (``ds:shared:``), while the cache is not read: for ``keep_ms``."""

    ended_ms: int
    keep_ms: int


_NOT_SHARED = Sharing(0, 0)


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
        self,
        fmt: CacheFormat | None,
        scope: str,
        object_id: str,
        generation: int,
        lease_ms: int,
        issued_ms: int | None = None,
    ) -> Hit | Shared | Lead | Follow | None:
        """After a miss: the entry after all, the lead, or a follower's place.
        None when the entry is there but does not decode. ``fmt`` None: a read
        that does not use the cache, coalesced all the same (no entry looked
        at); with ``issued_ms`` (when the request was sent), the shared record
        of a read that ended after it is its answer (:class:`Shared`)."""
        keys = self._lookup_keys(fmt, scope, object_id, generation)
        return _step(fmt, _LOOKUP(self._redis, keys, _lookup_args(fmt, lease_ms, issued_ms)))

    @staticmethod
    def _lookup_keys(
        fmt: CacheFormat | None, scope: str, object_id: str, generation: int
    ) -> list[str]:
        return [
            record_key((fmt or CacheFormat.V2).value, scope, object_id, generation),
            lock_key(scope, object_id),
            lockwait_key(scope, object_id),
            filled_key(scope, object_id),
            FENCE_KEY,
            shared_key(scope, object_id),
        ]

    def get_many(
        self, fmt: CacheFormat, keys: Sequence[tuple[str, str]], generation: int
    ) -> dict[tuple[str, str], pb.Record]:
        """The records cached among ``keys`` (``(scope, object_id)``), in one MGET."""
        names = [record_key(fmt.value, scope, object_id, generation) for scope, object_id in keys]
        found = {}
        for key, value in zip(keys, self._redis.mget(names), strict=True):
            record = decode_entry(fmt, value) if isinstance(value, bytes) else None
            if record is not None:
                found[key] = record
        return found

    def lookup_many(
        self,
        fmt: CacheFormat | None,
        keys: Sequence[tuple[str, str]],
        generation: int,
        lease_ms: int,
        issued_ms: int | None = None,
    ) -> list[Hit | Shared | Lead | Follow | None]:
        """:meth:`lookup` for each of ``keys``, in one round trip."""
        args = _lookup_args(fmt, lease_ms, issued_ms)
        calls = [
            (_LOOKUP, self._lookup_keys(fmt, scope, object_id, generation), args)
            for scope, object_id in keys
        ]
        return [_step(fmt, reply) for reply in run_pipelined(self._redis, calls)]

    def settle_many(
        self,
        outcomes: Sequence[tuple[str, str, bytes, pb.Record | Exception | None]],
        formats: Iterable[CacheFormat],
        generation: int,
        started_ms: int,
        ttl_ms: int,
        shared: Sharing | None = None,
    ) -> list[Fill | None]:
        """A leader's end for each ``(scope, object_id, token, outcome)``, in one
        round trip: a record is filled (:meth:`fill`), an absent one or a
        failed read releases its lock (:meth:`release`). Each fill's outcome,
        None where the lock was released."""
        formats = list(formats)
        calls = []
        for scope, object_id, token, outcome in outcomes:
            if isinstance(outcome, pb.Record):
                keys, args = self._fill_call(
                    outcome, formats, scope, generation, started_ms, ttl_ms, token, shared
                )
                calls.append((_FILL, keys, args))
            else:
                absent = outcome is None
                release = self._release_call(scope, object_id, token, absent, shared)
                calls.append((_RELEASE, *release))
        replies = run_pipelined(self._redis, calls)
        return [
            Fill(_bytes(reply[0]).decode(), int(reply[1])) if call[0] is _FILL else None
            for call, reply in zip(calls, replies, strict=True)
        ]

    def wait(self, scope: str, object_id: str, token: bytes, timeout_s: float) -> Word | None:
        """The word of the leader holding ``token``; None if none came in time
        (or only a word of another leader, which is not for this follower)."""
        popped = self._waits.blpop([filled_key(scope, object_id)], timeout=timeout_s)
        if popped is None:
            return None
        sender, _, word = _bytes(popped[1]).partition(b"|")
        if sender != token:
            return None
        return _word(word)

    def fill(
        self,
        record: pb.Record,
        formats: Iterable[CacheFormat],
        scope: str,
        generation: int,
        started_ms: int,
        ttl_ms: int,
        token: bytes = b"",
        shared: Sharing | None = None,
    ) -> Fill:
        """Write ``record`` in every format at once, unless a change or a newer
        revision forbids it, and tell the lock's followers (``token``); with
        ``shared``, keep it for requests sent before the read ended too."""
        keys, args = self._fill_call(
            record, formats, scope, generation, started_ms, ttl_ms, token, shared
        )
        outcome, written = _FILL(self._redis, keys, args)
        return Fill(_bytes(outcome).decode(), int(written))

    @staticmethod
    def _fill_call(
        record: pb.Record,
        formats: Iterable[CacheFormat],
        scope: str,
        generation: int,
        started_ms: int,
        ttl_ms: int,
        token: bytes,
        shared: Sharing | None = None,
    ) -> tuple[list[str], list[Any]]:
        object_id, revision = record.object_id, record.revision
        entries = {fmt: frame(revision, CODECS[fmt].encode(record)) for fmt in formats}
        word = entries.get(CacheFormat.V2) or frame(revision, CODECS[CacheFormat.V2].encode(record))
        keys = [
            tombstone_key(scope, object_id),
            lock_key(scope, object_id),
            lockwait_key(scope, object_id),
            filled_key(scope, object_id),
            shared_key(scope, object_id),
            *(record_key(fmt.value, scope, object_id, generation) for fmt in entries),
        ]
        share = shared or _NOT_SHARED
        args = [token, revision, started_ms, ttl_ms, word, share.keep_ms, share.ended_ms]
        return keys, [*args, *entries.values()]

    def release(
        self,
        scope: str,
        object_id: str,
        token: bytes,
        *,
        absent: bool,
        shared: Sharing | None = None,
    ) -> bool:
        """Give up the lock without a fill; False if it was no longer ours.
        With ``shared``, an absent record is kept as :meth:`fill` keeps one."""
        call = self._release_call(scope, object_id, token, absent, shared)
        return bool(_RELEASE(self._redis, *call))

    @staticmethod
    def _release_call(
        scope: str, object_id: str, token: bytes, absent: bool, shared: Sharing | None = None
    ) -> tuple[list[str], list[Any]]:
        keys = [lock_key(scope, object_id), lockwait_key(scope, object_id)]
        keys += [filled_key(scope, object_id), shared_key(scope, object_id)]
        share = shared or _NOT_SHARED
        return keys, [token, ABSENT if absent else RETRY, share.keep_ms, share.ended_ms]

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


def _lookup_args(fmt: CacheFormat | None, lease_ms: int, issued_ms: int | None) -> list[Any]:
    return [lease_ms, "1" if fmt is not None else "", "" if issued_ms is None else issued_ms]


def _word(word: bytes) -> Word:
    if word == ABSENT:
        return Word(absent=True)
    if word == RETRY:
        return Word()
    return Word(record=decode_entry(CacheFormat.V2, word))


def _step(fmt: CacheFormat | None, reply: Any) -> Hit | Shared | Lead | Follow | None:
    """What ``lookup.lua`` answered, as a step (None: an entry that does not decode)."""
    kind, first, *rest = reply
    if kind == b"hit" and fmt is not None:
        record = decode_entry(fmt, first)
        return Hit(record) if record is not None else None
    if kind == b"shared":
        return Shared(_word(_bytes(first)))
    if kind == b"lead":
        return Lead(_bytes(first), int(rest[0]))
    return Follow(_bytes(first), int(rest[0]))


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
