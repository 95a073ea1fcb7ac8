"""What a scenario that reads through the cache adds to a run: the change
consumer, writers that go around the service, and the figures that say whether
the cache served and how far the change stream lagged.

- :func:`consumer_settings` and :func:`start_consumer`: the change consumer
  (``dataservice changes``) as a least-privilege user of its own, waited for
  until it holds the lease and reports.
- :class:`DirectWriter`: updates of the seeded records by direct SQL at a
  fixed rate, as the server's admin (never counted in the service's database
  share): changes the service never sees, which only the binlog reports.
- what the run watches meanwhile (:mod:`.streamwatch`): the consumer's lag
  and the replicas' cache hits.

:class:`StreamSide` puts them together for one run.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from dataservice.changes.server import admin_engine, check_server
from dataservice.changes.user import (
    DEFAULT_HOSTS,
    changes_url,
    create_changes_user,
    new_password,
)
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import BinlogSetupError, ServiceSetupError
from dataservice.ops.processes import WorkerProcess
from dataservice.redis.keys import CHANGES_STATUS_KEY
from dataservice_tools.loadtest.refill import RefillWatch
from dataservice_tools.loadtest.scenarios import Scenario
from dataservice_tools.loadtest.streamwatch import LagWatch, cache_reads, hit_ratio
from dataservice_tools.localservices import free_port

CONSUMER_READY_TIMEOUT_S = 30.0
_UPDATE = text(
    "UPDATE records SET revision = revision + 1, payload = :payload,"
    " updated_at = UTC_TIMESTAMP(6) WHERE scope = :scope AND object_id = :object_id"
)


def consumer_settings(
    settings: Settings, root_url: str, database: str, config: Config
) -> tuple[Settings, str]:
    """``settings`` with the consumer's own user on ``database`` (created, or
    given a fresh password) once the server is known to feed a change stream;
    and the user's name, for :func:`drop_consumer_user`."""
    admin = make_url(root_url).set(database=database).render_as_string(hide_password=False)
    # The server's settings first: no user is created on a server that has no binlog.
    _check(admin, config)
    user, password = f"{make_url(settings.database_url).username}_changes", new_password()
    create_changes_user(admin, user, password, database, hosts=_hosts(root_url))
    url = changes_url(admin, user, password)
    _check(url, config)
    return replace(settings, changes_database_url=url), user


def _hosts(root_url: str) -> tuple[str, ...]:
    # The consumer runs here: a remote server sees it from an address of this machine's.
    local = make_url(root_url).host in (None, "localhost", "127.0.0.1", "::1")
    return DEFAULT_HOSTS if local else ("%",)


def drop_consumer_user(root_url: str, user: str) -> None:
    """Its grants reach every schema's binlog: the account goes with the run."""
    engine = admin_engine(root_url)
    try:
        with engine.connect() as conn:
            for host in _hosts(root_url):
                conn.execute(text("DROP USER IF EXISTS :user@:host"), {"user": user, "host": host})
    finally:
        engine.dispose()


def _check(url: str, config: Config) -> None:
    try:
        check_server(url, replica_server_id=config.changes.server_id)
    except BinlogSetupError as exc:
        raise BinlogSetupError(
            f"{exc}\nA scenario that reads through the cache needs the change stream: "
            "run it on a server with a binlog: `make services` starts one and writes its "
            "URL to .state/services.env (`set -a; . .state/services.env` before the loadtest), "
            "or name one with --server.",
            exc.problems,
        ) from None


def start_consumer(settings: Settings, log_path: Path) -> WorkerProcess:
    """``dataservice changes`` with ``settings``, once it reports as the active consumer."""
    consumer = WorkerProcess.for_command(settings, log_path, "changes").start()
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=2)
    try:
        deadline = time.monotonic() + CONSUMER_READY_TIMEOUT_S
        while not client.exists(CHANGES_STATUS_KEY):
            consumer.check_alive()
            if time.monotonic() > deadline:
                raise ServiceSetupError(
                    f"the change consumer did not become active within "
                    f"{CONSUMER_READY_TIMEOUT_S:.0f} s; {log_path} ends:\n{consumer.log_tail()}"
                )
            time.sleep(0.05)
    except BaseException:
        consumer.stop()
        raise
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


class StreamSide:
    """What a run adds when its scenario reads through the cache (the
    consumer, the replicas' metrics endpoints, the lag watch) or writes around
    the service (the direct writer); :attr:`report` once :meth:`finish` ran."""

    def __init__(
        self, reads_cache: bool, direct_writes: float, log_dir: Path, refill: bool = False
    ) -> None:
        self.reads_cache, self._direct_writes, self._log_dir = reads_cache, direct_writes, log_dir
        self._refill = refill
        self._refill_watch: RefillWatch | None = None
        self.consumer: WorkerProcess | None = None
        self.ports: list[int] = []
        self.report: dict[str, Any] | None = None
        self._writer: DirectWriter | None = None
        self._watch: LagWatch | None = None
        self._reads_before: Counter[str] = Counter()
        self._user: tuple[str, str] | None = None  # (server, consumer's user) to drop

    @classmethod
    def of(cls, system: str, scenario: Scenario, log_dir: Path) -> StreamSide:
        """What ``scenario`` needs when run against ``system`` (the naive one reads no cache)."""
        reads = system == "service" and scenario.changes
        return cls(reads, scenario.direct_writes, log_dir, reads and scenario.rotate_at is not None)

    def replica_args(self) -> tuple[str, ...]:
        """A replica's extra arguments: a metrics port to scrape, when the cache is read."""
        if not self.reads_cache:
            return ()
        port = free_port()
        self.ports.append(port)
        return ("--metrics-port", str(port))

    def start_consumer(
        self, settings: Settings, config: Config, root_url: str, database: str
    ) -> None:
        if self.reads_cache:
            own, user = consumer_settings(settings, root_url, database, config)
            self._user = (root_url, user)
            self.consumer = start_consumer(own, self._log_dir / "changes.log")

    def begin(
        self,
        config: Config,
        redis_url: str,
        direct_url: str,
        scope: str,
        ids: Sequence[str],
        interactive_capacity: float,
        duration_s: float,
        t0: float,
    ) -> None:
        if self._direct_writes:
            rate = self._direct_writes * interactive_capacity
            self._writer = DirectWriter(direct_url, scope, ids, rate, duration_s, t0)
            self._writer.start()
        if self.reads_cache:
            self._reads_before = cache_reads(self.ports)
            self._watch = LagWatch(redis_url, config.changes.max_lag_s, t0)
            self._watch.start()
        if self._refill:
            self._refill_watch = RefillWatch(self.ports, t0)
            self._refill_watch.start()

    def finish(self, cold_at_s: float | None = None, duration_s: float = 0.0) -> None:
        """Wait for the direct writer's schedule to end, stop watching, sum up
        (the refill from ``cold_at_s``, when the cache went cold then)."""
        if self._writer is None and self._watch is None:
            return
        if self._writer is not None:
            self._writer.join()
        reads = cache_reads(self.ports)
        if self._watch is not None:
            self._watch.stop()
        self.report = {
            "direct_writes": self._writer.summary() if self._writer else None,
            "cache_reads": dict(reads - self._reads_before),
            "hit_ratio": hit_ratio(self._reads_before, reads),
            "consumer": self._watch.summary() if self._watch else None,
        }
        if self._refill_watch is not None:
            self._refill_watch.stop()
            self.report["refill"] = self._refill_watch.summary(cold_at_s, duration_s)
            self._refill_watch = None
        self._writer = self._watch = None

    def stop(self) -> None:
        if self.consumer is not None:
            self.consumer.stop()
        if self._user is not None:
            drop_consumer_user(*self._user)
            self._user = None
