"""`python -m dataservice_tools.localservices cells` (`make cells`): three cells'
Redis, cell a Sentinel-managed, and the cells file that names them; found
running the second time; stopped by `down`."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml
from dataservice_tools.localservices.cells import cells_down, cells_up
from dataservice_tools.localservices.probes import redis_reachable

from dataservice.redis.endpoints import SentinelTarget

pytestmark = pytest.mark.fault


def test_three_cells_start_once_answer_and_stop(tmp_path: Path) -> None:
    try:
        cells_file, started = cells_up(tmp_path)
        assert started
        assert stat.S_IMODE(cells_file.stat().st_mode) == 0o600
        cells = yaml.safe_load(cells_file.read_text())["cells"]
        assert sorted(cells) == ["a", "b", "c"]
        target = SentinelTarget.parse(cells["a"]["redis_url"])
        assert len(target.sentinels) == 3
        assert all(redis_reachable(entry["redis_url"]) for entry in cells.values())
        # Running already: the same cells, nothing started.
        again, started = cells_up(tmp_path)
        assert (again, started) == (cells_file, False)
        assert yaml.safe_load(again.read_text())["cells"] == cells
    finally:
        stopped = cells_down(tmp_path)
    assert stopped
    assert not any(redis_reachable(entry["redis_url"]) for entry in cells.values())
