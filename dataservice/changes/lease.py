"""Exactly one active change consumer: a Redis lease with a fencing token.

A consumer that takes the lease gets a token larger than any before it; it
keeps the lease by renewing it well within ``changes.lease_ms``, and every
invalidation it applies (``apply.lua``) and every position it saves carries
the token, so a consumer that lost the lease (paused, partitioned) and wakes
up can no longer change anything. A standby takes the lease once it lapses.
"""

from __future__ import annotations

import redis

from dataservice.keys import CHANGES_FENCE_KEY, CHANGES_LEASE_KEY
from dataservice.limits.scripts import LuaScript

_LEASE = LuaScript("lease.lua", "dataservice.changes")


class Lease:
    def __init__(self, client: redis.Redis, lease_ms: int) -> None:
        self._redis = client
        self._lease_ms = lease_ms

    def take(self) -> int | None:
        """A new token if the lease was free, else None."""
        token = int(
            _LEASE(self._redis, [CHANGES_LEASE_KEY, CHANGES_FENCE_KEY], [self._lease_ms, ""])
        )
        return token or None

    def renew(self, token: int) -> bool:
        """Whether ``token`` still holds the lease (now renewed)."""
        keys = [CHANGES_LEASE_KEY, CHANGES_FENCE_KEY]
        return int(_LEASE(self._redis, keys, [self._lease_ms, token])) == token

    def release(self, token: int) -> None:
        """Let a standby take over at once (only if ``token`` still holds it)."""
        if self.renew(token):
            self._redis.pexpire(CHANGES_LEASE_KEY, 1)
