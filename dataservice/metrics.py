"""The worker's counters, in Prometheus form, kept apart by what went wrong.

- ``dataservice_requests_total{lane, operation, code}``: every answer given.
- ``dataservice_rejections_total{lane, reason}``: refused before any work
  (authentication, permissions, replay, rate, in-flight cap); the reasons
  are :class:`~dataservice.refusals.Reason`.
- ``dataservice_timeouts_total{lane, stage}``: ran out of time, by where:
  ``queue`` (late at dequeue: dropped unanswered), ``before_database`` (too
  little time left to run), ``statement`` (the statement timeout fired).
- ``dataservice_dependency_failures_total{lane, dependency}``: ``database``,
  ``limits`` (the gate fell back to this replica's share) and ``results``
  (an answer could not be stored).

Labels are drawn from closed sets: never a caller's key, payload, scope or id.
``dataservice worker --metrics-port`` serves them over HTTP.
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, start_http_server

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


class Stage(StrEnum):
    QUEUE = "queue"
    BEFORE_DATABASE = "before_database"
    STATEMENT = "statement"


class Dependency(StrEnum):
    DATABASE = "database"
    LIMITS = "limits"
    RESULTS = "results"


def serve(port: int, address: str = "127.0.0.1") -> None:
    """Expose the counters at ``http://address:port/metrics`` (a daemon thread)."""
    start_http_server(port, addr=address, registry=REGISTRY)
