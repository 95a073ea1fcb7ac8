"""What a fault run checks once its load is over, with the service still up.

- **The writes** (:mod:`.ledger`): no acknowledged write lost, none applied
  twice, from the records' revisions before and after the load.
- **Admission at rest**: once nothing is left to serve, every lane's
  admission hash is back to rest (nothing queued, ``admitted`` equal to
  ``done``, no request bytes held), whatever the fault did to it: a Redis
  that restarted empty rebuilds the counts from what it admits (the workers'
  completions of requests it never admitted raise ``admitted`` with ``done``
  and never take ``bytes`` below zero), so none is left negative or stuck.
  The harness waits up to the longest timeout and two seconds for the last
  requests to end.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from dataservice.config import Config
from dataservice.enums import LaneName
from dataservice.keys import admission_key
from dataservice.loadtest.ledger import check, revisions
from dataservice.loadtest.openloop import RequestRecord

_POLL_S = 0.1


class Aftermath:
    """The revisions before the load; :meth:`close` makes both checks after it."""

    def __init__(
        self, database_url: str, scope: str, broker_url: str, config: Config, settle_s: float
    ) -> None:
        self._database_url, self._scope = database_url, scope
        self._broker_url, self._config, self._settle_s = broker_url, config, settle_s
        self._before = revisions(database_url, scope)

    def close(self, records: Sequence[RequestRecord]) -> dict[str, Any]:
        writes = check(records, self._before, revisions(self._database_url, self._scope))
        return {"writes": writes, "admission": self._at_rest()}

    def _at_rest(self) -> dict[str, Any]:
        client = redis.Redis.from_url(self._broker_url, socket_timeout=2.0)
        started = time.monotonic()
        try:
            while True:
                lanes = {lane.value: _counts(client, self._config.lanes[lane].queue)
                         for lane in LaneName}  # fmt: skip
                rest = all(
                    c["depth"] == 0 and c["bytes"] == 0 and c["admitted"] == c["done"]
                    for c in lanes.values()
                )
                if rest or time.monotonic() - started >= self._settle_s:
                    break
                time.sleep(_POLL_S)
        finally:
            client.close()
        return {
            "lanes": lanes,
            "waited_s": round(time.monotonic() - started, 1),
            "verdict": rest,
        }


def _counts(client: redis.Redis, queue: str) -> dict[str, int]:
    raw = client.hmget(admission_key(queue), ["bytes", "admitted", "done"])
    bytes_, admitted, done = (int(v) if v is not None else 0 for v in raw)
    return {"depth": int(client.llen(queue)), "bytes": bytes_, "admitted": admitted, "done": done}
