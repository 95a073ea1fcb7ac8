"""Three cells, each on a Redis of its own with its own worker per lane, one
database: every caller's requests go to the cell the rule gives it (or the
one it is pinned to), are served there with both clients, and touch no
other cell's Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from dataservice_tools.localservices import PrivateRedis
from sqlalchemy import Engine

from dataservice import AsyncClient, Client, ReadMode, WriteOp
from dataservice.broker.celery import celery_app
from dataservice.config.cells import CellsConfig
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from dataservice.redis.keys import rate_key
from tests.harness.support import with_changes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CELLS = ("a", "b", "c")
CALLERS = ("tests", "loadtest", "demo")


def _cells_config(callers: list[str]) -> dict[str, object]:
    """The rule's cells for two callers, and the third pinned to a cell
    neither of them has (when there is one), so that every cell serves."""
    rule = CellsConfig(names=CELLS)
    taken = {rule.cell_of(caller, callers) for caller in CALLERS[:2]}
    free = [cell for cell in CELLS if cell not in taken]
    return {"names": list(CELLS), "callers": {CALLERS[2]: free[0]} if free else {}}


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, PrivateRedis]]:
    started = {cell: PrivateRedis(tmp_path / f"redis-{cell}") for cell in CELLS}
    try:
        for server in started.values():
            server.start()
        yield started
    finally:
        for server in started.values():
            server.signal(9)


@pytest.fixture
def cells(
    settings: Settings,
    database: Engine,
    servers: dict[str, PrivateRedis],
    tmp_path: Path,
) -> Iterator[tuple[Settings, Config]]:
    cells_file = tmp_path / "cells.yml"
    cells_file.write_text(
        yaml.safe_dump({"cells": {cell: {"redis_url": s.url} for cell, s in servers.items()}})
    )
    configured = with_changes(
        settings,
        tmp_path / "queues.yml",
        {
            ("cells",): _cells_config(list(settings.load().callers)),
            ("changes", "guard"): True,
            # Each cell's share of the database: the budget holds three cells.
            ("budget", "max_replicas"): 2,
        },
    )
    configured = dataclasses.replace(configured, cells_file=cells_file)
    config = configured.load()
    (tmp_path / "logs").mkdir()
    workers = []
    controls = []
    try:
        for cell in CELLS:
            own = dataclasses.replace(configured, cell=cell).for_worker(config)
            for lane in LaneName:
                log = tmp_path / "logs" / f"{cell}-{lane.value}.log"
                workers.append(WorkerProcess.for_lane(own, lane, log).start())
            controls.append((celery_app(f"cells-control-{cell}", own, config), workers[-2:]))
        for control, pair in controls:
            wait_answering(control, pair, 60.0)
        yield configured, config
    finally:
        for control, _ in controls:
            control.close()
        stop_all(workers)


def test_each_caller_is_served_in_its_own_cell_and_touches_no_other(
    cells: tuple[Settings, Config], servers: dict[str, PrivateRedis]
) -> None:
    settings, config = cells
    scope = f"demo-cells-{uuid.uuid4().hex[:12]}"
    for caller in CALLERS:
        with Client(caller, settings, config) as client:
            client.write(scope, caller, caller.encode(), idempotency_key=f"{scope}-{caller}")
            assert client.read(scope, caller, mode=ReadMode.PRIMARY).payload == caller.encode()
            assert client.read(scope, caller).payload == caller.encode()
            handles = client.submit_many(
                [WriteOp(scope, f"{caller}-{n}", b"batch") for n in range(3)]
            )
            assert [handle.result().revision for handle in handles] == [1, 1, 1]

        async def awaited(caller: str = caller) -> bytes:
            async with AsyncClient(caller, settings, config) as client:
                record = await client.read(scope, caller, mode=ReadMode.PRIMARY)
                return record.payload

        assert asyncio.run(awaited()) == caller.encode()

    served = {}
    for cell, server in servers.items():
        client = redis.Redis.from_url(server.url)
        try:
            served[cell] = {caller for caller in CALLERS if client.exists(rate_key(caller))}
        finally:
            client.close()
    expected = {cell: set() for cell in CELLS}
    for caller in CALLERS:
        cell = config.cell_of(caller)
        assert cell is not None
        expected[cell].add(caller)
    assert served == expected
    assert all(served.values()), "every cell serves a caller"
