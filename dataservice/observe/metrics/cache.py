"""The read cache's metrics: lookups, fills, coalescing, the breaker, the guard and
shadow comparisons."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from dataservice.observe.metrics.registry import REGISTRY

CACHE_READS = Counter(
    "dataservice_cache_reads",
    "Cache lookups of ALLOW_CACHED reads, by format and outcome.",
    ["lane", "format", "outcome"],
    registry=REGISTRY,
)
CACHE_FILLS = Counter(
    "dataservice_cache_fills",
    "Fills after a database read, by outcome.",
    ["lane", "outcome"],
    registry=REGISTRY,
)
COALESCED = Counter(
    "dataservice_coalesced",
    "Misses that waited for another read of the same key.",
    ["lane", "level"],
    registry=REGISTRY,
)
TAKEOVERS = Counter(
    "dataservice_lock_takeovers",
    "Coalescing followers that became leaders (their leader failed or its lease lapsed).",
    ["lane"],
    registry=REGISTRY,
)
BREAKER = Gauge(
    "dataservice_cache_breaker",
    "The cache's circuit breaker: 0 closed, 1 open, 2 half-open.",
    ["lane"],
    registry=REGISTRY,
)
FRESHNESS_GUARD = Gauge(
    "dataservice_freshness_guard",
    "1 while ALLOW_CACHED reads bypass the cache because the change stream lags or is gone.",
    ["lane"],
    registry=REGISTRY,
)
SHADOW = Counter(
    "dataservice_cache_shadow",
    "Shadow comparisons of cached records, by what they were compared with and the outcome.",
    ["lane", "against", "outcome"],
    registry=REGISTRY,
)
SHADOW_DATABASE_SECONDS = Counter(
    "dataservice_cache_shadow_database_seconds",
    "Time shadow comparisons held a permit reading the database.",
    ["lane"],
    registry=REGISTRY,
)
