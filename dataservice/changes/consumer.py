"""The change consumer: binlog in, invalidations out, position saved after.

One process runs :meth:`ChangeConsumer.run` until :meth:`ChangeConsumer.stop`.
It is *standby* until it takes the lease (:mod:`.lease`), then *active*: it
reads the binlog from the saved position (:mod:`.checkpoint`), applies each
transaction's invalidations in one script carrying its fencing token
(:mod:`.invalidator`), and saves the position only after the invalidations
it covers. A lost lease, a stale token or any error ends the active spell;
the consumer waits (a doubling ramp up to ``changes.reconnect_max_s``) and
tries again. A saved position the server no longer has (purged binlogs), or
none at all, means changes may have gone unseen: the consumer says so in the
log and rotates the cache's generation before it reads on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

import redis
from sqlalchemy import Engine, create_engine

from dataservice.changes.behind import UNKNOWN, UNKNOWN_LAG_S, Behind, LagProbe
from dataservice.changes.cells import Cells
from dataservice.changes.checkpoint import Checkpoints
from dataservice.changes.lease import Lease
from dataservice.changes.start import WHO, start_position
from dataservice.changes.stream import BinlogChanges, Committed, Position
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import LeaseLost
from dataservice.observe.metrics import (
    CHANGES_ACTIVE,
    CHANGES_INVALIDATED,
    CHANGES_LAG,
    CHANGES_LAG_BYTES,
    CHANGES_LAG_EVENTS,
    CHANGES_TRANSACTIONS,
)
from dataservice.redis.keys import CHANGES_FRESH_KEY, CHANGES_STATUS_KEY

log = logging.getLogger(__name__)

# The control command a consumer's worker node answers with its state.
CHANGES_COMMAND = "dataservice_changes"
# Positions are saved at most this often: a replay after a crash is cheap
# (invalidations are idempotent), a write per binlog transaction is not.
_SAVE_EVERY_S = 0.2
_STATUS_EVERY_S = 1.0
_FIRST_WAIT_S = 0.1


@dataclass(frozen=True, slots=True)
class ConsumerState:
    role: str  # "standby", "active" or "stopped"
    token: int = 0
    position: Position | None = None
    lag_s: float = 0.0
    # Behind the server's binlog (dataservice.changes.behind); -1: unknown.
    lag_events: int = -1
    lag_bytes: int = -1
    transactions: int = 0
    invalidated: int = 0


class ChangeConsumer:
    def __init__(self, settings: Settings, config: Config) -> None:
        self._config = config.changes
        self._url = settings.changes_url
        self._engine: Engine = create_engine(
            self._url, pool_size=1, max_overflow=0, pool_recycle=300, pool_pre_ping=True
        )
        # Every cell's cache; the lease and the consumer's own state live in the first's.
        self._cells = Cells(settings, config)
        self._redis = self._cells.home.redis
        self._lease = Lease(self._redis, self._config.lease_ms)
        self._checkpoints = Checkpoints(self._engine)
        self._probe = LagProbe(self._url)
        self._stop = threading.Event()
        self.state = ConsumerState("standby")

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        wait_s = _FIRST_WAIT_S
        while not self._stop.is_set():
            try:
                token = self._lease.take()
            except redis.RedisError:
                token = None
            if token is None:
                self.state = ConsumerState("standby")
                self._stop.wait(self._config.lease_ms / 3000)
                continue
            try:
                self._active(token)
                wait_s = _FIRST_WAIT_S
            except LeaseLost:
                log.warning("change consumer: lease lost (token %d); standing by", token)
            except Exception as exc:
                log.warning("change consumer: %s; retrying in %.1f s", type(exc).__name__, wait_s)
                self._stop.wait(wait_s)
                wait_s = min(wait_s * 2, self._config.reconnect_max_s)
        self.state = replace(self.state, role="stopped")
        if self.state.token:
            self._lease.release(self.state.token)

    def close(self) -> None:
        self._engine.dispose()
        self._probe.close()
        self._cells.close()

    def _active(self, token: int) -> None:
        start = start_position(
            token, self._url, self._config.server_id, self._lease, self._checkpoints, self._cells
        )
        self._cells.fence(token)
        # Until it has read something (or found nothing to read), the age of
        # what lies ahead is unknown, and the freshness guard holds.
        self.state = ConsumerState("active", token, start, UNKNOWN_LAG_S)
        CHANGES_ACTIVE.set(1)
        log.info("change consumer active (token %d) from %s", token, start)
        # Often enough to renew the lease, and to report a few times in the status's life.
        heartbeat_s = min(self._config.lease_ms / 3000, self._config.max_lag_s / 4)
        stream = BinlogChanges(self._url, self._config.server_id, start, heartbeat_s)
        self._report(start)
        renewed = saved = reported = time.monotonic()
        unsaved: Position | None = None
        try:
            for item in stream:
                now = time.monotonic()
                if now - renewed >= heartbeat_s:
                    if not self._lease.renew(token):
                        raise LeaseLost
                    self._cells.fence(token)
                    renewed = now
                if isinstance(item, Committed):
                    self._apply(token, item)
                    unsaved = item.position
                elif item.caught_up:
                    self.state = replace(self.state, position=item.position, lag_s=0.0)
                if unsaved is not None and now - saved >= _SAVE_EVERY_S:
                    self._checkpoints.save(unsaved, token)
                    unsaved, saved = None, now
                if now - reported >= min(_STATUS_EVERY_S, heartbeat_s):
                    self._report(stream.position)
                    reported = now
                if self._stop.is_set():
                    break
        finally:
            CHANGES_ACTIVE.set(0)
            CHANGES_LAG.set(UNKNOWN_LAG_S)
            set_behind(UNKNOWN)
            stream.close()
            if unsaved is not None and self._lease.renew(token):
                self._checkpoints.save(unsaved, token)

    def _apply(self, token: int, item: Committed) -> None:
        touched = item.wholesale or bool(item.changes)
        if item.wholesale:
            log.error("records changed wholesale (truncate, drop or rename): rotating the cache")
            self._cells.rotate(WHO)
        elif item.changes:
            # Replicas may be a rotation behind the generation this consumer holds, or ahead
            # of it: each cell's, the entries of the one before and the one after too.
            deleted = self._cells.invalidate(
                token, item.changes, lambda cell: cell.controls.current().generation
            )
            self.state = replace(self.state, invalidated=self.state.invalidated + deleted)
            CHANGES_INVALIDATED.inc(deleted)
        CHANGES_TRANSACTIONS.inc(touched)
        self.state = replace(
            self.state,
            position=item.position,
            lag_s=max(0.0, time.time() - item.timestamp),
            transactions=self.state.transactions + touched,
        )

    def _report(self, position: Position) -> None:
        """``position`` is the reader's own, past whatever it skipped since the last change."""
        found = self._probe.measure(position)
        # Nothing left to read: whatever the last commit's age, nothing is stale.
        lag_s = 0.0 if found.events == 0 else self.state.lag_s
        self.state = replace(
            self.state, lag_s=lag_s, lag_events=found.events, lag_bytes=found.bytes
        )
        self._cells.each(
            self.state.token,
            lambda cell: publish_status(
                cell.redis, self.state, self._config.max_lag_s, fresh=cell.may_say_fresh
            ),
        )


def publish_status(
    client: redis.Redis, state: ConsumerState, max_lag_s: float, *, fresh: bool = True
) -> None:
    """The status, which lives ``changes.max_lag_s`` (a consumer that stops
    reporting is gone), and the word the freshness guard reads: everything
    committed ``lag_s`` ago is invalidated, so the cache is within the bound
    for ``max_lag_s - lag_s`` more, even if this is the last report. Not
    ``fresh``: the word is taken back (a cell whose replicas may not all have
    seen its cache's new generation yet)."""
    CHANGES_LAG.set(state.lag_s)
    set_behind(Behind(state.lag_events, state.lag_bytes))
    position = state.position
    with client.pipeline(transaction=True) as pipe:
        pipe.hset(
            CHANGES_STATUS_KEY,
            mapping={
                "token": state.token,
                "log_file": position.log_file if position else "",
                "log_pos": position.log_pos if position else 0,
                "lag_s": f"{state.lag_s:.3f}",
                "lag_events": state.lag_events,
                "lag_bytes": state.lag_bytes,
                "at_ms": time.time_ns() // 1_000_000,
            },
        )
        pipe.pexpire(CHANGES_STATUS_KEY, int(max_lag_s * 1000))
        fresh_ms = int((max_lag_s - state.lag_s) * 1000)
        if fresh and state.lag_s >= 0 and fresh_ms > 0:
            pipe.set(CHANGES_FRESH_KEY, state.token, px=fresh_ms)
        else:
            pipe.delete(CHANGES_FRESH_KEY)
        pipe.execute()


def set_behind(found: Behind) -> None:
    CHANGES_LAG_EVENTS.set(found.events)
    CHANGES_LAG_BYTES.set(found.bytes)
