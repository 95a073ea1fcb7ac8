"""Acceptance: with a short visibility timeout and long deadlines, a worker
SIGKILLed while it holds reserved cached reads does not lose them: another
replica answers every one of them after redelivery, and ``celery inspect
active_queues`` (and so Flower) lists every worker and its lane meanwhile.

Two ``dataservice worker --lane interactive`` replicas on Redis db 6, both with
``broker.visibility_timeout_s: 2`` and ``broker.restore_every_s: 1``. Every
database operation of replica A first sleeps ``HOLD_MS``
(``database.injected_delay_ms``), so the cold ``ALLOW_CACHED`` reads it takes
(each a miss) hold all its threads, and with them its prefetch window: kombu's
``unacked`` hash then holds one of A's messages per thread. Which replica
takes what is settled with Celery's own control commands: B seeds and warms
the records, stops consuming, and starts again once A holds its window full.

Each read makes one attempt (no client retry) with a 30 s timeout, so every
answer is the one to the message first published, whoever gave it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from celery import Celery
from dataservice_tools.localservices import free_port, redis_reachable
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import Client
from dataservice.broker.celery import celery_app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from dataservice.redis.keys import REPLAY_PREFIX, RESULT_PREFIX
from dataservice.types import Record
from tests.conftest import require
from tests.harness.livecache import served_lookups
from tests.harness.support import on_redis, scraped, with_changes, with_retry

OWN_REDIS_URL = "redis://127.0.0.1:6379/6"
VISIBILITY_TIMEOUT_S = 2
SHORT_VISIBILITY: dict[tuple[str, ...], object] = {
    ("broker", "visibility_timeout_s"): VISIBILITY_TIMEOUT_S,
    ("broker", "restore_every_s"): 1,
}
# Long past the moment A holds its window full and is killed (well under a
# second), so that A never answers a read itself.
HOLD_MS = 4000
TIMEOUT_S = 30.0
WARM = ("warm-0", "warm-1", "warm-2")
# kombu's Redis transport keeps each delivered, unacknowledged message here.
UNACKED = "unacked"

Answer = tuple[Record, float, float]  # the record, when it was asked for, when answered


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(OWN_REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def variants(
    settings: Settings, database: Engine, broker: redis.Redis, tmp_path: Path
) -> tuple[Settings, Settings, Config]:
    """B's settings, A's (the same, but slow in the database), and their
    configuration; the records live in the migrated test ``database``."""
    fast = with_changes(
        on_redis(settings, OWN_REDIS_URL), tmp_path / "replica.yml", SHORT_VISIBILITY
    )
    slow = with_changes(fast, tmp_path / "slow.yml", {("database", "injected_delay_ms"): HOLD_MS})
    return fast, slow, fast.load()


def _replica(settings: Settings, log: Path, *extra: str) -> WorkerProcess:
    return WorkerProcess.for_lane(settings, LaneName.INTERACTIVE, log, *extra).start()


def _node(control: Celery, worker: WorkerProcess) -> str:
    """The worker's node name (``interactive-<pid>@host``), as its ping reply gives it."""
    for reply in control.control.ping(timeout=1.0) or []:
        node = str(next(iter(reply)))
        if node.partition("@")[0].endswith(f"-{worker.pid}"):
            return node
    raise AssertionError(f"worker {worker.pid} does not answer a ping")


def _consume(control: Celery, node: str, queue: str, *, on: bool) -> None:
    command = control.control.add_consumer if on else control.control.cancel_consumer
    replies = command(queue, destination=[node], reply=True, timeout=5.0)
    assert replies, f"{node} did not answer {command.__name__}"


def _pops_waiting(broker: redis.Redis) -> int:
    """Consumers blocked in BRPOP on the broker's database right now."""
    db = str(broker.get_connection_kwargs().get("db", 0))
    return sum(
        1
        for client in broker.client_list()
        if client.get("cmd") == "brpop" and "b" in client.get("flags", "") and client["db"] == db
    )


def _read(client: Client, scope: str, object_id: str) -> Answer:
    asked = time.monotonic()
    record = client.read(scope, object_id, timeout=TIMEOUT_S)
    return record, asked, time.monotonic()


def _seed(client: Client, scope: str, cold: list[str]) -> dict[str, Record]:
    """Write every record, and warm ``WARM`` (one read fills, the next hits);
    the cold records are read ``PRIMARY``, which fills nothing."""
    expected = {}
    for object_id in (*cold, *WARM):
        written = client.write(scope, object_id, object_id.encode())
        mode = ReadMode.ALLOW_CACHED if object_id in WARM else ReadMode.PRIMARY
        expected[object_id] = client.read(scope, object_id, mode=mode)
        assert expected[object_id].revision == written.revision
    for object_id in WARM:
        assert client.read(scope, object_id) == expected[object_id]
    return expected


def _held_and_listed(
    control: Celery, broker: redis.Redis, a: WorkerProcess, b_node: str, queue: str, threads: int
) -> None:
    """Until A holds a read on every thread; then B consumes again, and both
    are listed with their lane while A's pool is full."""
    a_node = _node(control, a)
    eventually(
        lambda: broker.hlen(UNACKED) == threads,
        timeout=10.0,
        interval=0.002,
        message="A holding a read on every thread",
    )
    assert broker.llen(queue) == 0
    _consume(control, b_node, queue, on=True)
    inspect = control.control.inspect(destination=[a_node, b_node], timeout=5.0)
    queues = inspect.active_queues() or {}
    listed = {node: [q["name"] for q in consumed] for node, consumed in queues.items()}
    assert listed == {a_node: [queue], b_node: [queue]}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_replica_killed_holding_cached_reads_loses_none_of_them(
    variants: tuple[Settings, Settings, Config], broker: redis.Redis, scope: str, tmp_path: Path
) -> None:
    settings, slow, config = variants
    queue, threads = config.lanes.interactive.queue, config.lanes.interactive.concurrency
    # Distinct keys: concurrent misses of one key would share one read.
    cold = [f"cold-{n}" for n in range(threads)]
    control = celery_app("redelivery-control", settings, config)
    port = free_port()
    b = _replica(settings, tmp_path / "b.log", "--metrics-port", str(port))
    a: WorkerProcess | None = None
    try:
        wait_answering(control, [b])
        b_node = _node(control, b)
        with (
            Client("tests", settings, with_retry(config, max_attempts=1)) as client,
            ThreadPoolExecutor(threads) as pool,
        ):
            expected = _seed(client, scope, cold)
            _consume(control, b_node, queue, on=False)
            # A pop B sent before the cancel could still take a message.
            eventually(
                lambda: _pops_waiting(broker) == 0,
                timeout=10.0,
                interval=0.002,
                message="B's last BRPOP",
            )
            a = _replica(slow, tmp_path / "a.log")
            wait_answering(control, [a, b])

            held = {oid: pool.submit(_read, client, scope, oid) for oid in cold}
            _held_and_listed(control, broker, a, b_node, queue, threads)
            hits = served_lookups(port, "hit")
            warm = [_read(client, scope, oid) for oid in WARM]
            # Still A's: every cold read unanswered and unacknowledged.
            assert broker.hlen(UNACKED) == threads
            assert not any(answer.done() for answer in held.values())
            a.send_signal(signal.SIGKILL)
            assert a.wait(5) == -signal.SIGKILL
            killed_at = time.monotonic()
            warm += [_read(client, scope, oid) for oid in WARM]
            answers = {oid: answer.result(TIMEOUT_S + 5) for oid, answer in held.items()}
        # A hit is counted just after its answer went out: the caller may be first.
        eventually(lambda: served_lookups(port, "hit") - hits >= len(warm), timeout=2)
        assert served_lookups(port, "hit") - hits == len(warm)
        # Every worker still alive, and only those, answers with its lane.
        queues = control.control.inspect(timeout=1.0).active_queues() or {}
        assert {node: [q["name"] for q in consumed] for node, consumed in queues.items()} == {
            b_node: [queue]
        }
        assert scraped(port, "dataservice_rejections", lane="interactive", reason="replayed") == 0
    finally:
        stop_all([w for w in (a, b) if w is not None], 15)
        control.close()

    for object_id, (record, asked, answered) in answers.items():
        assert record == expected[object_id]
        assert killed_at < answered < asked + TIMEOUT_S
    for object_id, (record, asked, answered) in zip(WARM * 2, warm, strict=True):
        assert record == expected[object_id]
        # From the cache, by B: never held up behind A's reads.
        assert answered - asked < VISIBILITY_TIMEOUT_S
    eventually(
        lambda: broker.hlen(UNACKED) == 0,
        timeout=10.0,
        interval=0.002,
        message="every message acknowledged",
    )
    assert broker.llen(queue) == 0
    # Answered once each: a second answer would still wait under its result key.
    assert list(broker.scan_iter(f"{RESULT_PREFIX}*")) == []
    # The gate let each cold read through a second time, and only those.
    markers = [broker.get(key) for key in broker.scan_iter(f"{REPLAY_PREFIX}tests:*")]
    assert markers.count(b"2") == threads  # a second delivery each
