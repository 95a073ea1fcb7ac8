"""The cache's rollout controls: kept in Redis, read by every replica.

Operators change them at runtime (``dataservice cache``, ``docs/cache.md``,
"Rollout controls"); each change is one script (``rollout.lua``) that writes
the hash at :data:`~dataservice.redis.keys.ROLLOUT_KEY` and appends who changed
what to the stream at :data:`~dataservice.redis.keys.AUDIT_KEY`. Until the first
change, Redis holds nothing and the values are queues.yml's
(``cache.rollout``), generation 1.

A replica keeps what it read for ``cache.controls_max_age_ms``, so the hot
path costs a clock call; a Redis that does not answer leaves it with the
values it had.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable

import redis

from dataservice.cache.rollout import (
    AuditEntry,
    Change,
    Rollout,
    audit_entry,
    check_format,
    check_percent,
    check_shadow,
    decoded,
    decoded_pairs,
    from_hash,
    joined,
    to_hash,
)
from dataservice.config.cache import CacheConfig
from dataservice.enums import CacheFormat
from dataservice.errors import DataServiceError, InvalidControl, ServiceSetupError
from dataservice.redis.keys import AUDIT_KEY, ROLLOUT_KEY, SHADOW_KEY
from dataservice.redis.scripts import LuaScript

# Rollout, Change and AuditEntry are part of this module's API, as its callers use them.
__all__ = ["UNCHANGED", "AuditEntry", "Change", "Rollout", "RolloutControls", "Unchanged"]

log = logging.getLogger(__name__)

_SCRIPT = LuaScript("rollout.lua", "dataservice.cache")
# Changes come a few a day; a thousand is months of history in a few hundred kB.
AUDIT_MAXLEN = 1000


class Unchanged(enum.Enum):
    """``change(read=...)``'s default: None already means "read no format"."""

    UNCHANGED = "unchanged"


UNCHANGED = Unchanged.UNCHANGED


class RolloutControls:
    """One replica's view of the controls, and the operators' way to change them.

    A change is not idempotent (a rotation run twice rotates twice): where
    changes are made, ``client`` should not retry commands, as redis-py does
    by default (``dataservice cache`` gives it ``retries=0``)."""

    def __init__(
        self,
        client: redis.Redis,
        config: CacheConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._clock = clock
        self._max_age_s = config.controls_max_age_ms / 1000
        rollout = config.rollout
        self.defaults = Rollout(
            fill=frozenset(rollout.fill),
            read=rollout.read,
            percent=rollout.percent,
            bypass=False,
            shadow=rollout.shadow,
            generation=1,
            rotated_at_ms=0,
            source="defaults",
        )
        # One attribute, so a reader never pairs one refresh's values with
        # another's expiry. -inf: nothing read yet.
        self._held: tuple[Rollout, float] = (self.defaults, float("-inf"))
        self._refreshing = threading.Lock()
        self._failing = False

    def current(self) -> Rollout:
        """The values, read from Redis at most every ``controls_max_age_ms``;
        on a Redis error, the last values read (or the defaults). Never raises."""
        rollout, fresh_until = self._held
        if self._clock() < fresh_until:
            return rollout
        return self._refresh()

    @property
    def client(self) -> redis.Redis:
        """The Redis the controls live in (the change stream reports there too)."""
        return self._client

    def fetch(self) -> Rollout:
        """The values in Redis now, not this replica's copy.

        Raises :class:`ServiceSetupError` when Redis does not answer, and
        :class:`InvalidControl` when it holds a value no change writes."""
        try:
            raw = self._client.hgetall(ROLLOUT_KEY)
        except redis.RedisError as exc:
            raise _unreachable(exc) from None
        fields = {decoded(k): decoded(v) for k, v in raw.items()}
        source = "redis" if fields else "defaults"
        return from_hash({**to_hash(self.defaults), **fields, "source": source})

    def change(
        self,
        who: str,
        *,
        fill: frozenset[CacheFormat] | None = None,
        read: CacheFormat | Unchanged | None = UNCHANGED,
        percent: int | None = None,
        bypass: bool | None = None,
        shadow: int | None = None,
    ) -> Change:
        """Set the controls given (the others keep their values), in one step
        that also records it. A bad value raises :class:`InvalidControl` and
        changes nothing."""
        pairs: list[str] = []
        if fill is not None:
            pairs += ["fill", joined(frozenset(check_format(f, "fill") for f in fill))]
        if read is not UNCHANGED:
            pairs += ["read", "" if read is None else check_format(read, "read").value]
        if percent is not None:
            pairs += ["percent", str(check_percent(percent))]
        if bypass is not None:
            pairs += ["bypass", "1" if bypass else "0"]
        if shadow is not None:
            pairs += ["shadow", str(check_shadow(shadow))]
        if not pairs:
            raise InvalidControl("no rollout control to change")
        return self._apply(who, "change", pairs)

    def rotate(self, who: str) -> Change:
        """Start the next namespace generation: every existing entry becomes unreachable."""
        return self._apply(who, "rotate", [])

    def history(self, limit: int = 10) -> list[AuditEntry]:
        """The last ``limit`` changes, newest first. Raises :class:`ServiceSetupError`
        when Redis does not answer."""
        try:
            entries = self._client.xrevrange(AUDIT_KEY, count=limit) or []
        except redis.RedisError as exc:
            raise _unreachable(exc) from None
        return [audit_entry(decoded(entry_id), fields or {}) for entry_id, fields in entries]

    def _apply(self, who: str, action: str, pairs: list[str]) -> Change:
        if not who.strip():
            raise InvalidControl("a change must name who makes it")
        defaults = to_hash(self.defaults)
        args = [who, action, AUDIT_MAXLEN, defaults["fill"], defaults["read"], defaults["percent"]]
        args.append(defaults["shadow"])
        keys = [ROLLOUT_KEY, AUDIT_KEY, SHADOW_KEY]
        try:
            before, after = _SCRIPT(self._client, keys, [*args, *pairs])
        except redis.RedisError as exc:
            raise _unreachable(exc) from None
        change = Change(from_hash(decoded_pairs(before)), from_hash(decoded_pairs(after)))
        # This replica sees its own change at once; the others within the max age.
        self._held = (change.after, self._clock() + self._max_age_s)
        log.info("rollout controls: %s by %s: %s -> %s", action, who, change.before, change.after)
        return change

    def _refresh(self) -> Rollout:
        # Once anything is known, one thread reads Redis and the others go on
        # with what they have rather than queue behind a slow Redis.
        first = self._held[1] == float("-inf")
        if not self._refreshing.acquire(blocking=first):
            return self._held[0]
        try:
            rollout, fresh_until = self._held
            now = self._clock()
            if now < fresh_until:
                return rollout
            try:
                rollout = self.fetch()
            except DataServiceError as exc:
                if not self._failing:
                    log.warning("rollout controls: %s; keeping %s", exc, rollout)
                self._failing = True
            else:
                if self._failing:
                    log.info("rollout controls: read from Redis again: %s", rollout)
                self._failing = False
            # A failed read waits out the max age too: a Redis that does not
            # answer costs each replica one timeout per max age, not every read.
            self._held = (rollout, now + self._max_age_s)
            return rollout
        finally:
            self._refreshing.release()


def _unreachable(exc: redis.RedisError) -> ServiceSetupError:
    # redis-py's text names the host and port, never the URL's password.
    return ServiceSetupError(f"the rollout controls' Redis failed: {type(exc).__name__}: {exc}")
