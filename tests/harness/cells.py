"""Three cells for the tests: a private Redis each, a batch worker and
``replicas`` interactive workers per cell, one database, and the callers
spread so that every cell serves one."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from dataservice_tools.localservices import PrivateRedis

from dataservice.broker.celery import celery_app
from dataservice.config.budget import process_share
from dataservice.config.cells import CellsConfig
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from tests.harness.support import with_changes

CELLS = ("a", "b", "c")
# One per cell: the rule's cells for the first two, the third pinned to a
# cell neither of them has.
CALLERS = ("tests", "loadtest", "demo")


def cells_rule(callers: list[str]) -> dict[str, object]:
    """The ``cells`` section: the rule's cells for two callers, and the third
    pinned to a cell neither of them has (when there is one), so that every
    cell serves."""
    rule = CellsConfig(names=CELLS)
    taken = {rule.cell_of(caller, callers) for caller in CALLERS[:2]}
    free = [cell for cell in CELLS if cell not in taken]
    return {"names": list(CELLS), "callers": {CALLERS[2]: free[0]} if free else {}}


@contextlib.contextmanager
def cell_servers(directory: Path) -> Iterator[dict[str, PrivateRedis]]:
    """A private Redis per cell, killed on exit."""
    started = {cell: PrivateRedis(directory / f"redis-{cell}") for cell in CELLS}
    try:
        for server in started.values():
            server.start()
        yield started
    finally:
        for server in started.values():
            server.signal(9)


@dataclass(frozen=True)
class Deployment:
    settings: Settings
    config: Config
    # Each cell's interactive replicas.
    interactive: dict[str, list[WorkerProcess]]
    logs: Path

    def share(self) -> tuple[int, int]:
        """(active statements, connections) every cell's workers together may
        hold by the budget, as ``check-config`` counts each process."""
        lanes = self.config.lanes
        processes = [(LaneName.INTERACTIVE, len(mine)) for mine in self.interactive.values()]
        processes += [(LaneName.BATCH, 1)] * len(self.interactive)
        shares = [(process_share(lanes[lane]), n) for lane, n in processes]
        return sum(s.active * n for s, n in shares), sum(s.connections * n for s, n in shares)

    def cell_share(self) -> int:
        """Active statements one cell's workers may hold."""
        lanes = self.config.lanes
        replicas = len(next(iter(self.interactive.values())))
        return (
            replicas * process_share(lanes.interactive).active + process_share(lanes.batch).active
        )


@contextlib.contextmanager
def deployed(
    settings: Settings,
    servers: Mapping[str, PrivateRedis],
    directory: Path,
    changes: Mapping[tuple[str, ...], object],
    replicas: int,
) -> Iterator[Deployment]:
    """Every cell's workers on ``settings`` with the configuration ``changes``
    (and the cells) applied, answering; stopped on exit."""
    cells_file = directory / "cells.yml"
    cells_file.write_text(
        yaml.safe_dump({"cells": {cell: {"redis_url": s.url} for cell, s in servers.items()}})
    )
    configured = with_changes(
        settings,
        directory / "queues.yml",
        {("cells",): cells_rule(list(settings.load().callers)), **changes},
    )
    configured = dataclasses.replace(configured, cells_file=cells_file)
    config = configured.load()
    logs = directory / "logs"
    logs.mkdir()
    workers: list[WorkerProcess] = []
    controls = []
    interactive: dict[str, list[WorkerProcess]] = {}
    try:
        for cell in CELLS:
            own = dataclasses.replace(configured, cell=cell).for_worker(config)
            lanes = [LaneName.BATCH] + [LaneName.INTERACTIVE] * replicas
            mine = [
                WorkerProcess.for_lane(own, lane, logs / f"{cell}-{lane.value}-{n}.log")
                for n, lane in enumerate(lanes)
            ]
            workers += [worker.start() for worker in mine]
            interactive[cell] = mine[1:]
            controls.append((celery_app(f"cells-control-{cell}", own, config), mine))
        for control, pair in controls:
            wait_answering(control, pair, 60.0)
        yield Deployment(configured, config, interactive, logs)
    finally:
        for control, _ in controls:
            control.close()
        for worker in workers:
            # A test may have stopped one (SIGSTOP): it must hear the SIGTERM.
            with contextlib.suppress(OSError, RuntimeError):
                os.kill(worker.pid, signal.SIGCONT)
        stop_all(workers)
