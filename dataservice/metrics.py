"""The worker's counters, in Prometheus form, kept apart by what went wrong.

- ``dataservice_requests_total{lane, operation, code}``: every answer given.
- ``dataservice_rejections_total{lane, reason}``: refused before any work
  (authentication, permissions, replay, rate, in-flight cap); the reasons
  are :class:`~dataservice.refusals.Reason`.
- ``dataservice_timeouts_total{lane, stage}``: ran out of time, by where:
  ``queue`` (late at dequeue: dropped unanswered), ``before_database`` (too
  little time left to run), ``statement`` (the statement timeout fired).
- ``dataservice_dependency_failures_total{lane, dependency}``: ``database``,
  ``limits`` (the gate fell back to this replica's share), ``results``
  (an answer could not be stored) and ``cache`` (a cache command failed).
- ``dataservice_cache_reads_total{lane, format, outcome}``: ``hit`` or ``miss``.
- ``dataservice_cache_fills_total{lane, outcome}``: ``filled``, ``late``
  (dropped: its read began too long ago), ``stale`` (dropped: a change left a
  newer revision), ``error``.
- ``dataservice_coalesced_total{lane, level}``: misses that waited for another
  read instead of reading: ``process`` (a thread of the same worker) or
  ``replica`` (another worker's lock).
- ``dataservice_lock_takeovers_total{lane}``: followers that became leaders.
- ``dataservice_cache_breaker{lane}``: 0 closed, 1 open, 2 half-open.
- ``dataservice_freshness_guard{lane}``: 1 while the change stream lags (or
  is gone) and ``ALLOW_CACHED`` reads go to the database, else 0.
- The change consumer's (``dataservice changes --metrics-port``):
  ``dataservice_changes_active`` (1 while it holds the lease),
  ``dataservice_changes_lag_seconds``, ``dataservice_changes_lag_events`` and
  ``dataservice_changes_lag_bytes`` (behind the server's binlog; -1 unknown),
  ``dataservice_changes_transactions_total`` and
  ``dataservice_changes_invalidated_total`` (cache entries deleted).

Labels are drawn from closed sets: never a caller's key, payload, scope or id.
``dataservice worker --metrics-port`` serves them over HTTP.
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter(
    "dataservice_requests",
    "Answers given, by lane, operation and status code.",
    ["lane", "operation", "code"],
    registry=REGISTRY,
)
REJECTIONS = Counter(
    "dataservice_rejections",
    "Requests refused before any cache or database work, by reason.",
    ["lane", "reason"],
    registry=REGISTRY,
)
TIMEOUTS = Counter(
    "dataservice_timeouts",
    "Requests that ran out of time, by the stage they reached.",
    ["lane", "stage"],
    registry=REGISTRY,
)
DEPENDENCY_FAILURES = Counter(
    "dataservice_dependency_failures",
    "Failures of a dependency while serving requests.",
    ["lane", "dependency"],
    registry=REGISTRY,
)
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
CHANGES_ACTIVE = Gauge(
    "dataservice_changes_active",
    "1 while this change consumer holds the lease and applies invalidations.",
    registry=REGISTRY,
)
CHANGES_LAG = Gauge(
    "dataservice_changes_lag_seconds",
    "Seconds since the commit of the binlog transaction the consumer last read, while behind; "
    "-1 until it can tell.",
    registry=REGISTRY,
)
CHANGES_LAG_EVENTS = Gauge(
    "dataservice_changes_lag_events",
    "Binlog events between the consumer's position and the server's end, counted up to a cap "
    "(a figure at the cap means at least that many); -1 while unknown.",
    registry=REGISTRY,
)
CHANGES_LAG_BYTES = Gauge(
    "dataservice_changes_lag_bytes",
    "Binlog bytes between the consumer's position and the server's end; -1 while unknown.",
    registry=REGISTRY,
)
# Unknown until a consumer has asked the server: 0 would read as caught up.
CHANGES_LAG_EVENTS.set(-1)
CHANGES_LAG_BYTES.set(-1)
CHANGES_TRANSACTIONS = Counter(
    "dataservice_changes_transactions",
    "Binlog transactions that changed records, applied to the cache.",
    registry=REGISTRY,
)
CHANGES_INVALIDATED = Counter(
    "dataservice_changes_invalidated",
    "Cache entries the change consumer deleted.",
    registry=REGISTRY,
)


class Stage(StrEnum):
    QUEUE = "queue"
    BEFORE_DATABASE = "before_database"
    STATEMENT = "statement"
    # A coalescing follower's deadline came before its leader's record.
    COALESCING = "coalescing"


class Dependency(StrEnum):
    DATABASE = "database"
    LIMITS = "limits"
    RESULTS = "results"
    CACHE = "cache"


def serve(port: int, address: str = "127.0.0.1") -> None:
    """Expose the counters at ``http://address:port/metrics`` (a daemon thread)."""
    start_http_server(port, addr=address, registry=REGISTRY)
