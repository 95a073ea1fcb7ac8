"""Where an ``ALLOW_CACHED`` read finds its record: the cache, else one read.

The order for one read (``docs/cache.md``, "A read"):

1. ``PRIMARY`` reads go to the database under a point-read permit, alone:
   one is never answered by a read that began before it arrived.
2. Otherwise, unless the cache is not read (bypass, outside the read
   percentage, no read format, the freshness guard engaged, the breaker
   open), one ``GET`` of the format read: a hit answers.
3. A miss, and an ``ALLOW_CACHED`` read that does not use the cache, is
   coalesced in the process (:mod:`dataservice.cache.coalesce`), then across
   replicas while Redis answers (:mod:`dataservice.cache.replicas`): the
   database sees one read per key at a time whatever the cache is doing.

A Redis error at any step counts against the breaker, and the read goes on
to the database under the same permits; nothing is made up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dataservice.cache.breaker import Breaker, BreakerState, CacheDown, Guard
from dataservice.cache.coalesce import Coalescer, FollowerTimedOut, LeaderFailed
from dataservice.cache.controls import RolloutControls
from dataservice.cache.guard import FreshnessGuard
from dataservice.cache.replicas import ANSWER_MARGIN_MS, ReplicaCoalescing
from dataservice.cache.shadow import ShadowComparisons
from dataservice.cache.store import CacheStore, decode_entry
from dataservice.codec import record_to_pb
from dataservice.config.cache import CacheConfig
from dataservice.enums import CacheFormat, OperationClass, ReadMode
from dataservice.handler.database import Database
from dataservice.handler.failures import CoalescedWaitExpired
from dataservice.handler.operations import read_in_bulk
from dataservice.handler.source import Found
from dataservice.observe import trace as tracing
from dataservice.observe.metrics import (
    BREAKER,
    CACHE_READS,
    COALESCED,
    DEPENDENCY_FAILURES,
    Dependency,
)
from dataservice.observe.metrics.requests import cache_stage
from dataservice.proto import pb
from dataservice.redis.keys import record_key
from dataservice.store import RecordStore
from dataservice.store.connections import now_ms

log = logging.getLogger(__name__)

# After a rotation, a change also invalidates the previous generation this
# long (at least): a replica that has not re-read the controls still reads it.
ROTATION_READ_MS = 60_000


@dataclass(frozen=True, slots=True)
class Peeking:
    """The cache entry the gate reads for an admitted read (``peek_key``)."""

    fmt: CacheFormat
    key: str
    scope: str
    object_id: str
    request_id: str
    # A hit to be compared (docs/cache.md, "Shadow comparisons"): the worker
    # must see its entry, so the gate's script must not answer it whole.
    compared: bool

    @property
    def record_of(self) -> tuple[str, str]:
        return self.scope, self.object_id


class CachedSource:
    """A lane's reads, through the cache (one per worker process)."""

    def __init__(
        self,
        database: Database,
        store: RecordStore,
        cache: CacheStore,
        controls: RolloutControls,
        config: CacheConfig,
        lane: str,
        shadow: ShadowComparisons,
        clock: Callable[[], int] = now_ms,
        guard: FreshnessGuard | None = None,
        keys_per_select: int = 100,
        share_ms: int = 0,
    ) -> None:
        self._database = database
        self._store = store
        self._keys_per_select = keys_per_select
        self._cache = cache
        self._controls = controls
        self._lane = lane
        self._clock = clock
        self._guard_freshness = guard
        self._shadow = shadow
        self._ttl_ms = config.ttl_s * 1000
        self._coalesce = config.coalesce
        # How long after a rotation the generation before it is still read.
        self._rotation_ms = max(ROTATION_READ_MS, 2 * config.controls_max_age_ms)
        self.breaker = Breaker(config.breaker, on_change=BREAKER.labels(lane).set)
        self._guard = Guard(self.breaker, self._failed)
        self._replicas = ReplicaCoalescing(
            cache,
            self._guard,
            controls,
            self._database_read,
            self._bulk_read,
            config,
            lane,
            clock,
            share_ms,
        )
        self._coalescer: Coalescer[pb.Record | None] = Coalescer(
            config.max_inflight_keys,
            on_follow=COALESCED.labels(lane, "process").inc,
            keep_ms=share_ms,
            clock=clock,
        )

    def peek_key(
        self, scope: str, object_id: str, mode: ReadMode, request_id: str
    ) -> Peeking | None:
        """The entry an admitted read would look at first, for the gate to
        read in the same round trip; None when the read skips the cache."""
        # Only a closed breaker: a half-open one's single probe belongs to a
        # read that reports back to it (read()).
        if mode is ReadMode.PRIMARY or self.breaker.state is not BreakerState.CLOSED:
            return None
        rollout = self._controls.current()
        fmt = rollout.read_format(request_id) if self._fresh() else None
        if fmt is None:
            return None
        key = record_key(fmt.value, scope, object_id, rollout.generation)
        return Peeking(fmt, key, scope, object_id, request_id, rollout.shadowed(request_id))

    def peeked(self, target: Peeking, value: bytes | None) -> pb.Record | None:
        """The record in an entry the gate read, or None (a miss, or an entry
        that does not decode: the full read looks again)."""
        record = decode_entry(target.fmt, value) if value is not None else None
        if record is not None:
            CACHE_READS.labels(self._lane, target.fmt.value, "hit").inc()
            rollout = self._controls.current()
            self._shadow.offer(rollout, target.fmt, *target.record_of, record, target.request_id)
        return record

    def peeked_answered(self, target: Peeking) -> None:
        """A hit the gate's script answered itself."""
        CACHE_READS.labels(self._lane, target.fmt.value, "hit").inc()

    def read(
        self,
        scope: str,
        object_id: str,
        mode: ReadMode,
        deadline_ms: int,
        request_id: str,
        issued_ms: int | None = None,
    ) -> pb.Record | None:
        """The record (None: there is none) as ``mode`` allows; ``issued_ms``
        (when the request was sent) lets a coalesced read that ended after it
        answer it."""
        if mode is ReadMode.PRIMARY:
            return self._database_read(scope, object_id, deadline_ms)
        rollout = self._controls.current()
        fmt = rollout.read_format(request_id) if self._fresh() else None
        key = (scope, object_id)
        if fmt is not None:
            try:
                record = self._get(fmt, scope, object_id, rollout.generation)
            except CacheDown:
                # Redis just failed this read: coalesced in the process only.
                return self._coalesced(
                    key,
                    deadline_ms,
                    issued_ms,
                    lambda: self._database_read(scope, object_id, deadline_ms),
                )
            if record is not None:
                self._shadow.offer(rollout, fmt, scope, object_id, record, request_id)
                return record
            CACHE_READS.labels(self._lane, fmt.value, "miss").inc()
        return self._coalesced(
            key,
            deadline_ms,
            issued_ms,
            lambda: self._miss(scope, object_id, fmt, deadline_ms, issued_ms),
        )

    def read_many(
        self,
        keys: Sequence[tuple[str, str]],
        mode: ReadMode,
        deadline_ms: int,
        request_id: str,
        issued_ms: int | None = None,
    ) -> Found:
        """Many reads (a read_many's, of one mode), as :meth:`read` reads one:
        the hits in one MGET, the misses coalesced a step for all at once
        (:meth:`ReplicaCoalescing.read_many`). Hits are not shadow-compared."""
        if mode is ReadMode.PRIMARY:
            return self._bulk_read(keys, deadline_ms)
        rollout = self._controls.current()
        fmt = rollout.read_format(request_id) if self._fresh() else None
        found: Found = {}
        misses = list(keys)
        if fmt is not None:
            try:
                with tracing.timed(cache_stage(fmt)):
                    hits = self._guard(lambda: self._cache.get_many(fmt, keys, rollout.generation))
            except CacheDown:
                return self._bulk_read(keys, deadline_ms)
            found.update(hits)
            misses = [key for key in keys if key not in hits]
            if hits:
                CACHE_READS.labels(self._lane, fmt.value, "hit").inc(len(hits))
            if misses:
                CACHE_READS.labels(self._lane, fmt.value, "miss").inc(len(misses))
        if misses:
            found.update(self._replicas.read_many(misses, fmt, deadline_ms, issued_ms))
        return found

    def changed(self, scope: str, object_id: str, revision: int, *, deleted: bool) -> None:
        """A mutation of this service committed: drop the record's entries now,
        ahead of the change stream, and block older fills (a deleted record's
        own revision included)."""
        generations = self._read_generations()
        floor = revision + 1 if deleted else revision
        try:
            self._guard(
                lambda: self._cache.invalidate(scope, object_id, floor, generations, self._ttl_ms),
                probe=False,
            )
        except CacheDown:
            log.warning("cache: a change could not be invalidated; the change stream will")

    def changed_many(self, changes: Sequence[tuple[str, str, int, bool]]) -> None:
        """:meth:`changed` for each ``(scope, object_id, revision, deleted)`` of
        a batch, in one round trip."""
        generations = self._read_generations()
        floors = [(s, i, r + 1 if deleted else r) for s, i, r, deleted in changes]
        try:
            self._guard(
                lambda: self._cache.invalidate_many(floors, generations, self._ttl_ms),
                probe=False,
            )
        except CacheDown:
            log.warning(
                "cache: %d changes could not be invalidated; the change stream will", len(changes)
            )

    def _read_generations(self) -> set[int]:
        """The generations a replica may still read: the current one and, for
        a while after a rotation (replicas learn of it within
        ``cache.controls_max_age_ms``), the one before. A change invalidates
        these; older entries nobody reads any more (the change stream forgets
        every live generation all the same)."""
        rollout = self._controls.current()
        if rollout.generation <= 1 or self._clock() - rollout.rotated_at_ms > self._rotation_ms:
            return {rollout.generation}
        return {rollout.generation, rollout.generation - 1}

    def _fresh(self) -> bool:
        """Whether the change stream keeps up (the freshness guard is off)."""
        return self._guard_freshness is None or self._guard_freshness.allows_cache()

    def _get(
        self, fmt: CacheFormat, scope: str, object_id: str, generation: int
    ) -> pb.Record | None:
        """The entry, None on a miss; raises :class:`CacheDown`."""
        with tracing.timed(cache_stage(fmt)):
            record = self._guard(lambda: self._cache.get(fmt, scope, object_id, generation))
        if record is not None:
            CACHE_READS.labels(self._lane, fmt.value, "hit").inc()
        return record

    def _miss(
        self,
        scope: str,
        object_id: str,
        fmt: CacheFormat | None,
        deadline_ms: int,
        issued_ms: int | None,
    ) -> pb.Record | None:
        if not self._coalesce:
            return self._replicas.read_alone(scope, object_id, fmt, deadline_ms)
        return self._replicas.read(scope, object_id, fmt, deadline_ms, issued_ms)

    def _coalesced(
        self,
        key: tuple[str, str],
        deadline_ms: int,
        issued_ms: int | None,
        read: Callable[[], pb.Record | None],
    ) -> pb.Record | None:
        """``read()``, shared with this process's concurrent misses of ``key``
        (and with those sent before it ended); a follower whose leader failed
        tries again itself."""
        if not self._coalesce:
            return read()
        while True:
            wait_ms = deadline_ms - self._clock() - ANSWER_MARGIN_MS
            try:
                return self._coalescer.run(key, read, wait_ms / 1000, issued_ms)
            except FollowerTimedOut:
                raise CoalescedWaitExpired from None
            except LeaderFailed:
                if deadline_ms - self._clock() <= ANSWER_MARGIN_MS:
                    raise CoalescedWaitExpired from None

    def _bulk_read(self, keys: Sequence[tuple[str, str]], deadline_ms: int) -> Found:
        return read_in_bulk(self._database, self._store, keys, deadline_ms, self._keys_per_select)

    def _database_read(self, scope: str, object_id: str, deadline_ms: int) -> pb.Record | None:
        record = self._database.run(
            OperationClass.POINT_READ,
            deadline_ms,
            lambda bounds: self._store.read(scope, object_id, bounds),
        )
        return record_to_pb(record) if record is not None else None

    def _failed(self, exc: Exception) -> None:
        DEPENDENCY_FAILURES.labels(self._lane, Dependency.CACHE.value).inc()
        log.warning("cache: %s", type(exc).__name__)
