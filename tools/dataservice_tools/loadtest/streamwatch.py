"""What a run that reads through the cache watches while its load runs.

- :class:`LagWatch`: the consumer's status (lag in seconds, events and bytes
  behind) sampled from Redis, as the workers' freshness guard reads it.
- :func:`cache_reads`: the replicas' cache lookups by outcome, scraped from
  their metrics endpoints. A hit ratio near zero would mean the run never read
  the cache at all, whatever its freshness figures say.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import redis

from dataservice.cache.guard import stream_status
from dataservice.observe.metrics.endpoint import scrape_port

_CACHE_READS_TOTAL = "dataservice_cache_reads_total"


class LagWatch:
    """The consumer's status hash every ``every_s`` from ``t0``: a missing hash
    is a missing consumer, as the freshness guard sees it."""

    def __init__(self, redis_url: str, max_lag_s: float, t0: float, every_s: float = 0.25) -> None:
        self._client = redis.Redis.from_url(redis_url, socket_timeout=2)
        self._max_lag_s, self._t0, self._every_s = max_lag_s, t0, every_s
        self.samples: list[tuple[float, dict[str, float] | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lag-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                raw = stream_status(self._client) or {}
            except redis.RedisError:
                continue
            status = {k: float(v) for k, v in raw.items() if k.startswith("lag_")}
            self.samples.append((time.monotonic() - self._t0, status or None))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def summary(self) -> dict[str, Any]:
        seen = [s for _, s in self.samples if s is not None]
        engaged = sum(1 for s in (s for _, s in self.samples) if _engaged(s, self._max_lag_s))
        figures: dict[str, Any] = {
            "samples": len(self.samples),
            "missing": len(self.samples) - len(seen),
        }
        for name in sorted({k for s in seen for k in s}):
            values = [s[name] for s in seen if name in s]
            figures[f"{name}_max"] = max(values)
        figures["guard_engaged_share"] = (
            round(engaged / len(self.samples), 4) if self.samples else None
        )
        return figures


def _engaged(status: dict[str, float] | None, max_lag_s: float) -> bool:
    return status is None or not 0 <= status.get("lag_s", 0.0) <= max_lag_s


def cache_reads(ports: Iterable[int]) -> Counter[str]:
    """Cache lookups by outcome (``hit``, ``miss``) summed over the replicas
    listening on ``ports``; one that does not answer adds ``unreachable``."""
    totals: Counter[str] = Counter()
    for port in ports:
        samples = scrape_port(port)
        if samples is None:
            totals["unreachable"] += 1
            continue
        for sample in samples:
            if sample.name == _CACHE_READS_TOTAL:
                totals[sample.labels["outcome"]] += int(sample.value)
    return totals


def hit_ratio(before: Counter[str], after: Counter[str]) -> float | None:
    hits = after["hit"] - before["hit"]
    lookups = hits + after["miss"] - before["miss"]
    return round(hits / lookups, 4) if lookups else None
