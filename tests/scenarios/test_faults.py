"""Acceptance (faults never stretch a deadline), reduced size: steady load (60 %
of capacity) on one replica per lane, 200 ms in the database per operation,
and a fault at 40 % of the run, on a Redis and a MariaDB of the run's own
(``dataservice loadtest --fault``). Each run's invariants are the harness's own
verdicts (tools/dataservice_tools/loadtest/invariants.py): no caller past its timeout plus
100 ms (plus the run's worst stall of the machine or of the harness's own
threads, see ``machine_stalls`` in docs/loadtest.md), the database share never exceeded,
goodput back within 5 s of the fault's end and held, no acknowledged write lost
or applied twice, every lane's admission counts back at rest after the load,
and no in-flight slot left held nor rollout control unreadable
(tools/dataservice_tools/loadtest/aftermath.py).

The stall past the driver's read timeout (``db-stall-long``) runs as the
issue found it, not at reduced size: the overload scenario, three replicas
per lane, the database sampled every 10 ms from the stall to 10 s after it.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from dataservice_tools.loadtest.cli import run_loadtest
from dataservice_tools.loadtest.faults import PAST_READ_TIMEOUT_S, WATCH_AFTER_S, Fault
from dataservice_tools.loadtest.invariants import CALLER_MARGIN_S, HELD_SHARE, RECOVERY_BOUND_S
from dataservice_tools.loadtest.report import write_json
from rich.console import Console

from dataservice.config.model import load_config
from dataservice.store.engine import driver_read_timeout_s
from tests.conftest import SHIPPED_CONFIG
from tests.harness.loadtest import run_scenario
from tests.harness.rabbit import fresh_vhost
from tests.scenarios.test_loadtest import DELAY_MS, TEST_TARGET, assert_within_share
from tests.scenarios.test_loadtest import RATE as THREE_REPLICAS_RATE

RATE = 7 * 1000 / DELAY_MS

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow, pytest.mark.fault]


# Every fault on Redis as the broker. On RabbitMQ, whose queues live outside
# the faulted Redis, a database stall: requests expire in the queue while it
# lasts, and admission must let them go at once. (Redis's restart there is
# tests/scenarios/test_rabbitmq_durability.py's; every fault but a partition runs with
# `dataservice loadtest --fault` on RabbitMQ, but the suite's time is bounded.
# A partition cannot run there: its replicas run in a network namespace that
# reaches the run's own Redis and MariaDB only.)
ON_RABBITMQ = (Fault.DB_STALL,)
# The long stall has a run of its own, below.
MATRIX = [f for f in Fault if f is not Fault.DB_STALL_LONG]
CASES = [
    *[pytest.param(f, "redis", id=f.value) for f in MATRIX],
    *[pytest.param(f, "amqp", id=f"{f.value}-amqp") for f in ON_RABBITMQ],
]


@pytest.mark.parametrize(("fault", "broker"), CASES)
def test_a_fault_stretches_no_deadline_and_the_service_serves_again(
    fault: Fault, broker: str, tmp_path: Path
) -> None:
    # Recovery from a database partition is measured from the driver's read
    # timeout after it began (Fault.settles_after_s): the run is longer.
    duration = 20.0 if fault is Fault.PARTITION_DB else 14.0
    broker_url = fresh_vhost("dataservice-faults") if broker == "amqp" else None
    report, samples = run_scenario(
        "steady", tmp_path, TEST_TARGET, replicas=1, duration_s=duration, rate=RATE,
        db_delay_ms=DELAY_MS, records=200, fault=fault, broker_url=broker_url,
    )  # fmt: skip
    # Beside the replicas' logs: what a failure here needs to be read.
    write_json(tmp_path / "report.json", report)
    found = report["fault"]
    assert found["slowest_past_timeout_ms"] <= allowed_past_timeout_ms(report), (
        found["slowest_call"],
        report["machine_stalls"],
    )
    assert found["verdicts"]["serves_again_within_bound"], (found, report["series"])
    assert found["verdicts"]["acknowledged_writes_kept_once"], found["writes"]
    assert found["writes"]["acknowledged"] > 0, found["writes"]
    assert found["verdicts"]["admission_counts_at_rest"], found["admission"]
    assert found["verdicts"]["limits_and_controls_sane"], found["limits"]
    assert_within_share(report, samples)


def allowed_past_timeout_ms(report: dict[str, Any]) -> float:
    """The harness's own margin, and the worst wake-up of a thread of the
    harness in the run: a stall of the whole machine, or its callers taking
    turns at the interpreter lock as a stalled dependency answers again (a
    caller held up by either is late by as much, whatever the service does)."""
    stalls = report["machine_stalls"]
    return CALLER_MARGIN_S * 1000 + max(stalls["max_ms"], stalls["harness_wakes"]["max_ms"])


@pytest.mark.timeout(360)
def test_a_stall_past_the_driver_read_timeout_keeps_the_budget_and_every_write(
    tmp_path: Path,
) -> None:
    # Every client gives up on its statement while the server, stopped, still
    # holds it: when the server continues, none of what the replicas do next
    # (new connections, permits handed out again) may take the service over
    # its share. The run is lengthened to cover the stall and 10 s after it.
    report, _ = run_scenario(
        "overload", tmp_path, TEST_TARGET, replicas=3, duration_s=20.0,
        rate=THREE_REPLICAS_RATE, db_delay_ms=DELAY_MS, records=200, fault=Fault.DB_STALL_LONG,
    )  # fmt: skip
    # Beside the replicas' logs: what a failure here needs to be read.
    write_json(tmp_path / "report.json", report)
    found = report["fault"]
    watched = found["watched_end"]
    read_timeout_s = driver_read_timeout_s(load_config(SHIPPED_CONFIG).database)
    assert found["ended_s"] - found["began_s"] >= read_timeout_s + PAST_READ_TIMEOUT_S - 0.1
    assert report["config"]["duration_s"] >= found["ended_s"] + WATCH_AFTER_S
    # The sampler saw the server's first moments after the stall, and closely after.
    assert watched["first_sample_after_end_ms"] <= 50, watched
    assert watched["sample_hz_after_end"] >= 50, watched
    # (1) The budget held: the live replicas' share, every sample.
    assert watched["samples"] > 0
    assert watched["samples_over_active_share"] == 0, watched
    assert watched["samples_over_connection_share"] == 0, watched
    assert watched["peak_connections"] <= watched["max_connections"], watched
    # (2) No call answered past its timeout.
    assert found["slowest_past_timeout_ms"] <= allowed_past_timeout_ms(report), (
        found["slowest_call"],
        report["machine_stalls"],
    )
    # (3) No acknowledged write lost or applied twice.
    assert found["verdicts"]["acknowledged_writes_kept_once"], found["writes"]
    assert found["writes"]["acknowledged"] > 0, found["writes"]
    # (4) Interactive goodput back at 0.9 of capacity within 5 s of the end.
    back = watched["interactive_back_to_capacity_s"]
    assert back is not None, watched["interactive_goodput_after_end"]
    assert back <= RECOVERY_BOUND_S, (back, HELD_SHARE, watched["interactive_goodput_after_end"])


def test_a_partition_is_refused_on_rabbitmq_before_anything_starts(tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), width=200)
    code = run_loadtest(
        console, scenario="steady", system="service", duration=1.0, rate=None, replicas=1,
        db_delay_ms=0, out=tmp_path, live=False, base_config=SHIPPED_CONFIG,
        root_url="mysql+mysqldb://root@127.0.0.1:3306/", fault="partition-redis",
        broker_url="amqp://guest:guest@127.0.0.1:5672/",
    )  # fmt: skip
    assert code == 2
    assert "a partition fault runs on a Redis broker" in console.file.getvalue()
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("url", "refusal"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/no-such-vhost", "NOT_ALLOWED"),
        ("amqp://guest:secret-pw@127.0.0.1:5672/", "ACCESS_REFUSED"),
    ],
    ids=["vhost", "password"],
)
def test_a_broker_that_refuses_is_one_clear_line(url: str, refusal: str, tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), width=200)
    code = run_loadtest(
        console, scenario="steady", system="service", duration=1.0, rate=None, replicas=1,
        db_delay_ms=0, out=tmp_path, live=False, base_config=SHIPPED_CONFIG,
        root_url="mysql+mysqldb://root@127.0.0.1:3306/", broker_url=url,
    )  # fmt: skip
    said = console.file.getvalue()
    assert code == 1
    assert said.startswith("error: RabbitMQ at 127.0.0.1:5672/"), said
    assert refusal in said
    assert "secret-pw" not in said
