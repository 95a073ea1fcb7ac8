"""Exactly one active change consumer: a Redis lease with a fencing token.

A consumer that takes the lease gets a token larger than any before it; it
keeps the lease by renewing it well within ``changes.lease_ms``, and every
invalidation it applies (``apply.lua``) and every position it saves carries
the token, so a consumer that lost the lease (paused, partitioned) and wakes
up can no longer change anything. A standby takes the lease once it lapses.

The counter lives in Redis; the database keeps the largest token a position
was saved with. A Redis that lost its data (a restart without persistence)
starts the counter again, below it, and the database would ignore every save:
:meth:`Lease.outrank` raises the counter past it and gives the lease up, so
the next holder's token is larger again.
"""

from __future__ import annotations

import logging

import redis

from dataservice.errors import LeaseLost
from dataservice.redis.keys import CHANGES_FENCE_KEY, CHANGES_LEASE_KEY
from dataservice.redis.scripts import LuaScript

_LEASE = LuaScript("lease.lua", "dataservice.changes")
log = logging.getLogger(__name__)


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

    def outrank(self, token: int, saved: int) -> None:
        """Raise :class:`LeaseLost`, the lease given up, if ``token`` is below
        ``saved`` (the largest token a position was saved with), after raising
        the counter past ``saved``."""
        if token >= saved:
            return
        log.warning(
            "change consumer: token %d is below the saved positions' %d (Redis lost the "
            "fencing-token counter): raising it and taking the lease again",
            token,
            saved,
        )
        current = int(self._redis.get(CHANGES_FENCE_KEY) or 0)
        if current < saved:
            # An increment, not a SET: a take between the two commands cannot
            # be undone, only overtaken.
            self._redis.incrby(CHANGES_FENCE_KEY, saved - current)
        self.release(token)
        raise LeaseLost
