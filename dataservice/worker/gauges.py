"""Where a worker's gauges read from when they are scraped
(:mod:`dataservice.observe.metrics.gauges`): its permits, its pool, its rollout
controls and the broker's queues."""

from __future__ import annotations

from typing import Any

import redis
from sqlalchemy import Engine, event
from sqlalchemy.pool import QueuePool

from dataservice.broker import Broker
from dataservice.cache.controls import RolloutControls
from dataservice.config.model import Config
from dataservice.enums import LaneName
from dataservice.limits.permits import LanePermits
from dataservice.observe.metrics import (
    CACHE_BYPASS,
    CACHE_GENERATION,
    CACHE_READ_PERCENT,
    CONNECTIONS_OPENED,
    DB_CONNECTIONS,
    PERMITS_CAPACITY,
    PERMITS_HELD,
    PERMITS_IN_CUSTODY,
    PERMITS_IN_USE,
    QUEUES,
    QueueWatch,
)
from dataservice.store.custody import custody_of


class LaneGauges:
    """One lane runtime's gauges, attached while it runs."""

    def __init__(
        self,
        lane: LaneName,
        config: Config,
        permits: LanePermits,
        engine: Engine,
        controls: RolloutControls,
        books: redis.Redis,
        broker: Broker,
        timeout_s: float,
    ) -> None:
        """``books``: admission's Redis (the broker's, or on RabbitMQ the result
        backend's), a client with short timeouts (a scrape must not wait on a
        Redis that stalls: the queues are left out instead), its owner's;
        ``broker`` counts the queues when they are not its lists, within
        ``timeout_s``."""
        name = lane.value
        PERMITS_IN_USE.labels(name).set_function(lambda: permits.snapshot().in_use)
        PERMITS_IN_CUSTODY.labels(name).set_function(lambda: permits.snapshot().in_custody)
        permits.on_released = PERMITS_HELD.labels(name).inc
        PERMITS_CAPACITY.labels(name).set(permits.capacity)
        pool = engine.pool
        if isinstance(pool, QueuePool):
            DB_CONNECTIONS.labels(name, "held").set_function(pool.checkedout)
            DB_CONNECTIONS.labels(name, "idle").set_function(pool.checkedin)
        custody = custody_of(engine)
        if custody is not None:
            DB_CONNECTIONS.labels(name, "custody").set_function(lambda: custody.snapshot().held)
        opened = CONNECTIONS_OPENED.labels(name)

        def _opened(dbapi_connection: Any, record: Any) -> None:
            opened.inc()

        event.listen(engine, "connect", _opened)
        CACHE_READ_PERCENT.labels(name).set_function(lambda: controls.current().read_percent)
        CACHE_GENERATION.labels(name).set_function(lambda: controls.current().generation)
        CACHE_BYPASS.labels(name).set_function(lambda: int(controls.current().bypass))
        self._depths = broker.depths_elsewhere(timeout_s)
        self._watch = QueueWatch(
            books,
            {lane.value: config.lanes[lane].queue for lane in LaneName},
            self._depths,
            # A broker that does not answer leaves the queues out of the scrape.
            (redis.RedisError, *broker.errors),
        )
        QUEUES.watch(self._watch)

    def close(self) -> None:
        QUEUES.unwatch(self._watch)
        if self._depths is not None:
            self._depths.close()
