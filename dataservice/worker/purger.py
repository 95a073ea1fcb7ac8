"""The batch lane's background work: expired idempotency outcomes go."""

from __future__ import annotations

import logging
import threading

from dataservice.config.model import Config
from dataservice.enums import OperationClass
from dataservice.limits.permits import LanePermits
from dataservice.store import Bounds, RecordStore
from dataservice.store.connections import now_ms

log = logging.getLogger(__name__)


class OutcomePurger:
    """Deletes expired idempotency outcomes, one bounded statement at a time,
    each under a batch-lane write permit like any other write."""

    def __init__(self, store: RecordStore, permits: LanePermits, config: Config) -> None:
        self._store = store
        self._permits = permits
        self._config = config
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="purge-idempotency", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        settings = self._config.idempotency
        while not self._stop.wait(settings.purge_interval_s):
            try:
                while not self._stop.is_set():
                    with self._permits.acquire(OperationClass.POINT_WRITE, 1.0) as permit:
                        deadline = now_ms() + self._config.database.max_statement_ms
                        purged = self._store.purge_idempotency(
                            settings.purge_batch, Bounds(permit, deadline)
                        )
                    if purged < settings.purge_batch:
                        break
            except Exception as exc:
                # Whatever went wrong (the database away, a connect ramp, no
                # permit), the next round tries again: the thread must not end.
                log.warning("purging expired idempotency outcomes: %s", type(exc).__name__)
