"""``python -m bench.attribution --quick`` produces its table for (a), (b) and (c) in one run.

Only the table's shape and that each figure was measured are asserted; what
the figures say is the bench's to show (bench/RESULTS.md), never a test's.
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
SIZES = {100, 1024, 8192, 65536}
SYSTEMS = {"a", "b", "c"}
WORKLOADS = {"cached", "database"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_run_has_every_system_at_every_size_with_measured_figures(tmp_path: Path) -> None:
    require(mysql_reachable("127.0.0.1", 3306), "MariaDB at 127.0.0.1:3306")
    # The bench runs a redis-server of its own.
    require(shutil.which("redis-server") is not None, "redis-server")
    out = tmp_path / "attribution.json"
    finished = subprocess.run(
        [sys.executable, "-m", "bench.attribution", "--quick", "--json", str(out)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    report = json.loads(out.read_text())

    cells = report["cells"]
    assert {(c["workload"], c["system"], c["payload_bytes"]) for c in cells} == {
        (w, s, p) for w in WORKLOADS for s in SYSTEMS for p in SIZES
    }
    for cell in cells:
        where = (cell["workload"], cell["system"], cell["payload_bytes"])
        assert cell["ok"] > 0, where
        assert cell["errors"] == 0, (where, cell["first_error"])
        assert cell["p50_ms"] > 0, where
        assert cell["p99_ms"] >= cell["p50_ms"], where
        for part in ("caller", "worker", "redis", "total"):
            assert cell["cpu_ms_per_op"][part] > 0, (where, part)
        for name in ("request_message_bytes", "request_body_bytes", "response_bytes"):
            assert cell[name] > 0, (where, name)
        # Every answer carried its record's payload, whatever its encoding.
        assert cell["response_bytes"] >= cell["payload_bytes"], where
        for name in ("redis_in_bytes_per_op", "redis_out_bytes_per_op"):
            assert cell[name] > 0, (where, name)
        for name in ("caller_allocated_bytes", "worker_rss_mb"):
            assert cell[name] > 0, (where, name)

    assert {(m["workload"], m["system"]) for m in report["mix"]} == {
        (w, s) for w in WORKLOADS for s in SYSTEMS
    }
    assert {(c["workload"], c["payload_bytes"]) for c in report["credit"]} == {
        (w, p) for w in WORKLOADS for p in [*SIZES, "mix"]
    }
    fixtures = report["fixtures"]
    assert {(f["system"], f["payload_bytes"]) for f in fixtures} == {
        (s, p) for s in SYSTEMS for p in SIZES
    }
    for row in fixtures:
        assert all(step["cpu_us"] > 0 for step in row["steps"].values()), row
    assert {(r["payload"], r["level"]) for r in report["compression"]} == {
        (kind, level) for kind in ("text JSON", "random") for level in (1, 6)
    }
    assert len(report["compression_verdicts"]) == len(report["compression"])
    # The console table names all three systems.
    for name in ("(a) plain Celery, JSON", "(b) admitted JSON", "(c) service, protobuf"):
        assert name in finished.stdout
