"""What happened to requests: answers, refusals, timeouts, failed dependencies,
and where their time went (a histogram per stage)."""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import Counter, Histogram

from dataservice.enums import CacheFormat
from dataservice.observe.metrics.registry import REGISTRY


class TimeoutStage(StrEnum):
    """Where a request ran out of time (``dataservice_timeouts_total``)."""

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


class Stage(StrEnum):
    """A timed stage of the request path (``dataservice_stage_seconds``)."""

    # From the caller's signature (its publish, through admission) to the dequeue.
    ADMISSION_WAIT = "admission_wait"
    # The caller-limits script, when no cache lookup rides in it.
    GATE = "gate"
    PERMIT_WAIT = "permit_wait"
    CONNECTION_ACQUIRE = "connection_acquire"
    # From the connection in hand to the operation's last statement done.
    SQL = "sql"
    # A cache lookup in that format (on the consumer thread it rides in the
    # caller-limits script, so it includes them).
    CACHE_V1 = "cache_v1"
    CACHE_V2 = "cache_v2"
    # A miss waiting for another read of the same key (a thread or a replica).
    COALESCING_WAIT = "coalescing_wait"
    # Encoding the answer (a cache hit answered by its script encodes nothing).
    ENCODE = "encode"


def cache_stage(fmt: CacheFormat) -> Stage:
    """The stage a cache command of a read in ``fmt`` is timed under."""
    return Stage.CACHE_V1 if fmt is CacheFormat.V1 else Stage.CACHE_V2


# 100 µs (a Redis round trip) to 10 s (past any interactive deadline).
SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

REQUESTS = Counter(
    "dataservice_requests",
    "Answers given, by lane, operation and status code.",
    ["lane", "operation", "code"],
    registry=REGISTRY,
)
REJECTIONS = Counter(
    "dataservice_rejections",
    "Requests refused by a check, or retryably on the way to the database, by reason.",
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
STAGE_SECONDS = Histogram(
    "dataservice_stage_seconds",
    "Time requests spent in each stage of the request path.",
    ["lane", "stage"],
    buckets=SECONDS_BUCKETS,
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "dataservice_request_seconds",
    "Time from a request's dequeue to its answer (or drop), by operation.",
    ["lane", "operation"],
    buckets=SECONDS_BUCKETS,
    registry=REGISTRY,
)
