"""Acceptance: the interactive lane is not queued behind a batch backlog,
because each lane has its own queue and its own worker pool; on each broker.

The batch workers stop taking messages while the backlog is published (on
RabbitMQ, where each publish waits for its confirm, they would drain it as
fast as it comes), and take them again before the interactive reads."""

from __future__ import annotations

import statistics
import time

import pytest

from dataservice import Client, ReadOp
from dataservice.broker.celery import celery_app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from tests.harness.rabbit import BROKERS, depth, processes_on, purge

BACKLOG = 10_000
READS = 40


@pytest.fixture(scope="module", params=BROKERS)
def process_settings(
    request: pytest.FixtureRequest, settings: Settings, config: Config
) -> Settings:
    """The worker processes' settings (``worker_processes``), on each broker."""
    return processes_on(request.param, settings, config)


def _read_latencies_ms(client: Client, scope: str) -> list[float]:
    samples = []
    for _ in range(READS):
        start = time.perf_counter()
        client.read(scope, "probe")
        samples.append((time.perf_counter() - start) * 1000)
    return samples


@pytest.mark.slow
@pytest.mark.usefixtures("worker_processes")
@pytest.mark.timeout(300)
def test_interactive_read_is_served_while_batch_holds_ten_thousand_messages(
    process_client: Client, process_settings: Settings, config: Config, scope: str
) -> None:
    batch_queue = config.lanes.batch.queue
    process_client.write(scope, "probe", b"p" * 1024)
    before = _read_latencies_ms(process_client, scope)

    app = celery_app("tests-lanes", process_settings, config)
    control = app.control
    batch_nodes = [
        node
        for node, queues in (control.inspect(timeout=2).active_queues() or {}).items()
        if any(q["name"] == batch_queue for q in queues)
    ]
    assert batch_nodes
    filled = time.monotonic()
    try:
        control.cancel_consumer(batch_queue, destination=batch_nodes, reply=True)
        while depth(process_settings, batch_queue) < BACKLOG:
            process_client.submit_many(
                [ReadOp(scope, f"missing-{n}") for n in range(1_000)], timeout=120
            )
        filled = time.monotonic() - filled
        replies = control.add_consumer(batch_queue, destination=batch_nodes, reply=True)
        assert len(replies) == len(batch_nodes), replies
        during = _read_latencies_ms(process_client, scope)
        backlog_after = depth(process_settings, batch_queue)
    finally:
        purge(process_settings, batch_queue)
        app.close()

    p50_before, p50_during = statistics.median(before), statistics.median(during)
    print(
        f"\ninteractive read p50 {p50_before:.2f} ms idle, {p50_during:.2f} ms with "
        f"{BACKLOG:,}+ batch messages pending (max {max(during):.2f} ms); "
        f"backlog after the reads: {backlog_after:,} (filled in {filled:.1f} s)"
    )
    # The reads did not wait for the backlog: it is still there after them...
    assert backlog_after >= BACKLOG - 1_000
    # ...and they took about as long as without it (a loose bound: two cores
    # are shared with the busy batch pool and the publisher).
    assert p50_during <= 4 * p50_before + 10
    assert max(during) < config.lanes.interactive.default_deadline_ms
