"""Acceptance (faults never stretch a deadline): the pause probe.

Six threads read through ``Client.read(..., timeout=1.0)`` while the one Redis
the service uses (broker, answers, limits and cache of a Redis of the test's
own) is paused with ``CLIENT PAUSE 4000 ALL``: every command on it, old
connection or new, waits until the pause ends. No call may return more than
1.1 s after it began, and once the pause is over the service answers again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.replicas import Replicas

from dataservice import Client, DataServiceError
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from tests.harness.support import on_redis

THREADS = 6
RECORDS = 20
TIMEOUT_S = 1.0
BOUND_S = 1.1
PAUSE_MS = 4000
# The service must answer again within this long of the pause's end.
RECOVERY_S = 2.0

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow, pytest.mark.fault]


@dataclass
class Calls:
    """Each call: when it began (monotonic), how long it took, how it ended."""

    client: Client
    scope: str
    stop: threading.Event = field(default_factory=threading.Event)
    done: list[tuple[float, float, str]] = field(default_factory=list)

    def run(self, n: int) -> None:
        while not self.stop.is_set():
            began, outcome = time.monotonic(), "ok"
            try:
                self.client.read(self.scope, f"r{n % RECORDS}", timeout=TIMEOUT_S)
            except DataServiceError as exc:
                outcome = type(exc).__name__
            self.done.append((began, time.monotonic() - began, outcome))
            n += THREADS


@pytest.fixture
def served(
    settings: Settings, config: Config, private_redis: PrivateRedis, tmp_path: Path
) -> Iterator[Settings]:
    """One worker pair with broker, answers, limits and cache on the private Redis."""
    on_private = on_redis(settings, private_redis.url)
    fleet = Replicas(on_private, config, 1, tmp_path / "logs")
    try:
        fleet.start()
        yield on_private
    finally:
        fleet.stop()


def test_no_call_outlasts_its_timeout_while_redis_is_paused(
    served: Settings, config: Config, private_redis: PrivateRedis
) -> None:
    scope = f"t-{uuid.uuid4().hex[:12]}"
    with Client("tests", served, config) as client:
        for n in range(RECORDS):
            client.write(scope, f"r{n}", b"probe", timeout=10)
        calls = Calls(client, scope)
        threads = [threading.Thread(target=calls.run, args=(n,)) for n in range(THREADS)]
        admin = redis.Redis.from_url(private_redis.url)
        try:
            for thread in threads:
                thread.start()
            time.sleep(1.0)
            admin.execute_command("CLIENT", "PAUSE", PAUSE_MS, "ALL")
            # Calls that began from here on found Redis paused.
            paused = time.monotonic()
            resumed = paused + PAUSE_MS / 1000
            time.sleep(PAUSE_MS / 1000 + RECOVERY_S + 1.0)
        finally:
            calls.stop.set()
            for thread in threads:
                thread.join(timeout=10)
            admin.close()
    during = [c for c in calls.done if paused <= c[0] < resumed - TIMEOUT_S]
    assert during, "no call began during the pause"
    assert all(outcome != "ok" for _, _, outcome in during), during
    slowest = max(calls.done, key=lambda c: c[1])
    assert slowest[1] <= BOUND_S, f"a call with a {TIMEOUT_S} s timeout took {slowest}"
    # Answers again: every call that began a while after the pause ended succeeded.
    after = [c for c in calls.done if c[0] >= resumed + RECOVERY_S]
    assert after, "no call began after the recovery window"
    assert all(outcome == "ok" for _, _, outcome in after), after
