"""A miss, coalesced across replicas: one leader per key reads, the rest wait.

``docs/cache.md`` ("A read", steps 4-7) is the protocol; the scripts are
``lookup.lua``, ``fill.lua`` and ``release.lua``. Only the leader holds a
database permit. A follower waits for the leader's word by a blocking pop,
each until its own deadline, and never reads the database on its own: when
its wait ends without a record it looks again (the entry, the lock, or a new
leader), and at its deadline it answers :class:`CoalescedWaitExpired`.

An ``ALLOW_CACHED`` read that does not use the cache (bypass, the freshness
guard, outside the rollout's percentage) is coalesced the same way, with no
format: nobody looks at an entry, and the leader hands its record to its
followers without filling the cache (``docs/cache.md``, "Coalescing without
the cache"). The database needs coalescing most when the cache is not there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from dataservice.cache.breaker import CacheDown, Guard
from dataservice.cache.controls import Rollout, RolloutControls
from dataservice.cache.store import CacheStore, Follow, Hit, Lead, Shared, Sharing, Word
from dataservice.config.cache import CacheConfig
from dataservice.enums import CacheFormat
from dataservice.handler.failures import CoalescedWaitExpired
from dataservice.handler.source import Found
from dataservice.observe import trace as tracing
from dataservice.observe.metrics import CACHE_FILLS, COALESCED, TAKEOVERS, Stage
from dataservice.observe.metrics.requests import cache_stage
from dataservice.proto import pb
from dataservice.refusals import Refusal
from dataservice.store.connections import now_ms

T = TypeVar("T")
# What a follower keeps back from its deadline to get its answer out in time.
ANSWER_MARGIN_MS = 5
# A follower waits a little past the leader's lease before it looks again.
_LEASE_SLACK_MS = 20

DatabaseRead = Callable[[str, str, int], "pb.Record | None"]
# Keys read from the database at once (a SELECT ... IN per permit).
BulkRead = Callable[[Sequence[tuple[str, str]], int], Found]


class ReplicaCoalescing:
    def __init__(
        self,
        cache: CacheStore,
        guard: Guard,
        controls: RolloutControls,
        database_read: DatabaseRead,
        bulk_read: BulkRead,
        config: CacheConfig,
        lane: str,
        clock: Callable[[], int] = now_ms,
        share_ms: int = 0,
    ) -> None:
        self._cache = cache
        # How long a read that does not use the cache keeps its record for
        # requests sent before it ended (ds:shared:); 0: not at all.
        self._share_ms = share_ms
        self._guard = guard
        self._controls = controls
        self._database_read = database_read
        self._bulk_read = bulk_read
        self._coalesce = config.coalesce
        self._lease_ms = config.lock_lease_ms
        self._ttl_ms = config.ttl_s * 1000
        self._lane = lane
        self._clock = clock

    def read(
        self,
        scope: str,
        object_id: str,
        fmt: CacheFormat | None,
        deadline_ms: int,
        issued_ms: int | None = None,
    ) -> pb.Record | None:
        """This process's miss of ``scope``/``object_id``: the record, or None.
        ``fmt`` None: a read that does not use the cache, which a record shared
        by a read that ended after ``issued_ms`` (when it was sent) answers."""
        followed = False
        try:
            while (left_ms := deadline_ms - self._clock() - ANSWER_MARGIN_MS) > 0:
                rollout = self._controls.current()
                step = self._lookup(scope, object_id, fmt, rollout.generation, left_ms, issued_ms)
                if isinstance(step, Hit):
                    return step.record
                if isinstance(step, Shared):
                    COALESCED.labels(self._lane, "replica").inc()
                    if step.word.absent or step.word.record is not None:
                        return step.word.record
                    continue
                if isinstance(step, Lead):
                    if followed:
                        TAKEOVERS.labels(self._lane).inc()
                    return self._lead(step, scope, object_id, fmt, rollout, deadline_ms)
                if step is None:
                    # An entry that does not decode: read; a fill replaces it.
                    return self._database_read(scope, object_id, deadline_ms)
                if not followed:
                    COALESCED.labels(self._lane, "replica").inc()
                    followed = True
                word = self._wait(step, scope, object_id, left_ms)
                if word is not None and word.absent:
                    return None
                if word is not None and word.record is not None:
                    return word.record
                # No word (the lease lapsed, or this deadline is near), or
                # 'retry': look again.
        except CacheDown:
            return self._database_read(scope, object_id, deadline_ms)
        raise CoalescedWaitExpired

    def read_many(
        self,
        keys: Sequence[tuple[str, str]],
        fmt: CacheFormat | None,
        deadline_ms: int,
        issued_ms: int | None = None,
    ) -> Found:
        """Misses of a read_many, coalesced as single misses are, a step for
        all of them at once: one round trip of lookups; the keys this replica
        leads read in bulk (:data:`BulkRead`) and their fills in one more round
        trip; each key another leader reads, waited for as a single read waits.
        With coalescing off the keys are read and filled without the locks."""
        rollout = self._controls.current()
        found: Found = {}
        if not self._coalesce:
            read = self._bulk_read(keys, deadline_ms)
            alone = [(key, b"", outcome) for key, outcome in read.items()]
            self._settle(alone, fmt, rollout, self._clock())
            return read
        lease_ms = max(10, min(self._lease_ms, deadline_ms - self._clock() - ANSWER_MARGIN_MS))
        try:
            with tracing.timed(cache_stage(fmt) if fmt is not None else Stage.COALESCING_WAIT):
                steps = self._guard(
                    lambda: self._cache.lookup_many(
                        fmt, keys, rollout.generation, lease_ms, issued_ms
                    )
                )
        except CacheDown:
            return self._bulk_read(keys, deadline_ms)
        leads: list[tuple[tuple[str, str], bytes]] = []
        follows: list[tuple[tuple[str, str], Follow]] = []
        started_ms = self._clock()
        for key, step in zip(keys, steps, strict=True):
            if isinstance(step, Hit):
                found[key] = step.record
            elif isinstance(step, Shared) and (step.word.absent or step.word.record is not None):
                found[key] = step.word.record
            elif isinstance(step, Shared):
                found[key] = self._followed(key, None, fmt, deadline_ms, issued_ms)
            elif isinstance(step, Lead):
                leads.append((key, step.token))
                started_ms = min(started_ms, step.started_ms)
            elif isinstance(step, Follow):
                follows.append((key, step))
            else:
                # An entry that does not decode: read without the lock; a
                # fill replaces it.
                leads.append((key, b""))
        if leads:
            read = self._bulk_read([key for key, _ in leads], deadline_ms)
            self._settle([(key, token, read[key]) for key, token in leads], fmt, rollout,
                         started_ms)  # fmt: skip
            found.update(read)
        if follows:
            COALESCED.labels(self._lane, "replica").inc(len(follows))
        for key, follow in follows:
            found[key] = self._followed(key, follow, fmt, deadline_ms, issued_ms)
        return found

    def _followed(
        self,
        key: tuple[str, str],
        follow: Follow | None,
        fmt: CacheFormat | None,
        deadline_ms: int,
        issued_ms: int | None,
    ) -> pb.Record | Refusal | None:
        """A follower's record in a read_many: its leader's word, else the key
        read as a single miss reads it (which may wait again, or lead)."""
        scope, object_id = key
        left_ms = deadline_ms - self._clock() - ANSWER_MARGIN_MS
        try:
            word = None
            if follow is not None and left_ms > 0:
                word = self._wait(follow, scope, object_id, left_ms)
            if word is not None and word.absent:
                return None
            if word is not None and word.record is not None:
                return word.record
            return self.read(scope, object_id, fmt, deadline_ms, issued_ms)
        except CacheDown:
            return self._bulk_read([key], deadline_ms)[key]
        except Refusal as refusal:
            return refusal

    def _settle(
        self,
        outcomes: Sequence[tuple[tuple[str, str], bytes, pb.Record | Refusal | None]],
        fmt: CacheFormat | None,
        rollout: Rollout,
        started_ms: int,
    ) -> None:
        """The leaders' fills and releases in one round trip (a read that did
        not use the cache fills nothing: its records go to its followers)."""
        formats = rollout.fill_formats() if fmt is not None else frozenset()
        shared = self._sharing(fmt)
        ends = [
            (scope, object_id, token, outcome)
            for (scope, object_id), token, outcome in outcomes
            if token or isinstance(outcome, pb.Record)
        ]
        if not ends:
            return
        with tracing.timed(cache_stage(fmt) if fmt is not None else Stage.COALESCING_WAIT):
            fills = self._quietly(
                lambda: self._cache.settle_many(
                    ends, formats, rollout.generation, started_ms, self._ttl_ms, shared
                )
            )
        if fmt is not None:
            for fill in fills if fills is not None else [None] * len(ends):
                if fill is not None or fills is None:
                    CACHE_FILLS.labels(self._lane, fill.outcome if fill else "error").inc()

    def read_alone(
        self, scope: str, object_id: str, fmt: CacheFormat | None, deadline_ms: int
    ) -> pb.Record | None:
        """A miss with coalescing off (``cache.coalesce: false``, the bench's
        baseline): it reads the database itself and fills without the lock. The
        entry's expiry counts from this worker's clock, as no lock gave Redis's."""
        if fmt is None:
            return self._database_read(scope, object_id, deadline_ms)
        alone = Lead(token=b"", started_ms=self._clock())
        return self._lead(alone, scope, object_id, fmt, self._controls.current(), deadline_ms)

    def _lookup(
        self,
        scope: str,
        object_id: str,
        fmt: CacheFormat | None,
        generation: int,
        left_ms: int,
        issued_ms: int | None,
    ) -> Hit | Shared | Lead | Follow | None:
        lease_ms = max(10, min(self._lease_ms, left_ms))
        with tracing.timed(cache_stage(fmt) if fmt is not None else Stage.COALESCING_WAIT):
            return self._guard(
                lambda: self._cache.lookup(fmt, scope, object_id, generation, lease_ms, issued_ms)
            )

    def _sharing(self, fmt: CacheFormat | None) -> Sharing | None:
        """What a leader keeps for requests sent before its read ended: only
        while the cache is not read (else its fill serves them)."""
        if fmt is not None or not self._share_ms:
            return None
        return Sharing(self._clock(), self._share_ms)

    def _wait(self, step: Follow, scope: str, object_id: str, left_ms: int) -> Word | None:
        wait_ms = min(step.lease_left_ms + _LEASE_SLACK_MS, left_ms)
        with tracing.timed(Stage.COALESCING_WAIT):
            return self._guard(
                lambda: self._cache.wait(scope, object_id, step.token, wait_ms / 1000)
            )

    def _lead(
        self,
        lead: Lead,
        scope: str,
        object_id: str,
        fmt: CacheFormat | None,
        rollout: Rollout,
        deadline_ms: int,
    ) -> pb.Record | None:
        try:
            record = self._database_read(scope, object_id, deadline_ms)
        except BaseException:
            self._quietly(lambda: self._cache.release(scope, object_id, lead.token, absent=False))
            raise
        shared = self._sharing(fmt)
        if record is None:
            self._quietly(
                lambda: self._cache.release(
                    scope, object_id, lead.token, absent=True, shared=shared
                )
            )
            return None
        # The generation it looked in: a rotation since leaves this fill in
        # the old namespace, where nobody reads it. A read that did not use the
        # cache fills nothing: its record only goes to its followers.
        formats = rollout.fill_formats() if fmt is not None else frozenset()
        with tracing.timed(cache_stage(fmt) if fmt is not None else Stage.COALESCING_WAIT):
            fill = self._quietly(
                lambda: self._cache.fill(
                    record,
                    formats,
                    scope,
                    rollout.generation,
                    lead.started_ms,
                    self._ttl_ms,
                    lead.token,
                    shared,
                )
            )
        if fmt is not None:
            CACHE_FILLS.labels(self._lane, fill.outcome if fill is not None else "error").inc()
        return record

    def _quietly(self, step: Callable[[], T]) -> T | None:
        """A leader's last word: tried even with the breaker open (followers
        wait for it); a failure costs the cache, never the answer."""
        try:
            return self._guard(step, probe=False)
        except CacheDown:
            return None
