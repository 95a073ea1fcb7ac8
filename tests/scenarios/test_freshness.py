"""Freshness under load, at reduced size: the run of ``bench/freshness.py``
(:mod:`dataservice_tools.testkit.freshness`) is the ``cached`` loadtest
scenario (reads ``ALLOW_CACHED``, writes through the service and by direct
SQL, the change consumer running) with its checker: the consumer healthy, then
paused mid-run, then absent with the guard off (the control, where the checker
must find stale reads)."""

from __future__ import annotations

from pathlib import Path

import pytest
from dataservice_tools.localservices import redis_reachable
from dataservice_tools.testkit import freshness

from tests.conftest import SHIPPED_CONFIG, require

REDIS_DB = 13

# The consumer is stopped (SIGSTOP) mid-run on purpose.
pytestmark = [pytest.mark.load, pytest.mark.fault]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cached_reader_never_sees_a_revision_older_than_the_lag_bound_allows(
    tmp_path: Path,
) -> None:
    require(redis_reachable(f"redis://127.0.0.1:6379/{REDIS_DB}"), "Redis at 127.0.0.1:6379")
    options = freshness.Options(
        base_config=SHIPPED_CONFIG,
        # A lag bound of 3 s (bound 4 s with the controls' age) instead of the
        # shipped 5: the pause's thirds need only be past it by a second.
        duration=15.3,
        max_lag_s=3.0,
        replicas=1,
        records=100,
        rate=100.0,
        probes=20.0,
        offsets=(0.0, 0.2),
        redis_db=REDIS_DB,
        out=tmp_path,
        min_checks=30,
    )
    result = freshness.run(options)

    assert result["problems"] == [], result["problems"]
    stream, paused = result["with_change_stream"], result["stream_paused"]
    bound = result["setup"]["bound_key"]
    for phase in (stream, paused):
        assert phase["violations"] == [], phase["violations"]
        assert phase["by_offset_s"][bound].get("fresh", 0) >= 30, phase["by_offset_s"]
    # The reads were served by the cache, and others wrote around the service.
    assert stream["changes"]["hit_ratio"] > 0.5
    assert stream["changes"]["direct_writes"]["ok"] > 0
    assert stream["changes"]["consumer"]["missing"] == 0
    assert stream["changes"]["consumer"]["guard_engaged_share"] == 0
    # Paused, the consumer went quiet and the guard held the cache closed meanwhile.
    assert paused["changes"]["consumer"]["missing"] > 0
    # Without the stream the same checker sees stale reads: it can tell.
    assert result["stale_at_bound"]["control"] > 0
