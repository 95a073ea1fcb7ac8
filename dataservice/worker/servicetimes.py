"""Every second, a worker says how long its lane's answered requests take once
dequeued (per operation, the p90 and the mean), where admission reads it
(:func:`dataservice.limits.admission.publish_service_times`)."""

from __future__ import annotations

import logging
import threading

import redis

from dataservice.handler.durations import RecentDurations
from dataservice.limits.admission import LaneAdmission, publish_service_times

log = logging.getLogger(__name__)

INTERVAL_S = 1.0


class ServiceTimesPublisher:
    """On ``client`` (short timeouts: a slow broker skips a beat, never holds
    the worker up), which stays its owner's."""

    def __init__(
        self, client: redis.Redis, lane: LaneAdmission, times: RecentDurations[str]
    ) -> None:
        self._client = client
        self._lane = lane
        self._times = times
        self._said = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="service-times", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            recorded, times = self._times.snapshot()
            # Only while answering: an idle worker's estimate would keep an old
            # figure looking fresh, and the lane idle, nothing needs it.
            if recorded == self._said:
                continue
            p90 = {operation: t.p90 for operation, t in times.items()}
            mean = {operation: t.mean for operation, t in times.items()}
            try:
                publish_service_times(self._client, self._lane, p90, mean)
            except redis.RedisError as exc:
                log.debug("service times not said: %s", type(exc).__name__)
                continue
            self._said = recorded
