"""Acceptance: the cache's Redis stalls, then dies, under steady reads of warm
keys; reads go on from the database within its budget, the breaker opens, and
once Redis is back the cache serves again within seconds.

The cache's Redis (``DATASERVICE_REDIS_URL``) is a redis-server of the test's
own; the broker and the result backend stay on the shared Redis, so requests
still flow. Two interactive worker replicas serve ``THREADS`` caller threads
reading ``KEYS`` warm records, one attempt each. Redis is first stopped with
SIGSTOP (a stall: connections open, nothing answers, every command waits out
``cache.socket_timeout_ms``), then killed (connections refused), then started
again, empty, on the same port.

That Redis also holds the callers' shared limits. While it is down each
replica's gate falls back to its local share of each limit
(``dataservice/limits/gate.py``): for the test caller that is a tenth of
100,000 requests/s and of 10,000 in flight, far above this load, so no read is
refused for that reason.
"""

from __future__ import annotations

import dataclasses
import math
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.bursts import burst
from dataservice_tools.testkit.counting_database import CountingDatabase
from dataservice_tools.testkit.replicas import Replicas, replicas
from dataservice_tools.testkit.waits import eventually

from dataservice import Client, DataServiceError, RetryableError
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from tests.harness.support import scraped, scraped_sample, with_retry

REPLICAS = 2
THREADS = 4
KEYS = [f"warm-{n}" for n in range(20)]
PAYLOAD = b"from the database if need be" * 8
UP_S, STALL_S, DOWN_S = 2.0, 3.0, 3.0
# After Redis is back: the breaker's next probe (cache.breaker.open_ms), then a
# refill of the emptied cache.
RECOVERY_S = 5.0
MIN_SUCCESS_RATE = 0.95


@dataclass
class Load:
    """``THREADS`` callers reading the warm keys in turn until stopped: when
    each read started, and whether it succeeded or failed retryably."""

    client: Client
    scope: str
    stop: threading.Event = field(default_factory=threading.Event)
    reads: list[tuple[float, str]] = field(default_factory=list)

    def run(self, n: int) -> None:
        while not self.stop.is_set():
            began, outcome = time.monotonic(), "ok"
            try:
                self.client.read(self.scope, KEYS[n % len(KEYS)], timeout=5)
            except RetryableError as exc:
                outcome = f"retryable {type(exc).__name__}"
            except DataServiceError as exc:
                outcome = type(exc).__name__
            self.reads.append((began, outcome))
            n += THREADS

    def between(self, start: float, end: float) -> list[str]:
        return [outcome for began, outcome in self.reads if start <= began < end]


@dataclass
class Samples:
    """What the database and the replicas' metrics show, sampled in the background."""

    database: CountingDatabase
    ports: list[int]
    stop: threading.Event = field(default_factory=threading.Event)
    connections: list[tuple[float, int]] = field(default_factory=list)
    breakers: list[tuple[float, list[float]]] = field(default_factory=list)

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            self.connections.append((now, self.database.connections()))
            states = [scraped_sample(p, "dataservice_cache_breaker", lane="interactive")
                      for p in self.ports]  # fmt: skip
            self.breakers.append((now, states))
            time.sleep(0.05)


def _total(ports: list[int], name: str, **labels: str) -> float:
    return sum(scraped(port, name, lane="interactive", **labels) for port in ports)


def _hits(ports: list[int]) -> float:
    return _total(ports, "dataservice_cache_reads", format="v2", outcome="hit")


def _failures(ports: list[int], dependency: str = "cache") -> list[float]:
    return [scraped(p, "dataservice_dependency_failures", lane="interactive",
                    dependency=dependency) for p in ports]  # fmt: skip


@dataclass(frozen=True)
class Outage:
    stalled: float  # monotonic s: SIGSTOP
    killed: float  # SIGKILL
    back: float  # started again
    served_again_s: float  # from ``back`` until hits rose again
    database_reads: int  # of the warm keys, from SIGSTOP to ``back``
    cache_failures: list[float]  # per replica, from SIGSTOP to ``back``
    limits_fallbacks: float  # times a gate fell back to its local share, meanwhile


def _outage(
    private_redis: PrivateRedis, ports: list[int], database: CountingDatabase, scope: str
) -> Outage:
    """Stall the cache's Redis, kill it, start it again; what each step cost."""
    stalled = time.monotonic()
    reads_before, failures_before = database.reads(scope), _failures(ports)
    fallbacks_before = sum(_failures(ports, "limits"))
    private_redis.signal(signal.SIGSTOP)
    time.sleep(STALL_S)
    killed = time.monotonic()
    private_redis.signal(signal.SIGKILL)
    time.sleep(DOWN_S)
    reads = database.reads(scope) - reads_before
    failures = [a - b for a, b in zip(_failures(ports), failures_before, strict=True)]
    fallbacks = sum(_failures(ports, "limits")) - fallbacks_before
    back, hits_back = time.monotonic(), _hits(ports)
    private_redis.start()
    eventually(lambda: _hits(ports) >= hits_back + 20, timeout=RECOVERY_S, interval=0.05,
               message="the cache to serve again")  # fmt: skip
    return Outage(stalled, killed, back, time.monotonic() - back, reads, failures, fallbacks)


@pytest.fixture
def fleet(
    replica_settings: Settings, private_redis: PrivateRedis, config: Config, tmp_path: Path
) -> Iterator[tuple[Settings, Replicas]]:
    # The broker and results stay where they are; only the cache (and the
    # limits beside it) move to the test's own Redis.
    settings = dataclasses.replace(replica_settings, redis_url=private_redis.url)
    with replicas(settings, config, tmp_path, REPLICAS) as started:
        yield settings, started


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.timeout(180)
def test_reads_survive_the_cache_redis_stalling_and_dying_and_the_cache_comes_back(
    fleet: tuple[Settings, Replicas],
    private_redis: PrivateRedis,
    config: Config,
    counting_database: CountingDatabase,
) -> None:
    settings, started = fleet
    ports = started.metrics_ports
    one_attempt = with_retry(config, max_attempts=1)
    scope = f"t-{uuid.uuid4().hex[:12]}"
    counting_database.seed(scope, KEYS, PAYLOAD)
    # Warm: every key read (and filled), and hits being served.
    warmed = burst(settings, one_attempt, "tests", scope, KEYS * 3, len(KEYS), 10.0)
    assert all(o.record is not None for o in warmed)
    assert _hits(ports) > 0

    client = Client("tests", settings, one_attempt)
    load = Load(client, scope)
    samples = Samples(counting_database, ports)
    threads = [threading.Thread(target=load.run, args=(n,)) for n in range(THREADS)]
    threads.append(threading.Thread(target=samples.run))
    try:
        for thread in threads:
            thread.start()
        time.sleep(UP_S)
        outage = _outage(private_redis, ports, counting_database, scope)
        time.sleep(1.0)
    finally:
        load.stop.set()
        samples.stop.set()
        for thread in threads:
            thread.join(30)
        client.close()
    stalled, killed, back = outage.stalled, outage.killed, outage.back

    # Every read succeeded or failed retryably; while Redis was stalled, and
    # while it was dead, nearly all succeeded, from the database.
    assert {o for _, o in load.reads if o != "ok" and not o.startswith("retryable")} == set()
    for start, end in ((stalled, killed), (killed, back)):
        phase = load.between(start, end)
        assert len(phase) > 50
        assert phase.count("ok") / len(phase) >= MIN_SUCCESS_RATE, Counter(phase)
    during_outage = load.between(stalled, back)
    assert outage.database_reads >= during_outage.count("ok") / 2
    # The callers' limits went on from each replica's local share.
    assert outage.limits_fallbacks > 0

    # Within the database budget: each replica's pool, one connection per
    # worker thread and at most its permits' worth at once.
    lane = config.lanes.interactive
    during = [n for t, n in samples.connections if stalled <= t < back]
    assert during, "no PROCESSLIST sample during the outage"
    assert max(during) <= REPLICAS * min(lane.concurrency, lane.permits), during

    # The breaker opened on every replica, in the stall and once Redis was
    # dead, and so cache failures stayed a handful per replica (the threads
    # caught as it opened, then one probe per open_ms) rather than one per read.
    for start, end in ((stalled, killed), (killed, back)):
        opened = [any(s[r] == 1 for t, s in samples.breakers if start <= t < end)
                  for r in range(REPLICAS)]  # fmt: skip
        assert all(opened), opened
    probes = math.ceil((back - stalled) * 1000 / config.cache.breaker.open_ms)
    bound = lane.concurrency + config.cache.breaker.failures + probes + 2
    assert all(0 < f <= bound for f in outage.cache_failures), (outage.cache_failures, bound)
    assert sum(outage.cache_failures) * 5 < len(during_outage)

    # Served again within RECOVERY_S (_outage waits no longer), breakers closed.
    after = [s for t, s in samples.breakers if t > back + outage.served_again_s + 0.5]
    assert after
    assert after[-1] == [0.0] * REPLICAS
