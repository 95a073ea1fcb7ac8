"""A Sentinel-managed Redis from the one redis-server binary, and what a
failover does to what the service keeps there: the promoted replica carries
every key (an epoch kept in Redis does not change), its run id is its own
(an epoch the new primary cannot inherit), and it has no scripts loaded (the
EVAL fallback reloads them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices.sentinel import SentinelGroup
from redis.sentinel import Sentinel

pytestmark = pytest.mark.fault


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    with SentinelGroup(tmp_path) as started:
        yield started


def test_a_killed_primary_is_replaced_by_its_replica_with_every_key_and_another_run_id(
    group: SentinelGroup,
) -> None:
    sentinel = Sentinel([("127.0.0.1", group.sentinel_port)], socket_timeout=1)
    primary = sentinel.master_for(group.name, socket_timeout=1)
    primary.set("ds:epoch", "first-life")
    sha = primary.script_load("return 1")
    before = primary.info("server")["run_id"]
    # Replicated before the kill: no write window is lost here.
    assert primary.wait(1, 2000) == 1
    old_port = group.primary_port()
    assert old_port is not None
    group.kill_primary()
    new_port = group.wait_promoted(old_port)
    promoted = redis.Redis(host="127.0.0.1", port=new_port, socket_timeout=1)
    try:
        assert promoted.get("ds:epoch") == b"first-life"
        assert promoted.info("server")["run_id"] != before
        assert promoted.script_exists(sha) == [False]
    finally:
        promoted.close()
    # redis-py's Sentinel client finds the new primary by itself.
    again = sentinel.master_for(group.name, socket_timeout=1)
    assert again.get("ds:epoch") == b"first-life"
    assert again.info("server")["tcp_port"] == new_port
