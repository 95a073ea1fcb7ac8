"""Acceptance: on RabbitMQ a queued request outlives a broker restart, a
killed worker and a Redis restart.

Two batch worker processes serve writes slowed in the database
(``database.injected_delay_ms``), so that a backlog of ``WRITES`` lasts
seconds. The caller sends each write once (one attempt) and waits for every
answer. Mid-backlog:

- RabbitMQ's application is stopped and started again
  (``rabbitmqctl stop_app`` / ``start_app``) and one worker is SIGKILLed: every
  write is answered OK and applied exactly once (revision 1);
- or the Redis of the answers and admission (a server of the test's own) is
  killed and started again, empty: every queued write is still applied
  exactly once. The workers hold each answer due meanwhile and deliver it
  once Redis is back (``dataservice/worker/app.py``, ``RETRY_ANSWER_S``). Answers Redis
  held, not yet taken by their caller, are lost with it; each such caller
  hears ``DEADLINE_EXCEEDED`` at its deadline.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, text

from dataservice import Client, DataServiceError, DeadlineExceeded, Unavailable, WriteOp
from dataservice.client import Handle
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess
from tests.harness.rabbit import AMQP_REDIS_URL, fresh_vhost
from tests.harness.support import lane_workers, with_changes, with_retry

pytestmark = pytest.mark.fault

WRITES = 5_000
PER_MESSAGE = 100
# Each write sleeps this long in the database: the backlog drains in seconds.
DELAY_MS = 10
# The broker is stopped once this share of the writes is answered.
MID_BACKLOG = 0.2
# Long enough for the backlog, the restart and the redeliveries.
ANSWERS_WITHIN_S = 120
# An answer lost with Redis is reported at its deadline: no longer than needed.
LOST_ANSWERS_WITHIN_S = 25
# Answers Redis may hold, untaken, when it dies: a few batch messages' worth.
LOST_AT_MOST = 3 * PER_MESSAGE


def batch_workers(
    settings: Settings, config: Config, log_dir: Path
) -> AbstractContextManager[list[WorkerProcess]]:
    """Two batch worker processes, answering; stopped afterwards (and any started meanwhile)."""
    return lane_workers(settings, config, LaneName.BATCH, log_dir)


def _slowed(settings: Settings, tmp_path: Path, **urls: str) -> Settings:
    slow = with_changes(
        settings, tmp_path / "slow.yml", {("database", "injected_delay_ms"): DELAY_MS}
    )
    return dataclasses.replace(slow, **urls)


def _submit(client: Client, scope: str, timeout_s: float) -> list[Handle]:
    handles: list[Handle] = []
    for start in range(0, WRITES, PER_MESSAGE):
        ops = [WriteOp(scope, f"w{n}", b"once") for n in range(start, start + PER_MESSAGE)]
        handles += client.submit_many(ops, timeout=timeout_s)
    return handles


def _wait_until_answered(handles: list[Handle], share: float) -> None:
    eventually(lambda: sum(h.done() for h in handles) >= share * len(handles), timeout=60,
               message="the backlog to start draining")  # fmt: skip


def _revisions(database: Engine, scope: str) -> dict[int, int]:
    """How many records of ``scope`` have each revision."""
    with database.connect() as conn:
        rows = conn.execute(
            text("SELECT revision, COUNT(*) FROM records WHERE scope = :s GROUP BY revision"),
            {"s": scope},
        )
        return {int(revision): int(count) for revision, count in rows}


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_broker_restart_and_a_killed_worker_lose_no_accepted_write_and_apply_none_twice(
    settings: Settings, config: Config, database: Engine, scope: str, tmp_path: Path
) -> None:
    redis.Redis.from_url(AMQP_REDIS_URL).flushdb()
    amqp = _slowed(
        settings,
        tmp_path,
        broker_url=fresh_vhost("dataservice-durability"),
        result_backend_url=AMQP_REDIS_URL,
        redis_url=AMQP_REDIS_URL,
    )
    once = with_retry(config, max_attempts=1)
    with batch_workers(amqp, config, tmp_path) as workers, Client("tests", amqp, once) as client:
        handles = _submit(client, scope, ANSWERS_WITHIN_S)
        _wait_until_answered(handles, MID_BACKLOG)
        answered_before = sum(h.done() for h in handles)
        _rabbitmqctl("stop_app")
        try:
            workers[0].send_signal(signal.SIGKILL)
        finally:
            _rabbitmqctl("start_app")
        assert workers[0].wait(10) == -signal.SIGKILL
        # A replacement, as a supervisor would start.
        workers.append(
            WorkerProcess.for_lane(amqp, LaneName.BATCH, tmp_path / "batch-2.log").start()
        )
        results = client.results(handles)

    assert answered_before < WRITES, "the backlog was gone before the broker stopped"
    failures = [r for r in results if isinstance(r, DataServiceError)]
    assert failures == []
    assert _revisions(database, scope) == {1: WRITES}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_redis_restart_loses_no_queued_request(
    settings: Settings,
    config: Config,
    database: Engine,
    scope: str,
    tmp_path: Path,
    private_redis: PrivateRedis,
) -> None:
    amqp = _slowed(
        settings,
        tmp_path,
        broker_url=fresh_vhost("dataservice-durability"),
        result_backend_url=private_redis.url,
        redis_url=private_redis.url,
    )
    once = with_retry(config, max_attempts=1)
    with batch_workers(amqp, config, tmp_path), Client("tests", amqp, once) as client:
        handles = _submit(client, scope, LOST_ANSWERS_WITHIN_S)
        _wait_until_answered(handles, MID_BACKLOG)
        private_redis.signal(signal.SIGKILL)
        time.sleep(0.5)
        private_redis.start()
        results = client.results(handles)

    # Every queued write was applied, once: RabbitMQ kept the backlog.
    assert _revisions(database, scope) == {1: WRITES}
    # The workers held the answers due while Redis was down and delivered
    # them once it was back. Only answers Redis held, not yet taken, when it
    # died went with it (a few messages' worth at most), each reported at
    # its deadline (or as the result backend unreachable, to a wait that
    # asked just then).
    lost = [r for r in results if isinstance(r, DataServiceError)]
    assert len(lost) <= LOST_AT_MOST, len(lost)
    assert all(isinstance(r, DeadlineExceeded | Unavailable) for r in lost), lost
