"""The change consumer's view of every cell's cache (dataservice.config.cells).

The lease, the saved positions and the consumer's own state live with the
first cell (its *home*); every cell's cache, the home's included, gets each
transaction's invalidations (one ``apply.lua`` per cell), its rotations and
the status its freshness guard reads.

A cell other than the home may not answer. The consumer then goes on for
the others (saving positions past what that cell has seen) and counts the
cell as *lost*: its ``ds:changes:fresh`` lapses within ``changes.max_lag_s``,
so its workers' cached reads go to the database. When it answers again, the
consumer first rotates its cache's generation (whatever changed meanwhile is
unreachable there), mirrors its token, and only ``cache.controls_max_age_ms``
later (when every replica has seen the new generation) tells the cell's
guard the cache is fresh again. A consumer that becomes active does the
same for a cell whose guard is engaged (no ``ds:changes:fresh``: no consumer
kept it fresh, so the saved position may be past what it has seen). A home
that does not answer ends the active spell, as with one cell.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dataservice.cache.controls import RolloutControls
from dataservice.changes.invalidator import Invalidator
from dataservice.changes.rows import RecordChange
from dataservice.changes.start import WHO
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import ServiceSetupError, StaleToken
from dataservice.redis import endpoints
from dataservice.redis.bounded import QUIET
from dataservice.redis.keys import CHANGES_FRESH_KEY, CHANGES_LEASE_KEY, CHANGES_LOST_KEY
from dataservice.redis.packing import packed_connection_class
from dataservice.redis.scripts import LuaScript

log = logging.getLogger(__name__)

_MIRROR = LuaScript("mirror.lua", "dataservice.changes")
T = TypeVar("T")

# The home's commands may take this long (as with one cell); another cell's
# only this: a cell that stalls (paused, cut off) costs the others' stream at
# most that per try, and a lost cell is tried again only every RETRY_LOST_S.
HOME_TIMEOUT_S = 2.0
CELL_TIMEOUT_S = 0.5
RETRY_LOST_S = 2.0


def _client(url: str, timeout_s: float) -> redis.Redis:
    return endpoints.client(
        url,
        **QUIET,
        connection_class=packed_connection_class(url),
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


class CellCache:
    """One cell's cache as the consumer keeps it."""

    def __init__(self, name: str, url: str, config: Config, *, home: bool) -> None:
        self.name = name
        self.home = home
        self.redis = _client(url, HOME_TIMEOUT_S if home else CELL_TIMEOUT_S)
        self.invalidator = Invalidator(self.redis, config.cache.ttl_s * 1000)
        self.controls = RolloutControls(self.redis, config.cache)
        self._settle_s = config.cache.controls_max_age_ms / 1000
        self._lease_ms = config.changes.lease_ms
        # Seen not to answer: its cache rotates before it is told anything more.
        self.lost = False
        # The token mirrored here last (0: none yet, by this consumer).
        self.fenced = 0
        self.fresh_from = 0.0
        self.retry_at = 0.0

    def fence(self, token: int) -> None:
        """Mirror ``token`` here (the home holds the lease itself)."""
        if self.home:
            return
        if not int(_MIRROR(self.redis, [CHANGES_LEASE_KEY], [token, self._lease_ms])):
            raise StaleToken
        self.fenced = token

    def take_over(self, token: int, who: str, *, lost: bool) -> None:
        """Before anything else of this consumer's reaches the cell: its token
        fenced, then its cache rotated if it was ``lost`` (by this consumer or
        an earlier one) or its guard is engaged."""
        self.fence(token)
        if lost or self.lost or not self.redis.exists(CHANGES_FRESH_KEY):
            self.controls.rotate(who)
            self.fresh_from = time.monotonic() + self._settle_s
            log.warning("change consumer: cell %s's cache rotated as it was taken", self.name)
        self.lost = False

    def mirrors_newer(self, token: int) -> bool:
        """Whether a newer consumer's token is fenced here (this one is stale)."""
        return int(self.redis.get(CHANGES_LEASE_KEY) or 0) > token

    @property
    def may_say_fresh(self) -> bool:
        return not self.lost and time.monotonic() >= self.fresh_from

    def close(self) -> None:
        self.redis.close()


class Cells:
    """Every cell's cache, the home first."""

    def __init__(self, settings: Settings, config: Config) -> None:
        names = config.cells.names
        if not names:
            self.all = [CellCache("", settings.redis_url, config, home=True)]
        else:
            self.all = [
                CellCache(name, settings.for_cell(name).redis_url, config, home=i == 0)
                for i, name in enumerate(names)
            ]
        self.home = self.all[0]

    def each(self, token: int, action: Callable[[CellCache], T]) -> list[T]:
        """``action`` in every cell that answers, a lost one recovered first;
        the home's errors are raised, another cell's count it lost."""
        done = []
        for cell in self.all:
            if cell.home:
                done.append(action(cell))
                continue
            if cell.lost and time.monotonic() < cell.retry_at:
                continue
            try:
                if cell.lost or cell.fenced != token:
                    was_lost = bool(self.home.redis.sismember(CHANGES_LOST_KEY, cell.name))
                    cell.take_over(token, WHO, lost=was_lost)
                    if was_lost:
                        self.home.redis.srem(CHANGES_LOST_KEY, cell.name)
                done.append(action(cell))
            except StaleToken:
                # A newer consumer's token: this one is stale everywhere. Else the
                # cell lost its copy of the token (a restart, a failover): taken again.
                if cell.mirrors_newer(token):
                    raise
                self._lose(cell, "its copy of the token is gone")
            except (redis.RedisError, ServiceSetupError) as exc:
                self._lose(cell, f"it does not answer ({type(exc).__name__})")
        return done

    def _lose(self, cell: CellCache, why: str) -> None:
        """Count ``cell`` lost, here and in the home, where a later consumer finds
        it (positions are saved past what it has seen): its cache is rotated
        before anything calls it fresh again."""
        self.home.redis.sadd(CHANGES_LOST_KEY, cell.name)
        cell.retry_at = time.monotonic() + RETRY_LOST_S
        if not cell.lost:
            log.warning(
                "change consumer: cell %s is left behind, %s: its cached reads go to the "
                "database until it is back",
                cell.name,
                why,
            )
        cell.lost = True

    def fence(self, token: int) -> None:
        self.each(token, lambda cell: cell.fence(token))

    def invalidate(
        self, token: int, changes: Iterable[RecordChange], generation_of: Callable[[CellCache], int]
    ) -> int:
        """Each changed record's entries dropped in every cell; how many there were."""
        changes = list(changes)

        def apply(cell: CellCache) -> int:
            generation = generation_of(cell)
            generations = {generation + step for step in (-1, 0, 1)} - {0}
            return cell.invalidator.apply(token, changes, generations)

        return sum(self.each(token, apply))

    def rotate(self, who: str) -> None:
        """Rotate the home's cache now and every other cell's as it next answers."""
        self.home.controls.rotate(who)
        for cell in self.all[1:]:
            cell.lost = True

    def close(self) -> None:
        for cell in self.all:
            cell.close()
