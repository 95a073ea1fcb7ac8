"""The service's metrics, in Prometheus form: one registry per process.

- :mod:`.requests`: answers by status code, refusals by reason, timeouts by
  stage, failed dependencies, and a histogram per stage of the request path
  (:class:`Stage`) and of the whole request.
- :mod:`.gauges`: what a worker holds (permits, database connections, new
  connections, the cache's rollout) and what waits for it (each lane's queue:
  messages, bytes, drain rate, refusals at publish; read from the broker).
- :mod:`.cache`: lookups, fills, coalescing, the breaker, the freshness guard.
- :mod:`.changes`: the change consumer's lease, lag and work.

``docs/operations.md`` ("Metrics") has the table, pinned to this registry by a
test. Labels are drawn from closed sets: never a caller's key, a payload, a
scope or a record id. Each worker (``dataservice worker --metrics-port``) and
each change consumer (``dataservice changes --metrics-port``) is a scrape
target of its own.
"""

from __future__ import annotations

from dataservice.observe.metrics.cache import (
    BREAKER,
    CACHE_FILLS,
    CACHE_READS,
    COALESCED,
    FRESHNESS_GUARD,
    SHADOW,
    SHADOW_DATABASE_SECONDS,
    TAKEOVERS,
)
from dataservice.observe.metrics.changes import (
    CHANGES_ACTIVE,
    CHANGES_INVALIDATED,
    CHANGES_LAG,
    CHANGES_LAG_BYTES,
    CHANGES_LAG_EVENTS,
    CHANGES_TRANSACTIONS,
)
from dataservice.observe.metrics.gauges import (
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
from dataservice.observe.metrics.registry import REGISTRY, serve
from dataservice.observe.metrics.requests import (
    DEPENDENCY_FAILURES,
    REJECTIONS,
    REQUEST_SECONDS,
    REQUESTS,
    STAGE_SECONDS,
    TIMEOUTS,
    Dependency,
    Stage,
    TimeoutStage,
)

__all__ = [
    "BREAKER",
    "CACHE_BYPASS",
    "CACHE_FILLS",
    "CACHE_GENERATION",
    "CACHE_READS",
    "CACHE_READ_PERCENT",
    "CHANGES_ACTIVE",
    "CHANGES_INVALIDATED",
    "CHANGES_LAG",
    "CHANGES_LAG_BYTES",
    "CHANGES_LAG_EVENTS",
    "CHANGES_TRANSACTIONS",
    "COALESCED",
    "CONNECTIONS_OPENED",
    "DB_CONNECTIONS",
    "DEPENDENCY_FAILURES",
    "FRESHNESS_GUARD",
    "PERMITS_CAPACITY",
    "PERMITS_HELD",
    "PERMITS_IN_CUSTODY",
    "PERMITS_IN_USE",
    "QUEUES",
    "REGISTRY",
    "REJECTIONS",
    "REQUESTS",
    "REQUEST_SECONDS",
    "SHADOW",
    "SHADOW_DATABASE_SECONDS",
    "STAGE_SECONDS",
    "TAKEOVERS",
    "TIMEOUTS",
    "Dependency",
    "QueueWatch",
    "Stage",
    "TimeoutStage",
    "serve",
]
