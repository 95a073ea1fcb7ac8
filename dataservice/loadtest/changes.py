"""What a scenario that reads through the cache adds to a run: the change
consumer, writers that go around the service, and the figures that say whether
the cache served and how far the change stream lagged.

- :func:`consumer_settings` and :func:`start_consumer`: the change consumer
  (``dataservice changes``) as a least-privilege user of its own, waited for
  until it holds the lease and reports.
- :class:`DirectWriter`: updates of the seeded records by direct SQL at a
  fixed rate, as the server's admin (never counted in the service's database
  share): changes the service never sees, which only the binlog reports.
- :class:`LagWatch`: the consumer's status (lag in seconds, and events behind
  where it reports them) sampled from Redis, as the workers' freshness guard
  reads it.
- :func:`cache_reads`: the replicas' cache lookups by outcome, scraped from
  their metrics endpoints. A hit ratio near zero would mean the run never read
  the cache at all, whatever its freshness figures say.
"""

from __future__ import annotations

import os
import random
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from dataservice.cache.guard import stream_status
from dataservice.changes.server import check_server
from dataservice.changes.user import changes_url, create_changes_user, new_password
from dataservice.config import Config
from dataservice.errors import BinlogSetupError, ServiceSetupError
from dataservice.keys import CHANGES_STATUS_KEY
from dataservice.processes import WorkerProcess, dataservice_argv, worker_environ
from dataservice.settings import Settings

CONSUMER_READY_TIMEOUT_S = 30.0
_UPDATE = text(
    "UPDATE records SET revision = revision + 1, payload = :payload,"
    " updated_at = UTC_TIMESTAMP(6) WHERE scope = :scope AND object_id = :object_id"
)
_CACHE_READS = "dataservice_cache_reads"


def consumer_settings(settings: Settings, root_url: str, database: str, config: Config) -> Settings:
    """``settings`` with the consumer's own user on ``database`` (created, or
    given a fresh password) once the server is known to feed a change stream."""
    admin = make_url(root_url).set(database=database).render_as_string(hide_password=False)
    # The server's settings first: no user is created on a server that has no binlog.
    _check(admin, config)
    user, password = f"{make_url(settings.database_url).username}_changes", new_password()
    create_changes_user(admin, user, password, database)
    url = changes_url(admin, user, password)
    _check(url, config)
    return replace(settings, changes_database_url=url)


def _check(url: str, config: Config) -> None:
    try:
        check_server(url, replica_server_id=config.changes.server_id)
    except BinlogSetupError as exc:
        raise BinlogSetupError(
            f"{exc}\nA scenario that reads through the cache needs the change stream: "
            "run it on a server with a binlog (`make services` starts one and writes its "
            "URL to .state/services.env).",
            exc.problems,
        ) from None


def start_consumer(settings: Settings, log_path: Path) -> WorkerProcess:
    """``dataservice changes`` with ``settings``, once it reports as the active consumer."""
    consumer = WorkerProcess(
        dataservice_argv("changes"), worker_environ(settings), log_path, "changes"
    ).start()
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=2)
    try:
        deadline = time.monotonic() + CONSUMER_READY_TIMEOUT_S
        while not client.exists(CHANGES_STATUS_KEY):
            consumer.check_alive()
            if time.monotonic() > deadline:
                consumer.stop()
                raise ServiceSetupError(
                    f"the change consumer did not become active within "
                    f"{CONSUMER_READY_TIMEOUT_S:.0f} s; {log_path} ends:\n{consumer.log_tail()}"
                )
            time.sleep(0.05)
    finally:
        client.close()
    return consumer


class DirectWriter:
    """``rate`` updates a second of random ``ids`` in ``scope`` from ``t0``
    for ``duration_s``, one at a time, each its own transaction."""

    def __init__(
        self,
        url: str,
        scope: str,
        ids: Sequence[str],
        rate: float,
        duration_s: float,
        t0: float,
    ) -> None:
        self._engine = create_engine(url, pool_size=1, max_overflow=0, pool_pre_ping=True)
        self._scope, self._ids, self._rate = scope, ids, rate
        self._duration_s, self._t0 = duration_s, t0
        self.ok = 0
        self.errors: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name="direct-writer", daemon=True)

    def start(self) -> None:
        if self._rate > 0:
            self._thread.start()

    def _run(self) -> None:
        rng = random.Random()
        at = 0.0
        while at < self._duration_s:
            delay = self._t0 + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            row = {
                "scope": self._scope,
                "object_id": rng.choice(self._ids),
                "payload": os.urandom(64),
            }
            try:
                with self._engine.begin() as conn:
                    conn.execute(_UPDATE, row)
                self.ok += 1
            except DBAPIError as exc:
                self.errors[type(exc.orig).__name__] += 1
            at += 1.0 / self._rate

    def join(self) -> None:
        if self._thread.is_alive():
            self._thread.join()
        self._engine.dispose()

    def summary(self) -> dict[str, Any]:
        return {"per_s": round(self._rate, 1), "ok": self.ok, "errors": dict(self.errors)}


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
    return status is None or status.get("lag_s", 0.0) > max_lag_s


def cache_reads(ports: Iterable[int]) -> Counter[str]:
    """Cache lookups by outcome (``hit``, ``miss``) summed over the replicas
    listening on ``ports``; one that does not answer adds ``unreachable``."""
    totals: Counter[str] = Counter()
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as page:
                body = page.read().decode()
        except OSError:
            totals["unreachable"] += 1
            continue
        for family in text_string_to_metric_families(body):
            if family.name != _CACHE_READS:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    totals[sample.labels["outcome"]] += int(sample.value)
    return totals


def hit_ratio(before: Counter[str], after: Counter[str]) -> float | None:
    hits = after["hit"] - before["hit"]
    lookups = hits + after["miss"] - before["miss"]
    return round(hits / lookups, 4) if lookups else None
