"""Acceptance (faults): once a restarted Redis is back, a lane offered what it
can serve refuses nothing.

One interactive worker serves a Redis of the test's own, 700 ms in the
database per read (7 threads: 10 reads a second), offered 80 % of that before,
during and after a restart: Redis killed and started again, empty. Requests
running through the restart are answered by their pool threads as soon as
Redis is back, while the worker's consumer comes back only at its next
reconnect attempt, about half a second later, and the callers' requests wait
in the list meanwhile. Admission, starting from empty books, must measure the
lane's drain rate from when the worker takes its requests again: a first
window opened by those early answers measured the consumer's absence (and the
first requests it took, still running) as a slow lane, and refused requests
for it (docs/operations.md, "Faults").
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from dataservice_tools.localservices import PrivateRedis

from dataservice import Client, DataServiceError, ResourceExhausted
from dataservice.broker.celery import celery_app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from tests.harness.support import on_redis, with_changes

# Longer than what is left of a measuring window (1 s) once the consumer is
# back: a window opened at Redis's return saw none of them complete.
DELAY_MS = 700
THREADS = 7
RATE = 0.8 * THREADS * 1000 / DELAY_MS
TIMEOUT_S = 3.0
BEFORE_S = 4.0
# Back just after the consumer's attempt at 0.9 s, so its next comes at 1.6 s
# (dataservice/worker/reconnect.py: 0.1, 0.4, 0.9, 1.6, 2.5 s ... after the loss).
DOWN_S = 1.0
AFTER_S = 6.0

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow, pytest.mark.fault]


@dataclass(frozen=True, slots=True)
class Outcome:
    done: float
    kind: str
    reason: str = ""


@pytest.fixture
def served(
    settings: Settings, config: Config, private_redis: PrivateRedis, tmp_path: Path
) -> Iterator[Settings]:
    slow = with_changes(
        settings,
        tmp_path / "queues.yml",
        {
            ("database", "injected_delay_ms"): DELAY_MS,
            ("lanes", "interactive", "concurrency"): THREADS,
            ("lanes", "interactive", "permits"): THREADS,
        },
    )
    on_private = on_redis(slow, private_redis.url)
    (tmp_path / "logs").mkdir()
    worker = WorkerProcess.for_lane(
        on_private, LaneName.INTERACTIVE, tmp_path / "logs" / "interactive.log"
    ).start()
    control = celery_app("restart-control", on_private, config)
    try:
        wait_answering(control, [worker], 60.0)
        yield on_private
    finally:
        control.close()
        stop_all([worker])


def call(client: Client, scope: str, n: int) -> Outcome:
    try:
        client.read(scope, f"r{n}", mode=ReadMode.PRIMARY, timeout=TIMEOUT_S)
    except ResourceExhausted as exc:
        return Outcome(time.monotonic(), "refused", exc.reason)
    except DataServiceError as exc:
        # Not found (nothing was written), or Redis down: answered either way.
        return Outcome(time.monotonic(), type(exc).__name__)
    return Outcome(time.monotonic(), "ok")


def test_a_restarted_redis_refuses_nothing_a_lane_can_serve(
    served: Settings, config: Config, private_redis: PrivateRedis
) -> None:
    scope = f"t-{uuid.uuid4().hex[:12]}"
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    back: list[float] = []

    def restart() -> None:
        time.sleep(BEFORE_S)
        private_redis.signal(signal.SIGKILL)
        time.sleep(DOWN_S)
        private_redis.start()
        back.append(time.monotonic())

    with Client("tests", served, config) as client, ThreadPoolExecutor(64) as pool:

        def one(n: int) -> None:
            outcome = call(client, scope, n)
            with lock:
                outcomes.append(outcome)

        fault = threading.Thread(target=restart)
        start = time.monotonic()
        fault.start()
        # Open loop: arrivals at their instants, whatever the answers do.
        n = 0
        while (due := start + n / RATE) < start + BEFORE_S + DOWN_S + AFTER_S:
            time.sleep(max(0.0, due - time.monotonic()))
            pool.submit(one, n)
            n += 1
        fault.join()
    [restarted] = back
    after = Counter(o.kind for o in outcomes if o.done >= restarted)
    refused = Counter(o.reason for o in outcomes if o.done >= restarted and o.kind == "refused")
    before = Counter(o.kind for o in outcomes if o.done < start + BEFORE_S)
    print(f"before the kill: {dict(before)}; once Redis was back: {dict(after)}")
    # Within its capacity the lane refuses nothing, before the fault or after
    # it; and it serves again once Redis is back (the test is not vacuous).
    assert "refused" not in before, before
    assert not refused, (refused, after)
    assert after["NotFound"] >= 0.6 * RATE * AFTER_S, after
