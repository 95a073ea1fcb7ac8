"""The broker's epoch across a Sentinel failover.

The broker's epoch (``ds:epoch``) tells a caller that a request it waits on
may be lost: a Redis that restarted empty gets a new one. A promoted replica
carries the old one, though it lacks whatever the old primary had not yet
replicated, so on a Sentinel-managed broker every worker keeps the epoch
tied to the primary's address: :class:`EpochKeeper` asks the Sentinels which
primary serves every ``CHECK_EVERY_S`` and, finding another, ends the epoch
(``epoch.lua``: once, whichever worker finds it first). A caller waiting on a
request admitted before then sees the epoch change, waits out the grace in
which a surviving message may still be answered, and raises ``RequestLost``
(sent again under its idempotency key, a write is applied once).
"""

from __future__ import annotations

import logging
import secrets
import threading

import redis

from dataservice.redis.endpoints import primary_address
from dataservice.redis.keys import EPOCH_KEY, EPOCH_SERVER_KEY, admission_key
from dataservice.redis.scripts import LuaScript

log = logging.getLogger(__name__)

CHECK_EVERY_S = 0.5

EPOCH = LuaScript("epoch.lua", __package__ or "dataservice.broker")


def keep_epoch(client: redis.Redis, lane_queues: list[str]) -> bool:
    """Tie the epoch to the primary the Sentinels name now; True if that
    ended it (raises ``redis.RedisError``)."""
    address = primary_address(client)
    if address is None:
        return False
    keys = [EPOCH_KEY, EPOCH_SERVER_KEY, *(admission_key(queue) for queue in lane_queues)]
    ended = bool(EPOCH(client, keys, [address, secrets.token_hex(8)]))
    if ended:
        log.warning("the broker's primary is now %s: its epoch ended", address)
    return ended


class EpochKeeper:
    """:func:`keep_epoch` on ``client`` at start and every ``CHECK_EVERY_S``,
    on a thread of its own, until stopped; ``client`` stays its owner's."""

    def __init__(self, client: redis.Redis, lane_queues: list[str]) -> None:
        self._client = client
        self._queues = lane_queues
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epoch-keeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                keep_epoch(self._client, self._queues)
            except redis.RedisError as exc:
                # The primary is down or being replaced: asked again next beat.
                log.debug("the broker's epoch not checked: %s", type(exc).__name__)
            if self._stop.wait(CHECK_EVERY_S):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
