"""The change consumer's metrics (``dataservice changes --metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from dataservice.observe.metrics.registry import REGISTRY

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
