"""What a fault run checks once its load is over, with the service still up.

- **The writes** (:mod:`.ledger`): no acknowledged write lost, none applied
  twice, from the records' revisions before and after the load.
- **Admission at rest**: once nothing is left to serve, every lane's
  admission is back to rest (nothing queued, nothing held, no request bytes
  counted), whatever the fault did to it: a Redis that restarted empty counts
  only what it admitted, and a request lost on the way stops counting after
  its deadline and admission's grace, so no count is left negative or stuck.
  The harness waits up to the longest timeout, the grace and two seconds for
  the last requests to end or lapse.
- **Limits and controls sane**: the harness's caller holds no in-flight slot
  (a slot lost with a restarted Redis, or held by a request that never came
  back, would cap the caller for good), and the cache's rollout controls read
  as valid values (the ones set, or ``queues.yml``'s after a Redis that
  restarted empty).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from dataservice.broker import QueueDepths, queue_depths
from dataservice.cache.controls import RolloutControls
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import DataServiceError
from dataservice.limits.admission import HELD_GRACE_MS, held_size
from dataservice.redis.keys import admission_key, held_key, inflight_key
from dataservice_tools.loadtest import environment as env
from dataservice_tools.loadtest.ledger import check, revisions
from dataservice_tools.loadtest.openloop import RequestRecord
from dataservice_tools.loadtest.service import CALLER

_POLL_S = 0.1


def for_run(
    database_url: str, settings: Settings, config: Config, timeouts: Mapping[LaneName, float]
) -> Aftermath:
    """The checks of a run over the harness's records in ``database_url``,
    whose callers give up after ``timeouts``."""
    settle_s = max(timeouts.values()) + HELD_GRACE_MS / 1000 + 2.0
    return Aftermath(database_url, env.SCOPE, settings, config, settle_s)


class Aftermath:
    """The revisions before the load; :meth:`close` makes the checks after it."""

    def __init__(
        self, database_url: str, scope: str, settings: Settings, config: Config, settle_s: float
    ) -> None:
        self._database_url, self._scope = database_url, scope
        self._settings, self._config, self._settle_s = settings, config, settle_s
        self._before = revisions(database_url, scope)

    def close(self, records: Sequence[RequestRecord]) -> dict[str, Any]:
        writes = check(records, self._before, revisions(self._database_url, self._scope))
        admission = self._at_rest()
        return {"writes": writes, "admission": admission, "limits": self._limits()}

    def _limits(self) -> dict[str, Any]:
        client = redis.Redis.from_url(self._settings.redis_url, socket_timeout=2.0)
        try:
            now_ms = int(time.time() * 1000)
            slots = int(client.zcount(inflight_key(CALLER), f"({now_ms}", "+inf"))
            try:
                rollout = RolloutControls(client, self._config.cache).fetch()
                controls: dict[str, object] = {
                    "source": rollout.source,
                    "generation": rollout.generation,
                }
            except DataServiceError as exc:
                controls = {"error": str(exc)}
        finally:
            client.close()
        return {
            "inflight_slots": slots,
            "rollout": controls,
            "verdict": slots == 0 and "error" not in controls,
        }

    def _at_rest(self) -> dict[str, Any]:
        client = redis.Redis.from_url(self._settings.admission_url, socket_timeout=2.0)
        depths = queue_depths(self._settings)
        started = time.monotonic()
        try:
            while True:
                lanes = {lane.value: _counts(client, depths, self._config.lanes[lane].queue)
                         for lane in LaneName}  # fmt: skip
                rest = all(
                    c["depth"] == 0 and c["bytes"] == 0 and c["held"] == 0 for c in lanes.values()
                )
                if rest or time.monotonic() - started >= self._settle_s:
                    break
                time.sleep(_POLL_S)
        finally:
            client.close()
            depths.close()
        return {
            "lanes": lanes,
            "waited_s": round(time.monotonic() - started, 1),
            "verdict": rest,
        }


def _counts(client: redis.Redis, depths: QueueDepths, queue: str) -> dict[str, int]:
    raw = client.hmget(admission_key(queue), ["bytes", "admitted", "done"])
    bytes_, admitted, done = (int(v) if v is not None else 0 for v in raw)
    # A held request lapses when the next publish looks: look as it would.
    now_ms = int(time.time() * 1000)
    lapsed = [
        m.decode() if isinstance(m, bytes) else str(m)
        for m in client.zrangebyscore(held_key(queue), "-inf", now_ms)
    ]
    lapsed_bytes = sum(held_size(m) for m in lapsed)
    return {
        "depth": depths.depth(queue),
        "held": int(client.zcount(held_key(queue), f"({now_ms}", "+inf")),
        "bytes": max(bytes_ - lapsed_bytes, 0),
        "lapsed": len(lapsed),
        "admitted": admitted,
        "done": done,
    }
