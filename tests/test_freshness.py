"""Freshness under load, at reduced size: ``bench/freshness.py`` runs the
``cached`` loadtest scenario (reads ``ALLOW_CACHED``, writes through the
service and by direct SQL, the change consumer running) with its checker,
then the same load without the change stream as the control."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import freshness
from dataservice.localservices import redis_reachable
from tests.conftest import require

REDIS_DB = 13


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_cached_reader_never_sees_a_revision_older_than_the_lag_bound_allows(
    tmp_path: Path,
) -> None:
    require(redis_reachable(f"redis://127.0.0.1:6379/{REDIS_DB}"), "Redis at 127.0.0.1:6379")
    args = argparse.Namespace(
        duration=12.0,
        replicas=1,
        records=100,
        rate=100.0,
        probes=20.0,
        offsets=[0.0, 0.2],
        redis_db=REDIS_DB,
        out=tmp_path,
    )
    result = freshness.run(args)

    stream, control = result["with_change_stream"], result["control_without_stream"]
    bound = f"{result['setup']['bound_s']:g}"
    assert result["violations"] == 0, stream["violations"]
    checked = stream["by_offset_s"][bound]
    assert checked.get("fresh", 0) >= 50, checked
    # The reads were served by the cache, and others wrote around the service.
    assert stream["changes"]["hit_ratio"] > 0.5
    assert stream["changes"]["direct_writes"]["ok"] > 0
    assert stream["changes"]["consumer"]["missing"] == 0
    assert stream["changes"]["consumer"]["guard_engaged_share"] == 0
    # Without the stream the same checker sees stale reads: it can tell.
    assert control["by_offset_s"][bound].get("stale", 0) > 0, control["by_offset_s"]
