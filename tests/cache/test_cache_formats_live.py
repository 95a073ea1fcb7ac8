"""The cache's formats against a real worker: with the rollout filling and
reading v1 only, v2 only, or both, a record written through the client reads
back exactly through ``ALLOW_CACHED``, the read after the first is served from
the cache, and Redis holds the enabled formats only, each at the database's
revision.

The in-process interactive worker serves Redis db 15. The controls are changed
there as an operator changes them (``RolloutControls.change``), and the test
waits ``cache.controls_max_age_ms`` for the worker to act on them. Whether a
read came from the cache is the database's word: its user statistics count
every statement the service's user runs, and a hit runs none.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import Client
from dataservice.cache.controls import RolloutControls
from dataservice.config.model import Config
from dataservice.enums import CacheFormat
from tests.harness.livecache import (
    Statements,
    cached,
    cached_formats,
    in_database,
    restore_defaults,
    revision_in_database,
    settle,
)
from tests.harness.support import counter

V1, V2 = CacheFormat.V1, CacheFormat.V2
WHO = "test-cache-formats"
# Every byte value, so that v1's base64 and v2's bytes field both carry them all.
PAYLOAD = bytes(range(256)) * 3
# ':' and '/' are allowed in an id; the scope before it in a key can hold neither.
OBJECT_ID = "orders/2026:07+a=b"


@dataclass(frozen=True)
class Variant:
    fill: frozenset[CacheFormat]
    # Read in turn: the first read misses and fills, every later one hits.
    reads: tuple[CacheFormat, ...]


VARIANTS = {
    "v1-only": Variant(frozenset({V1}), (V1,)),
    "v2-only": Variant(frozenset({V2}), (V2,)),
    "dual": Variant(frozenset({V1, V2}), (V1, V2)),
}


@pytest.fixture
def controls(
    interactive_worker: Any, redis_client: redis.Redis, config: Config
) -> Iterator[RolloutControls]:
    """The worker's controls, back to queues.yml's after the test (and before
    it, should an earlier test have left any)."""
    restore_defaults(redis_client, config)
    yield RolloutControls(redis_client, config.cache)
    restore_defaults(redis_client, config)


def _hits(fmt: CacheFormat) -> float:
    return counter("dataservice_cache_reads", lane="interactive", format=fmt.value, outcome="hit")


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_a_written_record_reads_back_exactly_and_then_from_the_enabled_formats(
    variant: Variant,
    controls: RolloutControls,
    client: Client,
    redis_client: redis.Redis,
    database: Engine,
    config: Config,
    scope: str,
) -> None:
    change = controls.change(
        WHO, fill=variant.fill, read=variant.reads[0], percent=100, bypass=False
    )
    generation = change.after.generation
    settle(config)
    statements = Statements(database)

    written = client.write(scope, OBJECT_ID, PAYLOAD)
    expected = in_database(database, scope, OBJECT_ID)
    assert (expected.revision, expected.payload) == (written.revision, PAYLOAD)
    # The write dropped whatever was cached; nothing is filled until a read.
    assert cached_formats(redis_client, scope, OBJECT_ID, generation) == set()

    statements.since()
    assert client.read(scope, OBJECT_ID) == expected
    assert statements.since() > 0, "the first read missed: it read the database"
    for n, fmt in enumerate(variant.reads):
        if n:
            controls.change(WHO, read=fmt)
            settle(config)
            statements.since()
        hits = _hits(fmt)
        assert client.read(scope, OBJECT_ID) == expected
        assert statements.since() == 0, f"a {fmt.value} read after the fill ran SQL"
        # Counted on the worker's consumer thread just after the answer went out,
        # so the caller can hold the answer a moment before the counter moves.
        eventually(lambda: _hits(fmt) > hits, timeout=2)  # noqa: B023
        assert _hits(fmt) == hits + 1

    assert cached_formats(redis_client, scope, OBJECT_ID, generation) == variant.fill
    revision = revision_in_database(database, scope, OBJECT_ID)
    for fmt in variant.fill:
        entry = cached(redis_client, fmt, scope, OBJECT_ID, generation)
        assert entry == expected
        assert entry is not None
        assert entry.revision == revision


def test_a_rewrite_is_read_back_at_its_new_revision_in_every_enabled_format(
    controls: RolloutControls,
    client: Client,
    redis_client: redis.Redis,
    database: Engine,
    config: Config,
    scope: str,
) -> None:
    both = frozenset({V1, V2})
    generation = controls.change(WHO, fill=both, read=V1, percent=100).after.generation
    settle(config)
    client.write(scope, OBJECT_ID, b"first")
    client.read(scope, OBJECT_ID)
    assert cached_formats(redis_client, scope, OBJECT_ID, generation) == both

    second = client.write(scope, OBJECT_ID, b"second")
    assert cached_formats(redis_client, scope, OBJECT_ID, generation) == set()
    expected = in_database(database, scope, OBJECT_ID)
    assert (expected.revision, expected.payload) == (second.revision, b"second")
    assert client.read(scope, OBJECT_ID) == expected
    revision = revision_in_database(database, scope, OBJECT_ID)
    for fmt in both:
        entry = cached(redis_client, fmt, scope, OBJECT_ID, generation)
        assert entry == expected
        assert entry is not None
        assert entry.revision == revision == second.revision
