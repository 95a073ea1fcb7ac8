"""Three cells, each on a Redis of its own with its own worker per lane, one
database: every caller's requests go to the cell the rule gives it (or the
one it is pinned to), are served there with both clients, and touch no
other cell's Redis."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import PrivateRedis
from sqlalchemy import Engine

from dataservice import (
    AsyncClient,
    Client,
    DataServiceError,
    NotFound,
    ReadMode,
    ResourceExhausted,
    WriteOp,
)
from dataservice.config.settings import Settings
from dataservice.redis.keys import rate_key
from tests.harness.cells import CALLERS, CELLS, Deployment, cell_servers, deployed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Its rate is 20/s with a burst of 5 (tests/harness/support.py).
LIMITED = "tests-limited"
FLOOD_S = 10.0
FLOODERS = 8
# Interactive replicas per cell: a caller's limits are its cell's, across them.
REPLICAS = 2
# The interactive lane's bound on waiting messages, in each cell.
QUEUE_BOUND = 20


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, PrivateRedis]]:
    with cell_servers(tmp_path) as started:
        yield started


@pytest.fixture
def cells(
    settings: Settings,
    database: Engine,
    servers: dict[str, PrivateRedis],
    tmp_path: Path,
) -> Iterator[Deployment]:
    changes: dict[tuple[str, ...], object] = {
        ("changes", "guard"): True,
        # Each cell's share of the database: the budget holds three cells.
        ("budget", "max_replicas"): 2,
        # Small enough for a test to fill one cell's lane.
        ("lanes", "interactive", "admission", "max_messages"): QUEUE_BOUND,
        ("lanes", "interactive", "max_ops_per_message"): QUEUE_BOUND,
    }
    with deployed(settings, servers, tmp_path, changes, REPLICAS) as deployment:
        yield deployment


def test_each_caller_is_served_in_its_own_cell_and_touches_no_other(
    cells: Deployment, servers: dict[str, PrivateRedis]
) -> None:
    settings, config = cells.settings, cells.config
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


def test_a_callers_rate_holds_across_two_replicas_of_its_cell(
    cells: Deployment, tmp_path: Path
) -> None:
    settings, config = cells.settings, cells.config
    policy = config.callers[LIMITED]
    scope = f"t-{uuid.uuid4().hex[:12]}"
    answered: list[float] = []
    lock = threading.Lock()
    end = time.monotonic() + FLOOD_S

    def flood() -> None:
        with Client(LIMITED, settings, config) as client:
            while time.monotonic() < end:
                try:
                    client.read(scope, "missing", mode=ReadMode.PRIMARY, timeout=2.0)
                except NotFound:
                    # Admitted and answered: the record is not there.
                    with lock:
                        answered.append(time.monotonic())
                except ResourceExhausted:
                    pass

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(FLOODERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(FLOOD_S + 10)
    # Past the burst, the caller's answers come at its rate, whichever replica answers.
    steady = sorted(answered)[policy.burst :]
    rate = (len(steady) - 1) / (steady[-1] - steady[0])
    assert 0.99 <= rate / policy.rate_per_s <= 1.005, (rate, len(answered))
    cell = config.cell_of(LIMITED)
    logs = sorted(cells.logs.glob(f"{cell}-interactive-*.log"))
    served = [log.read_text().count(f'"caller":"{LIMITED}"') for log in logs]
    assert len(served) == REPLICAS
    assert all(served), f"each replica of cell {cell} answered the caller: {served}"


def test_a_full_lane_in_one_cell_refuses_its_callers_and_no_other_cells(
    cells: Deployment,
) -> None:
    settings, config = cells.settings, cells.config
    stuck, served = "tests", "loadtest"
    stuck_cell, served_cell = config.cell_of(stuck), config.cell_of(served)
    assert stuck_cell is not None
    assert stuck_cell != served_cell
    scope = f"t-{uuid.uuid4().hex[:12]}"
    outcomes: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    lock = threading.Lock()

    def call() -> None:
        with Client(stuck, settings, config) as client:
            try:
                client.read(scope, "x", mode=ReadMode.PRIMARY, timeout=3.0)
                outcome = "answered"
            except ResourceExhausted as exc:
                outcome = "refused"
                with lock:
                    reasons[exc.reason] += 1
            except DataServiceError as exc:
                outcome = type(exc).__name__
        with lock:
            outcomes[outcome] += 1

    # Nothing takes from the stuck cell's interactive queue.
    for worker in cells.interactive[stuck_cell]:
        os.kill(worker.pid, signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=call, daemon=True) for _ in range(2 * QUEUE_BOUND)]
        for thread in threads:
            thread.start()
        # Meanwhile another cell's caller is answered at once.
        with Client(served, settings, config) as client:
            for n in range(20):
                with pytest.raises(NotFound):
                    client.read(scope, f"other-{n}", mode=ReadMode.PRIMARY, timeout=2.0)
    finally:
        for worker in cells.interactive[stuck_cell]:
            os.kill(worker.pid, signal.SIGCONT)
    for thread in threads:
        thread.join(15)
    assert outcomes["refused"] > 0, outcomes
    assert set(reasons) <= {"queue_full", "queue_too_long"}, reasons
