"""Fan-in: however many calls one client process has in flight, it holds a
handful of Redis connections (the reply channel's reader, the publish pool),
and every call gets its own answer. Real worker processes serve the reads."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import redis

from dataservice import Client, Record, WriteOp
from dataservice.config import Config
from dataservice.settings import Settings
from dataservice.supervisor import Supervisor
from tests.support import connections_of_this_process, own_local_ports

# What a client process may hold, whatever its concurrency.
MOST_CONNECTIONS = 4
THREADS = 1000
BURSTS = 3


class Peak:
    """The most connections the process held, sampled while ``during`` runs."""

    def __init__(self, redis_client: redis.Redis, opened_before: set[int]) -> None:
        self._redis = redis_client
        # Its own connection is not the client's.
        redis_client.ping()
        self._before = opened_before | own_local_ports()
        self.most = 0

    def during(self, run: Callable[[], None]) -> None:
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.02):
                self.most = max(self.most, connections_of_this_process(self._redis, self._before))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            run()
        finally:
            stop.set()
            sampler.join(5)
        self.most = max(self.most, connections_of_this_process(self._redis, self._before))


@pytest.fixture
def records(process_client: Client, scope: str) -> list[str]:
    ids = [f"r{n}" for n in range(200)]
    # Each record's payload is its id: an answer shows whose it is.
    writes = [WriteOp(scope, i, i.encode()) for i in ids]
    for handle in process_client.submit_many(writes, timeout=60):
        handle.result()
    return ids


def test_a_thousand_threads_share_one_sync_client_on_four_connections(
    worker_processes: Supervisor,
    process_settings: Settings,
    config: Config,
    scope: str,
    records: list[str],
) -> None:
    counter = redis.Redis.from_url(process_settings.result_backend_url)
    peak = Peak(counter, own_local_ports())
    answered: list[bool] = []
    failures: list[BaseException] = []

    def burst(client: Client) -> None:
        start = threading.Barrier(THREADS)

        def call(n: int) -> None:
            object_id = records[n % len(records)]
            start.wait(30)
            try:
                record = client.read(scope, object_id, timeout=30)
            except BaseException as exc:
                failures.append(exc)
                return
            answered.append(isinstance(record, Record) and record.payload == object_id.encode())

        threads = [threading.Thread(target=call, args=(n,)) for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    with Client("tests", process_settings, config) as client:
        for _ in range(BURSTS):
            peak.during(lambda: burst(client))
    counter.close()
    assert not failures, failures[:3]
    assert len(answered) == THREADS * BURSTS
    assert all(answered)
    print(f"peak connections: {peak.most}")
    assert 0 < peak.most <= MOST_CONNECTIONS
