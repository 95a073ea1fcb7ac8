"""The naive baseline for ``dataservice loadtest --system naive``: the same
record operations as a plain Celery app.

What a team would write first, with library defaults:

- JSON task messages (payloads base64-encoded) and Celery's Redis result
  backend, awaited with ``AsyncResult.get(timeout=...)``;
- one SQLAlchemy engine per worker process with ``create_engine`` defaults
  (``QueuePool``: 5 connections plus 10 overflow, a transaction per call);
- Celery's default worker options (prefetch multiplier 4, early
  acknowledgement), the threads pool with as many threads as the lane has
  permits (:func:`threads`);
- no deadline on the message, no admission, no permits, no connection-rate
  limit.

Its threads are the lane's permits, not the lane's thread count: a thread
here holds a connection and runs its statements for its whole task, so its
threads are its statements at once, while the service's threads beyond its
permits only get the next message ready. With the lane's threads (8 on the
batch lane for 3 permits) the baseline ran 45 statements at once in overload
where three replicas' permits are 30, and its goodput counted database work
no budget allows: a comparison with a system that keeps to the budget then
says nothing. With its permits it stays within the share the harness holds
the service's replicas to (its ``baseline_within_share`` verdict), and the
two are compared on the same database budget.

``--delay-ms`` runs ``SELECT SLEEP`` on the same connection before each
operation, as the service's slow-db hook does, so both systems face the same
database; ``--delay-table`` runs the service's own statement that reads the
sleep from the run's delay table (``database.injected_delay_table``), so a
run that changes the database's speed changes it for both.

Worker: ``python -m dataservice_tools.loadtest.naive --url redis://.../7
--database-url ... --queue interactive --concurrency 7``. The harness starts
its workers with :func:`worker` and calls them through :class:`NaiveAdapter`.
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from celery import Celery
from celery.exceptions import TimeoutError as CeleryTimeout
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.dialects.mysql import insert

from dataservice.compat.celery import PER_TASK_LOGGERS
from dataservice.config.model import Config, LaneConfig
from dataservice.enums import LaneName
from dataservice.errors import DeadlineExceeded
from dataservice.identifiers import TABLE
from dataservice.ops.processes import WorkerProcess, node_name, worker_environ
from dataservice.store.schema import records
from dataservice.store.sessions import InjectedDelay

READ_TASK = "naive.read"
WRITE_TASK = "naive.write"


class _Process:
    """Per-process state: the engine (made on first use) and the injected sleep."""

    engine: Engine | None = None
    lock = threading.Lock()
    sleep: tuple[str, tuple[int, ...]] | None = None


def engine() -> Engine:
    """The process's engine, created on first use with the library defaults."""
    with _Process.lock:
        if _Process.engine is None:
            _Process.engine = create_engine(os.environ["NAIVE_DATABASE_URL"])
        return _Process.engine


def _maybe_sleep(conn: Any) -> None:
    if _Process.sleep is not None:
        conn.exec_driver_sql(*_Process.sleep)


def read(scope: str, object_id: str) -> dict[str, Any] | None:
    with engine().begin() as conn:
        _maybe_sleep(conn)
        row = conn.execute(
            select(records.c.revision, records.c.payload).where(
                records.c.scope == scope, records.c.object_id == object_id
            )
        ).first()
    if row is None:
        return None
    return {"revision": row.revision, "payload": base64.b64encode(row.payload).decode()}


def write(scope: str, object_id: str, payload_b64: str) -> int:
    payload = base64.b64decode(payload_b64)
    now = func.utc_timestamp(6)
    statement = insert(records).values(
        scope=scope,
        object_id=object_id,
        revision=1,
        payload=payload,
        created_at=now,
        updated_at=now,
    )
    statement = statement.on_duplicate_key_update(
        revision=records.c.revision + 1, payload=statement.inserted.payload, updated_at=now
    )
    with engine().begin() as conn:
        _maybe_sleep(conn)
        conn.execute(statement)
        revision = conn.execute(
            select(records.c.revision).where(
                records.c.scope == scope, records.c.object_id == object_id
            )
        ).scalar_one()
    return int(revision)


def make_app(url: str) -> Celery:
    app = Celery("naive", set_as_current=False)
    app.conf.update(
        broker_url=url,
        result_backend=url,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        result_expires=300,
    )
    app.task(name=READ_TASK)(read)
    app.task(name=WRITE_TASK)(write)
    return app


def threads(lane: LaneConfig) -> int:
    """A baseline worker's threads on ``lane``: its permits."""
    return lane.permits


def worker(
    config: Config,
    redis_url: str,
    database_url: str,
    delay_ms: int,
    lane: LaneName,
    log_path: Path,
) -> WorkerProcess:
    """A baseline worker for ``lane``'s queue, with :func:`threads` threads and
    ``config``'s injected delay, fixed or from its table (not started)."""
    lane_config = config.lanes[lane]
    table = config.database.injected_delay_table
    argv = [
        sys.executable, "-m", "dataservice_tools.loadtest.naive",
        "--url", redis_url, "--database-url", database_url, "--queue", lane_config.queue,
        "--concurrency", str(threads(lane_config)), "--delay-ms", str(delay_ms),
        *(("--delay-table", table) if table else ()),
    ]  # fmt: skip
    return WorkerProcess(argv, worker_environ(), log_path, f"naive-{lane.value}")


class NaiveAdapter:
    """``send_task(...).get(timeout=...)``, as a plain Celery caller does."""

    def __init__(self, redis_url: str, config: Config) -> None:
        self._app = make_app(redis_url)
        self._queues = {lane: config.lanes[lane].queue for lane in LaneName}

    def call(
        self, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
    ) -> None:
        if op == "read":
            name, args = READ_TASK, ["load", object_id]
        else:
            name, args = WRITE_TASK, ["load", object_id, base64.b64encode(payload).decode()]
        result = self._app.send_task(name, args=args, queue=self._queues[lane])
        try:
            result.get(timeout=timeout_s)
        except CeleryTimeout as exc:
            raise DeadlineExceeded(f"no answer within {timeout_s} s") from exc
        finally:
            # Celery keeps a pending result's subscription until it is forgotten.
            result.forget()

    def close(self) -> None:
        self._app.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="Redis URL: broker and result backend")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--delay-table", help="read the sleep from this one-row table instead")
    args = parser.parse_args(argv)
    if args.delay_table is not None and not re.fullmatch(TABLE, args.delay_table):
        parser.error(f"--delay-table: not a table name: {args.delay_table!r}")
    os.environ["NAIVE_DATABASE_URL"] = args.database_url
    delay = InjectedDelay.of(args.delay_ms, args.delay_table)
    _Process.sleep = None if delay is None else delay.unbounded()
    logging.basicConfig(level="INFO", stream=sys.stderr)
    # Celery's per-task lines would drown the log at these rates.
    for name in PER_TASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    app = make_app(args.url)
    worker = app.Worker(
        hostname=node_name(f"naive-{args.queue}"),
        queues=[args.queue],
        pool="threads",
        concurrency=args.concurrency,
        loglevel="INFO",
    )
    worker.start()


if __name__ == "__main__":
    main()
