"""Three cells under load on one database (the counting MariaDB, whose server
counts the workers' statements and connections itself): a stampede on a cold
key is coalesced within each cell and never across cells, and every cell's
callers flooding at once keep the whole deployment within its database share.

Every database operation first sleeps ``DELAY_MS`` (``database.injected_delay_ms``):
long enough that a burst is on its way before the first answer, and that the
database sampler (50 Hz) sees each statement several times.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from dataservice_tools.loadtest.sampler import Sampler
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.bursts import burst, sent_before_first_answer
from dataservice_tools.testkit.counting_database import SERVICE_USER, CountingDatabase

from dataservice import Client, DataServiceError, ReadMode, ResourceExhausted, WriteOp
from dataservice.config.settings import Settings
from dataservice.redis.keys import lock_key, record_key
from tests.cache.test_cache_stampede import without_target_wait
from tests.harness.cells import CALLERS, Deployment, cell_servers, deployed
from tests.harness.support import with_retry

pytestmark = [pytest.mark.slow, pytest.mark.load, pytest.mark.timeout(240)]

DELAY_MS = 300
# The lock's lease, far past a read: no follower has cause to take over.
LOCK_LEASE_MS = 5000
REPLICAS = 2
# Reads of the cold key per cell, at once: below the demo caller's 32 in flight.
READS = 30
# Closed-loop callers per cell in the flood, also below 32.
FLOODERS = 30
FLOOD_S = 12.0
# Each cell serves about 14 permits / 0.3 s = 46 interactive requests a second:
# a flooder's request behind 30 others cannot finish within this deadline, and
# admission refuses it at once.
FLOOD_DEADLINE_S = 0.6
TIMEOUT_S = 10.0
# Operations per batch message: each sleeps DELAY_MS in the database, and a
# message's transaction must fit in database.max_statement_ms.
BATCH_OPS = 5
PAYLOAD = bytes(range(256)) * 4
HOT = "hot"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PrivateRedis]]:
    with cell_servers(tmp_path_factory.mktemp("cells-redis")) as started:
        yield started


@pytest.fixture(scope="module")
def cells(
    settings: Settings,
    counting_database: CountingDatabase,
    servers: dict[str, PrivateRedis],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    changes: dict[tuple[str, ...], object] = {
        ("database", "injected_delay_ms"): DELAY_MS,
        ("cache", "lock_lease_ms"): LOCK_LEASE_MS,
        # Each cell's share of the database: the budget holds three cells.
        ("budget", "max_replicas"): REPLICAS,
    }
    directory = tmp_path_factory.mktemp("cells")
    with deployed(
        counting_database.on(settings), servers, directory, changes, REPLICAS
    ) as deployment:
        yield deployment


def test_a_cold_key_is_read_once_per_cell_and_each_cell_coalesces_its_own(
    cells: Deployment, servers: dict[str, PrivateRedis], counting_database: CountingDatabase
) -> None:
    """Each cell's callers stampede the same cold key at once: each cell reads
    it from the database (its cache and its lock are its own) and at most
    twice, where the six replicas' worker threads would read it dozens of times."""
    settings, config = cells.settings, cells.config
    one_attempt = without_target_wait(with_retry(config, max_attempts=1))
    scope = f"demo-{uuid.uuid4().hex[:12]}"
    counting_database.seed(scope, [HOT], PAYLOAD)

    with ThreadPoolExecutor(len(CALLERS)) as pool:
        started = {
            caller: pool.submit(
                burst, settings, one_attempt, caller, scope, [HOT] * READS, READS, TIMEOUT_S
            )
            for caller in CALLERS
        }
        bursts = {caller: future.result() for caller, future in started.items()}

    for caller, outcomes in bursts.items():
        errors = Counter(o.error for o in outcomes if o.error)
        assert not errors, f"{caller}: reads that did not return the record: {dict(errors)}"
        assert all(o.record is not None and o.record.payload == PAYLOAD for o in outcomes)
        # Concurrent: a tenth of each cell's burst was on its way before its first answer.
        assert sent_before_first_answer(outcomes) >= READS // 10, caller
    reads = counting_database.reads(scope, HOT)
    assert len(CALLERS) <= reads <= 2 * len(CALLERS), f"{reads} database reads of the key"
    # Each cell filled its own cache, and its lock is gone.
    for cell, server in servers.items():
        client = redis.Redis.from_url(server.url)
        try:
            filled = [record_key(fmt.value, scope, HOT, 1) for fmt in config.cache.rollout.fill]
            assert client.exists(*filled) == len(filled), cell
            assert not client.exists(lock_key(scope, HOT)), cell
        finally:
            client.close()


class Flood:
    """Every caller flooding its cell's interactive lane from ``FLOODERS``
    closed-loop threads (three reads to a write) and its batch lane from one,
    until ``FLOOD_S`` is over; each answer counted by kind."""

    def __init__(self, clients: dict[str, Client], scope: str, ids: list[str]) -> None:
        self.clients, self.scope, self.ids = clients, scope, ids
        self.outcomes: dict[str, Counter[str]] = {caller: Counter() for caller in clients}
        self._lock = threading.Lock()
        self._end = 0.0

    def run(self) -> None:
        self._end = time.monotonic() + FLOOD_S
        threads = [
            threading.Thread(target=self._interactive, args=(caller,), daemon=True)
            for caller in self.clients
            for _ in range(FLOODERS)
        ]
        threads += [
            threading.Thread(target=self._batch, args=(caller,), daemon=True)
            for caller in self.clients
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(FLOOD_S + 30)

    def _count(self, caller: str, outcome: str) -> None:
        with self._lock:
            self.outcomes[caller][outcome] += 1

    def _interactive(self, caller: str) -> None:
        client = self.clients[caller]
        chosen = random.Random(f"{caller}-{threading.get_ident()}")
        while time.monotonic() < self._end:
            object_id = chosen.choice(self.ids)
            try:
                if chosen.random() < 0.75:
                    client.read(
                        self.scope, object_id, mode=ReadMode.PRIMARY, timeout=FLOOD_DEADLINE_S
                    )
                else:
                    client.write(self.scope, object_id, PAYLOAD, timeout=FLOOD_DEADLINE_S)
                outcome = "ok"
            except ResourceExhausted:
                outcome = "refused"
            except DataServiceError as exc:
                outcome = type(exc).__name__
            self._count(caller, outcome)

    def _batch(self, caller: str) -> None:
        client = self.clients[caller]
        n = 0
        while time.monotonic() < self._end:
            handles = client.submit_many(
                [WriteOp(self.scope, f"batch-{caller}-{n}-{k}", PAYLOAD) for k in range(BATCH_OPS)]
            )
            n += 1
            for handle in handles:
                try:
                    handle.result()
                    outcome = "batch ok"
                except DataServiceError as exc:
                    outcome = f"batch {type(exc).__name__}"
                self._count(caller, outcome)


def test_every_cell_flooded_at_once_keeps_the_deployment_within_its_share(
    cells: Deployment, counting_database: CountingDatabase
) -> None:
    """The database's own count of the workers' active statements and
    connections stays within what ``check-config`` gives three cells' workers,
    while the cells together hold more than any one cell could."""
    settings, config = cells.settings, cells.config
    scope = f"demo-{uuid.uuid4().hex[:12]}"
    ids = [f"r-{n}" for n in range(50)]
    counting_database.seed(scope, ids, PAYLOAD)
    share_active, share_connections = cells.share()
    clients = {caller: Client(caller, settings, config) for caller in CALLERS}
    flood = Flood(clients, scope, ids)
    sampler = Sampler(
        counting_database.root_url,
        SERVICE_USER,
        time.monotonic(),
        lambda _: (share_active, share_connections),
    )
    sampler.start()
    try:
        flood.run()
    finally:
        sampler.stop()
        for client in clients.values():
            client.close()

    assert sampler.error is None, sampler.error
    samples = sampler.samples
    assert samples, "the sampler took no samples"
    over = [s for s in samples if s.active > share_active or s.connections > share_connections]
    assert not over, f"over the three cells' share: {over[:5]}"
    budget = config.budget
    peak = max(s.active for s in samples)
    assert peak <= budget.database_active - budget.reserved
    # The cells worked at once: together past what one cell's workers may hold.
    assert peak > cells.cell_share(), (peak, cells.cell_share())
    outcomes = flood.outcomes
    for caller, seen in outcomes.items():
        assert seen["ok"] > 0, (caller, seen)
        assert seen["batch ok"] > 0, (caller, seen)
    # Offered past what the cells serve: admission refused the rest at once.
    assert sum(seen["refused"] for seen in outcomes.values()) > 0, outcomes
