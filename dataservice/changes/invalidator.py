"""A binlog transaction's changes, applied to the cache in one script (``apply.lua``)."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from dataservice.changes.rows import RecordChange
from dataservice.errors import StaleToken
from dataservice.redis.keys import CHANGES_LEASE_KEY, change_keys
from dataservice.redis.scripts import LuaScript

_APPLY = LuaScript("apply.lua", "dataservice.changes")


class Invalidator:
    def __init__(self, client: redis.Redis, tombstone_ms: int) -> None:
        self._redis = client
        self._tombstone_ms = tombstone_ms

    def apply(self, token: int, changes: Iterable[RecordChange], generations: Iterable[int]) -> int:
        """Drop every changed record's entries in both formats and each of
        ``generations``, leaving tombstones; how many entries were there.
        Raises :class:`StaleToken` when ``token`` no longer holds the lease."""
        generations = sorted(set(generations))
        keys = [CHANGES_LEASE_KEY]
        floors = []
        for change in changes:
            keys += change_keys(change.scope, change.object_id, generations)
            floors.append(change.floor)
        per_record = (len(keys) - 1) // max(len(floors), 1)
        deleted = int(_APPLY(self._redis, keys, [token, self._tombstone_ms, per_record, *floors]))
        if deleted < 0:
            raise StaleToken
        return deleted
