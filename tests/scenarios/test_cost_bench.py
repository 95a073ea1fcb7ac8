"""``python -m bench.cost --quick`` counts every request kind in both phases.

Only the report's shape, the methods' own checks and that each figure was
measured are asserted; what the figures say is the bench's to show
(bench/RESULTS.md), never a test's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dataservice_tools.localservices import mysql_reachable

from tests.conftest import require

pytestmark = pytest.mark.load

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"cached read", "PRIMARY read", "read_many", "write", "submit_many"}
LANE_WORKER = {"interactive": "interactive worker", "batch": "batch worker"}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_quick_run_counts_every_kind_in_both_phases(tmp_path: Path) -> None:
    require(mysql_reachable("127.0.0.1", 3306), "MariaDB at 127.0.0.1:3306")
    # The bench runs a redis-server of its own, and reads sockets with ss.
    require(shutil.which("redis-server") is not None, "redis-server")
    require(shutil.which("ss") is not None, "ss")
    out = tmp_path / "cost.json"
    finished = subprocess.run(
        [sys.executable, "-m", "bench.cost", "--quick", "--json", str(out)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    report = json.loads(out.read_text())

    checks = report["checks"]
    assert checks["script_calls_counted"], checks
    assert checks["segments_hold"], checks
    assert len(report["phases"]) == 2
    for phase, kinds in report["phases"].items():
        assert set(kinds) == KINDS, phase
        for kind, r in kinds.items():
            where = (phase, kind)
            assert r["requests"] > 0, where
            assert r["errors"] == 0, (where, r["first_error"])
            assert r["commands"] > 0, where
            assert r["segments"]["caller"] > 0, where
            worker = LANE_WORKER[report["kinds"][kind]["lane"]]
            assert r["segments"][worker] > 0, where
            for part in ("caller", "redis", worker):
                assert r["cpu_ms"][part] is not None, (where, part)
            # Each command's origins share all of its count.
            for name, count in r["commands_by_name"].items():
                shared = sum(r["commands_by_origin"][name].values())
                assert shared == pytest.approx(count, abs=0.01), (where, name)
    assert report["idle_per_s"]["seconds"] > 0
    assert "per request, net of as long idle" in finished.stdout
