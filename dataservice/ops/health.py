"""Health: liveness that never touches the database, and deep readiness that does.

Whatever evicts or restarts a process on a failed check (a load balancer, an
orchestrator, a compose healthcheck) must ask only *liveness*: is this
process's loop turning (its alive file is fresh, ``dataservice/worker/alive.py``) and
does its broker answer. A slow or stopped database then costs refusals and
timeouts, which the permits and deadlines bound, and never the fleet: checks
that tested the database once failed on every server at the same moment and
took a whole fleet down (``docs/operations.md``, "Health"). *Deep readiness*
adds the database, the cache's Redis and the change stream, for people and
dashboards.

Each check says what it found in words fit for a log: hosts, ports and
error text, never a password or a key.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from dataservice.broker import broker_for
from dataservice.cache.guard import stream_status
from dataservice.changes.behind import describe_events, describe_lag
from dataservice.changes.server import describe, reason
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.redis import endpoints, where
from dataservice.redis.bounded import QUIET
from dataservice.redis.keys import CHANGES_FRESH_KEY


class HealthExit(IntEnum):
    """``dataservice health``'s exit status."""

    OK = 0
    NOT_LIVE = 1  # the broker does not answer, or an alive file is missing or stale
    USAGE = 2  # bad arguments or configuration: nothing was checked
    NOT_READY = 3  # (--deep) live, but a dependency fails


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str


def liveness(
    settings: Settings, alive_files: Iterable[Path], max_age_s: float, timeout_s: float
) -> list[Check]:
    """The broker answers, and every alive file was touched within ``max_age_s``."""
    checks = [_broker(settings, timeout_s)]
    checks.extend(_alive(path, max_age_s) for path in alive_files)
    return checks


def readiness(settings: Settings, config: Config, timeout_s: float) -> list[Check]:
    """The cache's Redis, the database and the change stream."""
    cache = _redis("cache", settings.redis_url, timeout_s)
    stream = _stream(settings.redis_url, config, timeout_s) if cache.ok else None
    checks = [cache, _database(settings.database_url, timeout_s)]
    return [*checks, stream] if stream is not None else checks


def exit_status(live: list[Check], ready: list[Check]) -> HealthExit:
    if not all(check.ok for check in live):
        return HealthExit.NOT_LIVE
    if not all(check.ok for check in ready):
        return HealthExit.NOT_READY
    return HealthExit.OK


def _client(url: str, timeout_s: float) -> redis.Redis:
    return endpoints.client(
        url,
        **QUIET,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


def _redis(name: str, url: str, timeout_s: float) -> Check:
    client = _client(url, timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        return Check(name, False, f"Redis at {where(url)}: {type(exc).__name__}")
    finally:
        client.close()
    return Check(name, True, f"Redis at {where(url)} answers")


def _broker(settings: Settings, timeout_s: float) -> Check:
    broker = broker_for(settings)
    failure = broker.unreachable(timeout_s)
    if failure:
        return Check("broker", False, f"{broker.where()}: {failure}")
    return Check("broker", True, f"{broker.where()} answers")


def _alive(path: Path, max_age_s: float) -> Check:
    name = f"alive {path}"
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return Check(name, False, "missing: the process never started its loop, or gone")
    if age > max_age_s:
        return Check(name, False, f"last touched {age:.1f} s ago (over {max_age_s:g} s)")
    return Check(name, True, f"touched {age:.1f} s ago")


def _database(url: str, timeout_s: float) -> Check:
    target = make_url(url)
    whole = max(1, round(timeout_s))
    engine = create_engine(
        target,
        poolclass=NullPool,
        hide_parameters=True,
        connect_args={"connect_timeout": whole, "read_timeout": whole},
    )
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except DBAPIError as exc:
        return Check("database", False, f"{describe(target)}: {reason(exc)}")
    finally:
        engine.dispose()
    return Check("database", True, f"{describe(target)} answers")


def _stream(url: str, config: Config, timeout_s: float) -> Check:
    if not config.changes.guard:
        return Check("change stream", True, "not relied on (changes.guard: false)")
    client = _client(url, timeout_s)
    try:
        status = stream_status(client)
        fresh = bool(client.exists(CHANGES_FRESH_KEY))
    except redis.RedisError as exc:
        return Check("change stream", False, f"status unreadable: {type(exc).__name__}")
    finally:
        client.close()
    if status is None:
        return Check(
            "change stream", False, "no consumer has reported: cached reads go to the database"
        )
    lag = describe_lag(float(status.get("lag_s", "-1")))
    behind = f"{lag}, {describe_events(int(status.get('lag_events', '-1')))} behind"
    if not fresh:
        return Check(
            "change stream",
            False,
            f"{behind}: over changes.max_lag_s, cached reads go to the database",
        )
    return Check("change stream", True, behind)
