"""Shadow comparisons: a sample of cache hits checked against the database.

For the ``shadow`` percentage of ``ALLOW_CACHED`` hits (a rollout control,
``dataservice cache shadow``), the replica that served the hit reads the same
record from the database and compares normalized fields (revision, payload,
update time), never serialized bytes: two encoders may spell the same record
differently. When both formats are filled, the entry in the other format is
compared the same way. The caller's answer never waits for either.

The database cost is bounded and never taken around the budget: at most
``cache.shadow.max_inflight`` comparisons run at once in a replica, each one
reads under a point-read permit of its lane only if one is free at that
moment, and under its own short deadline (``cache.shadow.timeout_ms``). A hit
sampled when neither is free is skipped and counted, never queued. Mutations
are never compared.

Counts go to the cache's Redis (:data:`~dataservice.redis.keys.SHADOW_KEY`, summed
over the replicas, shown by ``dataservice cache status``) and to the
``dataservice_cache_shadow`` metric. The outcomes (``docs/cache.md``,
"Shadow comparisons"): :class:`Outcome`.
"""

from __future__ import annotations

import collections
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from dataservice.cache.rollout import Rollout
from dataservice.cache.store import CacheStore
from dataservice.codec import record_to_pb
from dataservice.config.cache import ShadowConfig
from dataservice.enums import CacheFormat, OperationClass
from dataservice.limits.permits import LanePermits
from dataservice.observe.metrics import SHADOW, SHADOW_DATABASE_SECONDS
from dataservice.proto import pb
from dataservice.redis.keys import SHADOW_KEY
from dataservice.store import Bounds, RecordStore
from dataservice.store.connections import now_ms

log = logging.getLogger(__name__)

# A worker with nothing to compare still writes its counts within this.
FLUSH_S = 1.0


class Against(enum.StrEnum):
    """What a cached record is compared with."""

    DATABASE = "database"  # the record read from the database now
    FORMATS = "formats"  # the same record's entry in the other format


class Outcome(enum.StrEnum):
    MATCH = "match"  # same revision, payload and update time
    BEHIND = "behind"  # the cache holds an older revision: an invalidation not yet applied
    AHEAD = "ahead"  # the cache holds a newer revision than what it is compared with
    PAYLOAD = "payload"  # same revision, different payload: the entry is wrong
    UPDATED_AT = "updated_at"  # same revision and payload, different update time
    DELETED = "deleted"  # cached, but the database has no such record
    ABSENT = "absent"  # formats: the other format holds no entry (not a mismatch)
    SKIPPED_BUSY = "skipped_busy"  # every comparison slot of the replica was in use
    SKIPPED_PERMITS = "skipped_permits"  # no point-read permit of the lane was free
    FAILED = "failed"  # the database or the cache's Redis failed the comparison's read


MISMATCHES = frozenset(
    {Outcome.BEHIND, Outcome.AHEAD, Outcome.PAYLOAD, Outcome.UPDATED_AT, Outcome.DELETED}
)


def field(against: Against, outcome: Outcome) -> str:
    """The counts hash's field for one kind of comparison's outcome."""
    return f"{against.value}:{outcome.value}"


# The counts hash's total database time of comparisons (ms).
DATABASE_MS_FIELD = "database:ms"


def compare(cached: pb.Record, actual: pb.Record | None) -> Outcome:
    """How ``cached`` stands against ``actual`` (None: no such record), field by field."""
    if actual is None:
        return Outcome.DELETED
    if cached.revision != actual.revision:
        return Outcome.BEHIND if cached.revision < actual.revision else Outcome.AHEAD
    if cached.payload != actual.payload:
        return Outcome.PAYLOAD
    if cached.updated_at_unix_ms != actual.updated_at_unix_ms:
        return Outcome.UPDATED_AT
    return Outcome.MATCH


@dataclass(frozen=True, slots=True)
class Sample:
    """One sampled hit: the record as served, and where else to look for it."""

    scope: str
    object_id: str
    record: pb.Record
    other: CacheFormat | None  # the other filled format, to compare with too
    generation: int


class ShadowComparisons:
    """One lane's comparisons in one worker process (threads start with the first sample)."""

    def __init__(
        self,
        config: ShadowConfig,
        permits: LanePermits,
        store: RecordStore,
        cache: CacheStore,
        counts: redis.Redis,
        lane: str,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._config = config
        self._permits = permits
        self._store = store
        self._cache = cache
        self._counts_redis = counts
        self._lane = lane
        self._clock = clock
        self._slots = threading.BoundedSemaphore(config.max_inflight)
        self._samples: queue.SimpleQueue[Sample] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Counted here, written to Redis by a comparing thread (never the caller's).
        self._pending: collections.Counter[str] = collections.Counter()
        self._started = False

    def offer(
        self,
        rollout: Rollout,
        fmt: CacheFormat,
        scope: str,
        object_id: str,
        record: pb.Record,
        request_id: str,
    ) -> None:
        """A hit of ``fmt``, served: compared in the background if the rollout
        samples it and a slot is free; a skip is counted if none is."""
        if not rollout.shadowed(request_id):
            return
        filled = rollout.fill_formats()
        other = next((f for f in filled if f is not fmt), None) if fmt in filled else None
        sample = Sample(scope, object_id, record, other, rollout.generation)
        if not self._slots.acquire(blocking=False):
            self._count(Against.DATABASE, Outcome.SKIPPED_BUSY)
            return
        self._start()
        self._samples.put(sample)

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
        for n in range(self._config.max_inflight):
            name = f"shadow-{self._lane}-{n}"
            threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        flushed = time.monotonic()
        while True:
            try:
                sample = self._samples.get(timeout=FLUSH_S)
            except queue.Empty:
                sample = None
            if sample is not None:
                try:
                    self._compare(sample)
                finally:
                    self._slots.release()
            if sample is not None or time.monotonic() - flushed >= FLUSH_S:
                self._flush()
                flushed = time.monotonic()

    def _compare(self, sample: Sample) -> None:
        self._against_database(sample)
        if sample.other is not None:
            try:
                other = self._cache.get(
                    sample.other, sample.scope, sample.object_id, sample.generation
                )
            except redis.RedisError as exc:
                log.warning("shadow: the other format's entry: %s", type(exc).__name__)
                self._count(Against.FORMATS, Outcome.FAILED)
            else:
                outcome = Outcome.ABSENT if other is None else compare(sample.record, other)
                self._count(Against.FORMATS, outcome)

    def _against_database(self, sample: Sample) -> None:
        with self._permits.try_acquire(OperationClass.POINT_READ) as permit:
            if permit is None:
                self._count(Against.DATABASE, Outcome.SKIPPED_PERMITS)
                return
            deadline_ms = self._clock() + self._config.timeout_ms
            started = time.monotonic()
            try:
                actual = self._store.read(
                    sample.scope, sample.object_id, Bounds(permit, deadline_ms, deadline_ms)
                )
            # Whatever the read raised, the comparison is lost and the thread
            # goes on; the type is logged, never a record's bytes.
            except Exception as exc:
                log.warning("shadow: the database read failed: %s", type(exc).__name__)
                self._count(Against.DATABASE, Outcome.FAILED)
                return
            finally:
                elapsed = time.monotonic() - started
                SHADOW_DATABASE_SECONDS.labels(self._lane).inc(elapsed)
                with self._lock:
                    self._pending[DATABASE_MS_FIELD] += round(elapsed * 1000)
        outcome = compare(sample.record, record_to_pb(actual) if actual is not None else None)
        self._count(Against.DATABASE, outcome)

    def _count(self, against: Against, outcome: Outcome) -> None:
        SHADOW.labels(self._lane, against.value, outcome.value).inc()
        with self._lock:
            self._pending[field(against, outcome)] += 1

    def _flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, collections.Counter()
        if not pending:
            return
        try:
            with self._counts_redis.pipeline(transaction=False) as pipe:
                for name, delta in pending.items():
                    pipe.hincrby(SHADOW_KEY, name, delta)
                pipe.execute()
        except redis.RedisError as exc:
            # Kept for the next flush: a count is late rather than lost.
            with self._lock:
                self._pending.update(pending)
            log.warning("shadow: counts not written: %s", type(exc).__name__)


def read_counts(client: redis.Redis) -> dict[str, int]:
    """The counts hash, summed over every replica (``dataservice cache status``)."""
    raw: dict[bytes, bytes] = client.hgetall(SHADOW_KEY)  # type: ignore[assignment]
    return {key.decode(): int(value) for key, value in raw.items()}


def describe_counts(counts: dict[str, int]) -> list[str]:
    """One line per kind of comparison, as ``dataservice cache status`` prints them."""
    lines = []
    for against in Against:
        of = {o: counts.get(field(against, o), 0) for o in Outcome}
        compared = sum(n for o, n in of.items() if not o.startswith("skipped") and o != "failed")
        skipped = of[Outcome.SKIPPED_BUSY] + of[Outcome.SKIPPED_PERMITS]
        mismatched = sum(of[o] for o in MISMATCHES)
        kinds = ", ".join(f"{of[o]} {o.value}" for o in Outcome if o in MISMATCHES and of[o])
        text = f"{against.value}: {compared} compared, {of[Outcome.MATCH]} matched, "
        text += f"{mismatched} mismatch{'es' if mismatched != 1 else ''}"
        text += f" ({kinds})" if kinds else ""
        if against is Against.FORMATS:
            text += f", {of[Outcome.ABSENT]} with no entry in the other format"
        text += f"; {skipped} skipped"
        if skipped:
            text += f" ({of[Outcome.SKIPPED_PERMITS]} no free permit, "
            text += f"{of[Outcome.SKIPPED_BUSY]} no free slot)"
        text += f"; {of[Outcome.FAILED]} failed"
        if against is Against.DATABASE:
            text += f"; {counts.get(DATABASE_MS_FIELD, 0) / 1000:.1f} s holding permits"
        lines.append(text)
    return lines
