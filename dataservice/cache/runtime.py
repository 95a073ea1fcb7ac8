"""One worker process's cache: its Redis clients, controls, breaker and source."""

from __future__ import annotations

from redis.backoff import NoBackoff
from redis.retry import Retry

from dataservice.cache.controls import RolloutControls
from dataservice.cache.guard import FreshnessGuard
from dataservice.cache.shadow import ShadowComparisons
from dataservice.cache.source import CachedSource
from dataservice.cache.store import CacheStore
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.handler.database import Database
from dataservice.observe.metrics import FRESHNESS_GUARD
from dataservice.redis import endpoints
from dataservice.redis.bounded import QUIET
from dataservice.redis.packing import packed_connection_class
from dataservice.store import RecordStore

# A follower's blocking wait lasts at most a lease; its socket must outlast that.
_WAIT_SOCKET_SLACK_S = 1.0


class CacheRuntime:
    """The cache in front of one lane's reads, in one worker process."""

    def __init__(
        self,
        settings: Settings,
        config: Config,
        lane: str,
        database: Database,
        store: RecordStore,
        threads: int,
    ) -> None:
        cache = config.cache
        lane_config = config.lanes[LaneName(lane)]
        timeout_s = cache.socket_timeout_ms / 1000
        # Tight timeouts: a cache that stalls must cost less than the database
        # it stands in front of; the breaker takes it from there.
        # No retries either: redis-py would otherwise repeat a failed command
        # with back-off, turning one timeout into seconds.
        self._client = endpoints.client(
            settings.redis_url,
            **QUIET,
            connection_class=packed_connection_class(settings.redis_url),
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # The shadow comparisons' threads read and count here too.
            max_connections=threads + cache.shadow.max_inflight + 2,
            retry=Retry(NoBackoff(), 0),
        )
        self._waits = endpoints.client(
            settings.redis_url,
            **QUIET,
            connection_class=packed_connection_class(settings.redis_url),
            socket_timeout=cache.lock_lease_ms / 1000 + _WAIT_SOCKET_SLACK_S,
            socket_connect_timeout=timeout_s,
            max_connections=threads + 2,
            retry=Retry(NoBackoff(), 0),
        )
        self.controls = RolloutControls(self._client, cache)
        self.store = CacheStore(self._client, self._waits)
        guard = None
        if config.changes.guard:
            checked = guard = FreshnessGuard(
                self._client, config.changes.max_lag_s, cache.controls_max_age_ms
            )
            # Asked when scraped too (at most once per max age), so that a
            # replica serving no cached read still says what it would do.
            FRESHNESS_GUARD.labels(lane).set_function(lambda: int(not checked.allows_cache()))
        shadow = ShadowComparisons(
            cache.shadow, database.permits, store, self.store, self._client, lane
        )
        self.source = CachedSource(
            database,
            store,
            self.store,
            self.controls,
            cache,
            lane,
            shadow,
            guard=guard,
            # A read_many's misses: this many ids per SELECT, one SELECT per permit.
            keys_per_select=lane_config.max_ops_per_transaction,
            # A coalesced read's record serves requests sent before it ended
            # for as long as one of them may still wait for it.
            share_ms=min(lane_config.max_deadline_ms, cache.ttl_s * 1000),
        )

    def close(self) -> None:
        for client in (self._client, self._waits):
            client.close()
            client.connection_pool.disconnect()
