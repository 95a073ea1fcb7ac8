"""A miss, coalesced across replicas: one leader per key reads, the rest wait.

``docs/cache.md`` ("A read", steps 4-7) is the protocol; the scripts are
``lookup.lua``, ``fill.lua`` and ``release.lua``. Only the leader holds a
database permit. A follower waits for the leader's word by a blocking pop,
each until its own deadline, and never reads the database on its own: when
its wait ends without a record it looks again (the entry, the lock, or a new
leader), and at its deadline it answers :class:`CoalescedWaitExpired`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from dataservice.cache.breaker import CacheDown, Guard
from dataservice.cache.config import CacheConfig
from dataservice.cache.controls import Rollout, RolloutControls
from dataservice.cache.store import CacheStore, Follow, Hit, Lead, Word
from dataservice.enums import CacheFormat
from dataservice.metrics import CACHE_FILLS, COALESCED, TAKEOVERS, Stage
from dataservice.metrics.requests import cache_stage
from dataservice.observe import trace as tracing
from dataservice.proto import pb
from dataservice.store.connections import now_ms
from dataservice.worker.failures import CoalescedWaitExpired

T = TypeVar("T")
# What a follower keeps back from its deadline to get its answer out in time.
ANSWER_MARGIN_MS = 5
# A follower waits a little past the leader's lease before it looks again.
_LEASE_SLACK_MS = 20

DatabaseRead = Callable[[str, str, int], "pb.Record | None"]


class ReplicaCoalescing:
    def __init__(
        self,
        cache: CacheStore,
        guard: Guard,
        controls: RolloutControls,
        database_read: DatabaseRead,
        config: CacheConfig,
        lane: str,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._cache = cache
        self._guard = guard
        self._controls = controls
        self._database_read = database_read
        self._lease_ms = config.lock_lease_ms
        self._ttl_ms = config.ttl_s * 1000
        self._lane = lane
        self._clock = clock

    def read(
        self, scope: str, object_id: str, fmt: CacheFormat, deadline_ms: int
    ) -> pb.Record | None:
        """This process's miss of ``scope``/``object_id``: the record, or None."""
        followed = False
        try:
            while (left_ms := deadline_ms - self._clock() - ANSWER_MARGIN_MS) > 0:
                rollout = self._controls.current()
                step = self._lookup(scope, object_id, fmt, rollout.generation, left_ms)
                if isinstance(step, Hit):
                    return step.record
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

    def read_alone(
        self, scope: str, object_id: str, fmt: CacheFormat, deadline_ms: int
    ) -> pb.Record | None:
        """A miss with coalescing off (``cache.coalesce: false``, the bench's
        baseline): it reads the database itself and fills without the lock. The
        entry's expiry counts from this worker's clock, as no lock gave Redis's."""
        alone = Lead(token=b"", started_ms=self._clock())
        return self._lead(alone, scope, object_id, fmt, self._controls.current(), deadline_ms)

    def _lookup(
        self, scope: str, object_id: str, fmt: CacheFormat, generation: int, left_ms: int
    ) -> Hit | Lead | Follow | None:
        lease_ms = max(10, min(self._lease_ms, left_ms))
        with tracing.timed(cache_stage(fmt)):
            return self._guard(
                lambda: self._cache.lookup(fmt, scope, object_id, generation, lease_ms)
            )

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
        fmt: CacheFormat,
        rollout: Rollout,
        deadline_ms: int,
    ) -> pb.Record | None:
        try:
            record = self._database_read(scope, object_id, deadline_ms)
        except BaseException:
            self._quietly(lambda: self._cache.release(scope, object_id, lead.token, absent=False))
            raise
        if record is None:
            self._quietly(lambda: self._cache.release(scope, object_id, lead.token, absent=True))
            return None
        # The generation it looked in: a rotation since leaves this fill in
        # the old namespace, where nobody reads it.
        with tracing.timed(cache_stage(fmt)):
            fill = self._quietly(
                lambda: self._cache.fill(
                    record,
                    rollout.fill_formats(),
                    scope,
                    rollout.generation,
                    lead.started_ms,
                    self._ttl_ms,
                    lead.token,
                )
            )
        CACHE_FILLS.labels(self._lane, fill.outcome if fill is not None else "error").inc()
        return record

    def _quietly(self, step: Callable[[], T]) -> T | None:
        """A leader's last word: tried even with the breaker open (followers
        wait for it); a failure costs the cache, never the answer."""
        try:
            return self._guard(step, probe=False)
        except CacheDown:
            return None
