"""Acceptance: the interactive lane is not queued behind a batch backlog,
because each lane has its own queue and its own worker pool."""

from __future__ import annotations

import statistics
import time

import pytest
import redis

from dataservice import Client, ReadOp
from dataservice.config import Config
from dataservice.settings import Settings

BACKLOG = 10_000
READS = 40


def _read_latencies_ms(client: Client, scope: str) -> list[float]:
    samples = []
    for _ in range(READS):
        start = time.perf_counter()
        client.read(scope, "probe")
        samples.append((time.perf_counter() - start) * 1000)
    return samples


@pytest.mark.usefixtures("worker_processes")
@pytest.mark.timeout(300)
def test_interactive_read_is_served_while_batch_holds_ten_thousand_messages(
    process_client: Client, process_settings: Settings, config: Config, scope: str
) -> None:
    broker = redis.Redis.from_url(process_settings.broker_url)
    batch_queue = config.lanes.batch.queue
    process_client.write(scope, "probe", b"p" * 1024)
    before = _read_latencies_ms(process_client, scope)

    try:
        while broker.llen(batch_queue) < BACKLOG:
            process_client.submit_many(
                [ReadOp(scope, f"missing-{n}") for n in range(1_000)], timeout=120
            )
        during = _read_latencies_ms(process_client, scope)
        backlog_after = broker.llen(batch_queue)
    finally:
        broker.delete(batch_queue)

    p50_before, p50_during = statistics.median(before), statistics.median(during)
    print(
        f"\ninteractive read p50 {p50_before:.2f} ms idle, {p50_during:.2f} ms with "
        f"{BACKLOG:,}+ batch messages pending (max {max(during):.2f} ms); "
        f"backlog after the reads: {backlog_after:,}"
    )
    # The reads did not wait for the backlog: it is still there after them...
    assert backlog_after >= BACKLOG - 1_000
    # ...and they took about as long as without it (a loose bound: two cores
    # are shared with the busy batch pool and the publisher).
    assert p50_during <= 4 * p50_before + 10
    assert max(during) < config.lanes.interactive.default_deadline_ms
