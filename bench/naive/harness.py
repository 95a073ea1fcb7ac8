"""The load harness's side of the naive baseline: how to start its workers,
how to tell they are up, and how to call them."""

from __future__ import annotations

import base64
import sys

from celery.exceptions import TimeoutError as CeleryTimeout

from bench.naive.app import READ_TASK, WRITE_TASK, make_app
from dataservice.config import Config
from dataservice.enums import LaneName
from dataservice.loadtest.traffic import Outcome

__all__ = ["NaiveAdapter", "make_app", "worker_argv"]


def worker_argv(
    lane: LaneName, config: Config, redis_url: str, database_url: str, delay_ms: int
) -> list[str]:
    lane_config = config.lanes[lane]
    return [
        sys.executable,
        "-m",
        "bench.naive.app",
        "--url",
        redis_url,
        "--database-url",
        database_url,
        "--queue",
        lane_config.queue,
        "--concurrency",
        str(lane_config.concurrency),
        "--delay-ms",
        str(delay_ms),
    ]


class NaiveAdapter:
    """``send_task(...).get(timeout=...)``, as a plain Celery caller does."""

    def __init__(self, redis_url: str, config: Config) -> None:
        self._app = make_app(redis_url)
        self._queues = {lane: config.lanes[lane].queue for lane in LaneName}

    def call(
        self, lane: LaneName, op: str, object_id: str, payload: bytes, timeout_s: float
    ) -> Outcome:
        if op == "read":
            name, args = READ_TASK, ["load", object_id]
        else:
            name, args = WRITE_TASK, ["load", object_id, base64.b64encode(payload).decode()]
        result = self._app.send_task(name, args=args, queue=self._queues[lane])
        try:
            result.get(timeout=timeout_s)
        except CeleryTimeout:
            return Outcome.TIMEOUT
        except Exception:
            return Outcome.ERROR
        finally:
            # Celery keeps a pending result's subscription until it is forgotten.
            result.forget()
        return Outcome.OK

    def close(self) -> None:
        self._app.close()
