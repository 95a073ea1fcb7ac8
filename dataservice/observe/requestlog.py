"""A request's end: its histogram, and its log line.

One line per request answered or dropped (``logging.requests``: ``all``,
``failures`` for anything but OK, or ``none``), carrying the request id, the
caller, the lane, the operation, the status (and the refusal's reason), and
the time per stage and in all. Never a payload, a scope, a record id or a
key: the fields are built here, from a closed list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Set
from typing import Literal

from prometheus_client import Histogram

from dataservice.observe.lines import RequestLines
from dataservice.observe.logs import json_line, request_lines
from dataservice.observe.metrics.requests import REQUEST_SECONDS
from dataservice.observe.trace import Trace

log = logging.getLogger("dataservice.requests")

Mode = Literal["all", "failures", "none"]
# Status of a request dropped without an answer (late at dequeue, or a replay).
DROPPED = "DROPPED"
# A caller name is only trusted once verified; an unverified one is cut short.
_MAX_CALLER = 64


class RequestLog:
    def __init__(
        self, lane: str, mode: Mode, operations: Set[str], lines: RequestLines | None = None
    ) -> None:
        """``operations``: what a request's operation may be; any other is
        logged and measured as ``unknown`` (the metric's labels stay few,
        whatever a message says)."""
        self._lane = lane
        self._mode = mode
        self._operations = operations
        # None: wherever configure_logging sends them when a request ends.
        self._lines = lines
        self._histograms: dict[str, Histogram] = {}

    def finish(
        self, trace: Trace, status: str, reason: str = "", elapsed_s: float | None = None
    ) -> None:
        """``elapsed_s``: the trace's time, when the caller has just measured it."""
        elapsed_s = trace.elapsed_s() if elapsed_s is None else elapsed_s
        operation = trace.operation if trace.operation in self._operations else "unknown"
        histogram = self._histograms.get(operation)
        if histogram is None:
            histogram = self._histograms[operation] = REQUEST_SECONDS.labels(self._lane, operation)
        histogram.observe(elapsed_s)
        if self._mode == "none" or (self._mode == "failures" and status == "OK"):
            return
        if not log.isEnabledFor(logging.INFO):
            return
        fields = {
            "request_id": trace.request_id,
            "caller": trace.caller[:_MAX_CALLER],
            "lane": self._lane,
            "operation": operation,
            "status": status,
            "reason": reason,
            "stages_ms": {stage: round(ms, 3) for stage, ms in trace.stages.items()},
            "total_ms": round(elapsed_s * 1000, 3),
        }
        lines = self._lines or request_lines()
        if lines is None:
            log.info("request", extra={"fields": fields})
            return
        # The line JsonFormatter would write, without a record and a handler per request.
        lines.write(json_line(time.time(), "INFO", log.name, "request", fields))
