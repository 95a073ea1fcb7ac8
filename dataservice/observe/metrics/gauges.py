"""What a worker process holds and what waits for it, read when scraped.

Permits, database connections and the cache's rollout are this process's
own; the queues (messages waiting, bytes admitted, drain rate, refusals at
publish) belong to the whole service and are read from the broker, so every
worker reports the same figure for every lane: aggregate them with ``max by
(lane)``, never ``sum``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import redis
from prometheus_client import Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dataservice.observe.metrics.registry import REGISTRY
from dataservice.redis.keys import admission_key
from dataservice.refusals import ADMISSION_REASONS

PERMITS_IN_USE = Gauge(
    "dataservice_permits_in_use",
    "Database permits held now in this process (each one an operation in the database).",
    ["lane"],
    registry=REGISTRY,
)
PERMITS_IN_CUSTODY = Gauge(
    "dataservice_permits_in_custody",
    "Of the permits in use, those held for a statement the database has not yet "
    "confirmed gone (its connection was lost before the server answered).",
    ["lane"],
    registry=REGISTRY,
)
PERMITS_HELD = Counter(
    "dataservice_permits_held_seconds",
    "Seconds database permits were held in this process, summed over permits "
    "(its rate over the capacity is how busy the permits were).",
    ["lane"],
    registry=REGISTRY,
)
PERMITS_CAPACITY = Gauge(
    "dataservice_permits_capacity",
    "Database permits this process may hold (lanes.<lane>.permits).",
    ["lane"],
    registry=REGISTRY,
)
DB_CONNECTIONS = Gauge(
    "dataservice_db_connections",
    "Database connections of this process's pool: held by an operation, idle in the pool, "
    "or let go of and in custody until the server confirms them gone.",
    ["lane", "state"],
    registry=REGISTRY,
)
CONNECTIONS_OPENED = Counter(
    "dataservice_db_connections_opened",
    "New database connections this process opened (after a reconnect: the ramp).",
    ["lane"],
    registry=REGISTRY,
)
CACHE_READ_PERCENT = Gauge(
    "dataservice_cache_read_percent",
    "Share of ALLOW_CACHED reads that look in the cache under the rollout controls "
    "(0 while no format is read or the cache is bypassed).",
    ["lane"],
    registry=REGISTRY,
)
CACHE_GENERATION = Gauge(
    "dataservice_cache_generation",
    "The cache namespace generation this replica reads and fills.",
    ["lane"],
    registry=REGISTRY,
)
CACHE_BYPASS = Gauge(
    "dataservice_cache_bypass",
    "1 while the rollout controls send every read to the database.",
    ["lane"],
    registry=REGISTRY,
)


class QueueDepths(Protocol):
    """How many messages wait in a queue, on a broker whose queues are not
    Redis lists."""

    def depth(self, queue: str) -> int: ...


@dataclass(frozen=True, slots=True)
class QueueWatch:
    """Where the lanes' queues and admission hashes are: lane -> queue name.

    ``books`` is the Redis of admission's hashes; the queues are its lists,
    unless ``depths`` counts them elsewhere (RabbitMQ). ``errors``: what the
    two raise when their server does not answer, which leaves the queues out
    of the scrape (``depths``' own errors added to redis-py's)."""

    books: redis.Redis
    queues: Mapping[str, str]
    depths: QueueDepths | None = None
    errors: tuple[type[BaseException], ...] = (redis.RedisError,)


class QueueCollector(Collector):
    """The lanes' queues as the broker holds them, read once per scrape (one
    pipeline); nothing while no worker has said where they are, or while the
    broker does not answer (the scrape goes on without them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watch: QueueWatch | None = None

    def watch(self, watch: QueueWatch) -> None:
        with self._lock:
            self._watch = watch

    def unwatch(self, watch: QueueWatch) -> None:
        """Forget ``watch``, unless another has taken its place since."""
        with self._lock:
            if self._watch is watch:
                self._watch = None

    def collect(self) -> Iterator[Metric]:
        messages = GaugeMetricFamily(
            "dataservice_queue_messages", "Messages waiting in the lane's queue.", labels=["lane"]
        )
        queued_bytes = GaugeMetricFamily(
            "dataservice_queue_bytes",
            "Envelope bytes admitted to the lane and not yet completed (waiting or in flight).",
            labels=["lane"],
        )
        drain = GaugeMetricFamily(
            "dataservice_queue_drain_rate",
            "Completions per second the lane drained while its queue was busy (admission's "
            "measurement).",
            labels=["lane"],
        )
        refusals = CounterMetricFamily(
            "dataservice_admission_refusals",
            "Publishes refused by admission, by reason (counted in Redis; they restart from 0 "
            "when a lane's admission hash lapses after a long idle spell).",
            labels=["lane", "reason"],
        )
        for lane, depth, fields in self._read():
            messages.add_metric([lane], depth)
            queued_bytes.add_metric([lane], max(_number(fields[0]), 0.0))
            drain.add_metric([lane], _number(fields[1]))
            for reason, count in zip(ADMISSION_REASONS, fields[2:], strict=True):
                refusals.add_metric([lane, reason.value], _number(count))
        yield from (messages, queued_bytes, drain, refusals)

    def _read(self) -> list[tuple[str, int, list[bytes | None]]]:
        with self._lock:
            watch = self._watch
        if watch is None:
            return []
        fields = ["bytes", "rate", *(refused_field(r.value) for r in ADMISSION_REASONS)]
        try:
            with watch.books.pipeline(transaction=False) as pipe:
                for queue in watch.queues.values():
                    if watch.depths is None:
                        pipe.llen(queue)
                    pipe.hmget(admission_key(queue), fields)
                replies = pipe.execute()
            if watch.depths is None:
                depths = [int(n) for n in replies[0::2]]
                books = replies[1::2]
            else:
                depths = [watch.depths.depth(queue) for queue in watch.queues.values()]
                books = replies
        except watch.errors:
            return []
        return [
            (lane, depth, list(hash_fields))
            for lane, depth, hash_fields in zip(watch.queues, depths, books, strict=True)
        ]


def refused_field(reason: str) -> str:
    """The admission hash's field counting refusals for ``reason`` (``admit.lua``)."""
    return f"refused:{reason}"


def _number(value: bytes | None) -> float:
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


QUEUES = QueueCollector()
REGISTRY.register(QUEUES)
