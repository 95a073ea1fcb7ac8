"""Bursts of concurrent reads: many threads released together, each read's
timing and outcome kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import ReadMode
from dataservice.errors import DataServiceError
from dataservice.types import Record

# Threads share a client 50 at a time: each client publishes on one broker
# connection, so a burst's publishes go out on several at once.
_THREADS_PER_CLIENT = 50


@dataclass(frozen=True, slots=True)
class Outcome:
    """One read of a burst: when it was sent and answered (monotonic s), and
    the record or the error's name."""

    object_id: str
    started: float
    ended: float
    record: Record | None
    error: str = ""

    @property
    def latency_ms(self) -> float:
        return (self.ended - self.started) * 1000


def burst(
    settings: Settings,
    config: Config,
    caller: str,
    scope: str,
    object_ids: Sequence[str],
    threads: int,
    timeout_s: float,
    mode: ReadMode = ReadMode.ALLOW_CACHED,
) -> list[Outcome]:
    """One read per entry of ``object_ids`` (an id listed
    twice is read twice), from ``threads`` threads released together; each
    thread's reads follow one another, ``threads`` of them at once.

    ``config``'s client retry policy applies: give it one attempt to see
    every answer as the service gave it."""
    clients = [Client(caller, settings, config) for _ in range(-(-threads // _THREADS_PER_CLIENT))]
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def reader(n: int) -> None:
        client = clients[n // _THREADS_PER_CLIENT]
        mine = object_ids[n::threads]
        start.wait()
        for object_id in mine:
            began = time.monotonic()
            record, error = None, ""
            try:
                record = client.read(scope, object_id, mode=mode, timeout=timeout_s)
            except DataServiceError as exc:
                reason = getattr(exc, "reason", "")
                error = f"{type(exc).__name__}({reason})" if reason else type(exc).__name__
            outcome = Outcome(object_id, began, time.monotonic(), record, error)
            with lock:
                outcomes.append(outcome)

    workers = [threading.Thread(target=reader, args=(n,), daemon=True) for n in range(threads)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout_s + 30)
    finally:
        for client in clients:
            client.close()
    return outcomes


def sent_before_first_answer(outcomes: Sequence[Outcome]) -> int:
    """How many reads were on their way before any was answered: the burst's
    real concurrency on the cold key."""
    first = min(o.ended for o in outcomes)
    return sum(o.started < first for o in outcomes)
