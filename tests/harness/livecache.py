"""What the cache's tests against real workers share: the entries as Redis
holds them, the record as the database holds it, and the wait for every
replica to act on a change to the rollout controls."""

from __future__ import annotations

import time
from datetime import UTC

import redis
from sqlalchemy import Engine, text

from dataservice.cache.formats import CODECS, unframe
from dataservice.codec import record_from_pb, record_to_pb
from dataservice.config.model import Config
from dataservice.enums import CacheFormat
from dataservice.observe.metrics import REGISTRY
from dataservice.redis.keys import (
    AUDIT_KEY,
    ROLLOUT_KEY,
    filled_key,
    lock_key,
    lockwait_key,
    record_key,
    tombstone_key,
)
from dataservice.types import Record
from tests.conftest import SERVICE_USER
from tests.harness.support import scraped, statements_by

# A replica re-reads the controls on its first read after its copy is this
# old; a little more, so that the read after the wait is surely a fresh one.
_SETTLE_SLACK_S = 0.1


def settle(config: Config) -> None:
    """Until every replica acts on the controls now in Redis: each keeps its
    copy for ``cache.controls_max_age_ms``."""
    time.sleep(config.cache.controls_max_age_ms / 1000 + _SETTLE_SLACK_S)


def restore_defaults(client: redis.Redis, config: Config) -> None:
    """Back to queues.yml's rollout (nothing in Redis), acted on by every replica."""
    if client.delete(ROLLOUT_KEY, AUDIT_KEY):
        settle(config)


def cached(
    client: redis.Redis, fmt: CacheFormat, scope: str, object_id: str, generation: int
) -> Record | None:
    """The record cached in ``fmt`` and ``generation``; None if there is no entry.
    An entry whose frame and body disagree on the revision fails the test."""
    value = client.get(record_key(fmt.value, scope, object_id, generation))
    if value is None:
        return None
    assert isinstance(value, bytes)
    framed = unframe(value)
    assert framed is not None, f"{fmt.value} entry of {scope}/{object_id} is not framed"
    revision, body = framed
    record = CODECS[fmt].decode(body)
    assert record.revision == revision, f"{fmt.value} frame says {revision}"
    return record_from_pb(record)


def cached_formats(
    client: redis.Redis, scope: str, object_id: str, generation: int
) -> set[CacheFormat]:
    """The formats with an entry for the record in ``generation``."""
    return {
        fmt
        for fmt in CacheFormat
        if client.exists(record_key(fmt.value, scope, object_id, generation))
    }


def cache_keys(scope: str, object_id: str, generation: int) -> list[bytes]:
    """Every key the cache keeps for one record: its entries in ``generation``,
    its tombstone, and its coalescing lock, waiters and words."""
    entries = [record_key(fmt.value, scope, object_id, generation) for fmt in CacheFormat]
    rest = [tombstone_key, lock_key, lockwait_key, filled_key]
    return [key.encode() for key in entries + [f(scope, object_id) for f in rest]]


def touching(commands: list[bytes], keys: list[bytes]) -> list[bytes]:
    """The commands (as ``RedisWatch`` saw them) that name any of ``keys``."""
    return [command for command in commands if any(key in command for key in keys)]


def in_database(engine: Engine, scope: str, object_id: str) -> Record:
    """The record as the database holds it, asked as root, at the wire's precision (ms)."""
    query = text(
        "SELECT object_id, revision, payload, updated_at FROM records"
        " WHERE scope = :scope AND object_id = :object_id"
    )
    with engine.connect() as conn:
        row = conn.execute(query, {"scope": scope, "object_id": object_id}).one()
    # DATETIME holds UTC without a zone.
    record = Record(row[0], int(row[1]), bytes(row[2]), row[3].replace(tzinfo=UTC))
    return record_from_pb(record_to_pb(record))


def revision_in_database(engine: Engine, scope: str, object_id: str) -> int:
    query = text("SELECT revision FROM records WHERE scope = :scope AND object_id = :object_id")
    with engine.connect() as conn:
        return int(conn.execute(query, {"scope": scope, "object_id": object_id}).scalar_one())


class Statements:
    """Statements the service's database user has run since the last look.

    The server counts them itself (``USER_STATISTICS``), so a read answered
    from the cache shows as none at all, whatever the service believes."""

    def __init__(self, engine: Engine, user: str = SERVICE_USER) -> None:
        self._engine = engine
        self._user = user
        self._seen = statements_by(engine, user)

    def since(self) -> int:
        """How many ran since the last call (or since this was made)."""
        now = statements_by(self._engine, self._user)
        ran, self._seen = now - self._seen, now
        return ran


def cache_lookups() -> float:
    """Cache lookups of this process's workers, every lane, format and outcome."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name == "dataservice_cache_reads"
        for sample in metric.samples
        if sample.name == "dataservice_cache_reads_total"
    )


def served_lookups(port: int, *outcomes: str) -> float:
    """Cache lookups a worker process counted (its ``--metrics-port``), any
    format, with one of ``outcomes`` (``hit``, ``miss``)."""
    return sum(
        scraped(port, "dataservice_cache_reads", lane="interactive", format=fmt.value, outcome=o)
        for fmt in CacheFormat
        for o in outcomes
    )
