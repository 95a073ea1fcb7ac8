"""Acceptance (faults never stretch a deadline), reduced size: steady load (60 %
of capacity) on one replica per lane, 200 ms in the database per operation,
and a fault at 40 % of the run, on a Redis and a MariaDB of the run's own
(``dataservice loadtest --fault``). Each run's invariants are the harness's own
verdicts (dataservice/loadtest/invariants.py): no caller past its timeout plus
100 ms (plus the run's worst stall of the machine or of the harness's own
threads, see ``machine_stalls`` in docs/loadtest.md), the database share never exceeded,
goodput back within 5 s of the fault's end and held, no acknowledged write lost
or applied twice, every lane's admission counts back at rest after the load,
and no in-flight slot left held nor rollout control unreadable
(dataservice/loadtest/aftermath.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataservice.loadtest.faults import Fault
from dataservice.loadtest.invariants import CALLER_MARGIN_S
from tests.loadtest_support import run_scenario
from tests.test_loadtest import DELAY_MS, TEST_TARGET, assert_within_share

RATE = 7 * 1000 / DELAY_MS

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.mark.parametrize("fault", list(Fault), ids=[f.value for f in Fault])
def test_a_fault_stretches_no_deadline_and_the_service_serves_again(
    fault: Fault, tmp_path: Path
) -> None:
    # Recovery from a database partition is measured from the driver's read
    # timeout after it began (Fault.settles_after_s): the run is longer.
    duration = 20.0 if fault is Fault.PARTITION_DB else 14.0
    report, samples = run_scenario(
        "steady", tmp_path, TEST_TARGET, replicas=1, duration_s=duration, rate=RATE,
        db_delay_ms=DELAY_MS, records=200, fault=fault,
    )  # fmt: skip
    found = report["fault"]
    # The harness's own margin, and the worst wake-up of a thread of the
    # harness in the run: a stall of the whole machine, or its callers taking
    # turns at the interpreter lock as a stalled dependency answers again (a
    # caller held up by either is late by as much, whatever the service does).
    stalls = report["machine_stalls"]
    allowed = CALLER_MARGIN_S * 1000 + max(stalls["max_ms"], stalls["harness_wakes"]["max_ms"])
    assert found["slowest_past_timeout_ms"] <= allowed, (
        found["slowest_call"],
        report["machine_stalls"],
    )
    assert found["verdicts"]["serves_again_within_bound"], (found, report["series"])
    assert found["verdicts"]["acknowledged_writes_kept_once"], found["writes"]
    assert found["writes"]["acknowledged"] > 0, found["writes"]
    assert found["verdicts"]["admission_counts_at_rest"], found["admission"]
    assert found["verdicts"]["limits_and_controls_sane"], found["limits"]
    assert_within_share(report, samples)
