"""One short load-harness run for the tests: the scenario at reduced size, on
a target (Redis db, database, MariaDB user) of the test's own."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from dataservice_tools.loadtest import environment as env
from dataservice_tools.loadtest.runner import Run, RunOptions
from dataservice_tools.loadtest.sampler import Sample
from dataservice_tools.loadtest.scenarios import SCENARIOS
from rich.console import Console

from tests.conftest import SHIPPED_CONFIG


def run_scenario(
    scenario: str, out: Path, target: env.Target, **options: Any
) -> tuple[dict[str, Any], list[Sample]]:
    """The run's report and the database samples it took (``options``: of RunOptions;
    the shipped configuration unless ``base_config`` says otherwise)."""
    options.setdefault("base_config", SHIPPED_CONFIG)
    run = Run(
        RunOptions(scenario=SCENARIOS[scenario], out=out, live=False, target=target, **options),
        Console(file=io.StringIO()),
    )
    report = run.execute()
    assert run.samples, "the sampler took no samples"
    assert any(lane["ok"] for lane in report["lanes"].values()), served_nothing(run, report)
    return report, run.samples


def served_nothing(run: Run, report: dict[str, Any]) -> str:
    """Why a run answered nothing: each lane's outcomes and each replica's log tail."""
    outcomes = ("attempts", "ok", "rejected", "unavailable", "timeout", "error")
    lines = ["the run answered no request"]
    for name, lane in report["lanes"].items():
        lines.append(f"{name}: " + ", ".join(f"{k} {lane.get(k)}" for k in outcomes))
        lines.append(f"{name} refused by reason: {lane.get('refused_by_reason')}")
    for replica in run.fleet.replicas:
        worker = replica.worker
        lines.append(f"--- {worker.log_path.name} (exit {worker.returncode}):")
        lines.append(worker.log_tail(15))
    return "\n".join(lines)
