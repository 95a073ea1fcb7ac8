"""``dataservice run``: both worker pools and the change consumer in the
foreground, with a live summary.

The supervisor starts one worker process per lane and, with ``changes``, a
change consumer (``dataservice changes``), and with ``flower_port`` Flower
(``dataservice flower``), restarts any that dies (with a
back-off, so a crash loop cannot spin), and shows each lane's queue depth,
live workers, database permits in use (and refused), and completed requests,
and the consumer's role, position and lag (seconds, and events behind the
server), sampled from the broker and from Celery's control channel rather
than from the processes' own logs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from dataservice.broker import queue_depths
from dataservice.broker.celery import TASK_NAME, celery_app
from dataservice.changes.behind import describe_events, describe_lag
from dataservice.changes.consumer import CHANGES_COMMAND
from dataservice.compat.celery import broadcast_request
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.limits.permits import PERMITS_COMMAND
from dataservice.ops.processes import (
    WorkerProcess,
    node_name,
    stop_all,
    wait_answering,
)

RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
READY_TIMEOUT_S = 30.0


@dataclass
class Pool:
    lane: LaneName | None  # None: not a lane's pool, but ``command``
    log: Path
    command: str = ""  # "changes" or "flower" when ``lane`` is None
    args: tuple[str, ...] = ()
    worker: WorkerProcess | None = None
    restarts: int = 0
    next_start: float = 0.0

    @property
    def name(self) -> str:
        return self.lane.value if self.lane is not None else self.command


@dataclass
class LaneStats:
    depth: int = 0
    workers: int = 0
    processed: int = 0
    rate: float = 0.0
    permits_in_use: int = 0
    permits: int = 0
    refused: int = 0


@dataclass
class Snapshot:
    at: float
    lanes: dict[LaneName, LaneStats] = field(default_factory=dict)
    # What the change consumers said (dataservice_changes), one dict per node.
    changes: list[dict[str, Any]] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        config: Config,
        log_dir: Path,
        lanes: tuple[LaneName, ...] = tuple(LaneName),
        *,
        changes: bool = False,
        flower_port: int | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        log_dir.mkdir(parents=True, exist_ok=True)
        self.pools = [Pool(lane, log_dir / f"worker-{lane.value}.log") for lane in lanes]
        if changes:
            self.pools.append(Pool(None, log_dir / "changes.log", "changes"))
        # One scrape target per process: consecutive ports from metrics_port.
        self.metrics: dict[str, int] = {}
        if metrics_port is not None:
            for n, pool in enumerate(self.pools):
                pool.args = ("--metrics-port", str(metrics_port + n))
                self.metrics[pool.name] = metrics_port + n
        self.flower_port = flower_port
        if flower_port is not None:
            args = ("--port", str(flower_port))
            self.pools.append(Pool(None, log_dir / "flower.log", "flower", args))
        self._control = celery_app("dataservice-supervisor", settings, config)
        self._depths = queue_depths(settings)
        self._last: Snapshot | None = None

    def _spawn(self, pool: Pool) -> None:
        if pool.lane is None:
            worker = WorkerProcess.for_command(self.settings, pool.log, pool.command, *pool.args)
            pool.worker = worker.start()
        else:
            worker = WorkerProcess.for_lane(self.settings, pool.lane, pool.log, *pool.args)
            pool.worker = worker.start()

    def start(self) -> None:
        for pool in self.pools:
            self._spawn(pool)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until every pool answers; one that dies meanwhile is restarted (with back-off)."""
        # The lanes only: a consumer that cannot start (no binlog, say) shows
        # as down in the summary; the service still serves, without its cache.
        wait_answering(
            self._control,
            lambda: [p.worker for p in self.pools if p.worker is not None and p.lane is not None],
            timeout,
            check=self.check_pools,
        )

    def check_pools(self) -> None:
        """Restart any pool whose process has exited, with back-off."""
        now = time.monotonic()
        for pool in self.pools:
            if pool.worker is None or pool.worker.running:
                continue
            if pool.next_start == 0.0:
                delay = RESTART_BACKOFF_S[min(pool.restarts, len(RESTART_BACKOFF_S) - 1)]
                pool.next_start = now + delay
            elif now >= pool.next_start:
                pool.restarts += 1
                pool.next_start = 0.0
                self._spawn(pool)

    def snapshot(self) -> Snapshot:
        snap = Snapshot(at=time.monotonic())
        # `limit`: stop waiting as soon as every pool has answered.
        nodes = [pool for pool in self.pools if pool.command != "flower"]
        inspect = self._control.control.inspect(timeout=0.5, limit=len(nodes))
        stats = inspect.stats() or {}
        gauges = broadcast_request(inspect, PERMITS_COMMAND) or {}
        consumers = [
            node_name(pool.command, pool.worker.pid)
            for pool in self.pools
            if pool.command == "changes" and pool.worker is not None and pool.worker.running
        ]
        if consumers:
            # Only the consumers know the command: a pool asked would log an error.
            ask = self._control.control.inspect(
                timeout=0.5, destination=consumers, limit=len(consumers)
            )
            snap.changes = [
                s for s in (broadcast_request(ask, CHANGES_COMMAND) or {}).values() if s
            ]
        for lane in (pool.lane for pool in self.pools if pool.lane is not None):
            lane_stats = LaneStats(depth=self._depths.depth(self.config.lanes[lane].queue))
            for node, info in stats.items():
                if node.startswith(f"{lane.value}-"):
                    lane_stats.workers += 1
                    lane_stats.processed += int(info.get("total", {}).get(TASK_NAME, 0))
            for gauge in gauges.values():
                if gauge.get("lane") == lane.value:
                    lane_stats.permits_in_use += int(gauge["in_use"])
                    lane_stats.permits += int(gauge["capacity"])
                    lane_stats.refused += int(gauge["refused_total"])
            previous = self._last.lanes.get(lane) if self._last else None
            if previous is not None and self._last is not None and snap.at > self._last.at:
                done = max(lane_stats.processed - previous.processed, 0)
                lane_stats.rate = done / (snap.at - self._last.at)
            snap.lanes[lane] = lane_stats
        self._last = snap
        return snap

    def table(self, snap: Snapshot) -> Table:
        caption = (
            _consumer_line(self.pools, snap)
            + _flower_line(self.pools, self.flower_port)
            + _metrics_line(self.metrics)
        )
        table = Table(title="dataservice", caption=caption + "Ctrl-C stops the service")
        columns = ("lane", "queued", "workers", "permits", "refused", "done", "per s", "restarts")
        for column in columns:
            table.add_column(column, justify="right" if column != "lane" else "left")
        for pool in self.pools:
            if pool.lane is None:
                continue
            stats = snap.lanes[pool.lane]
            alive = pool.worker is not None and pool.worker.running
            table.add_row(
                pool.lane.value,
                str(stats.depth),
                str(stats.workers) if alive else "[red]down[/red]",
                f"{stats.permits_in_use}/{stats.permits}",
                str(stats.refused),
                str(stats.processed),
                f"{stats.rate:.0f}",
                str(pool.restarts),
            )
        return table

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown: in-flight requests finish, then the pools exit."""
        stop_all((pool.worker for pool in self.pools if pool.worker is not None), timeout)
        self._control.close()
        self._depths.close()


def _metrics_line(ports: dict[str, int]) -> str:
    if not ports:
        return ""
    targets = ", ".join(f"{name} :{port}" for name, port in ports.items())
    return f"metrics: http://127.0.0.1:PORT/metrics for {targets}\n"


def _flower_line(pools: list[Pool], port: int | None) -> str:
    flower = next((pool for pool in pools if pool.command == "flower"), None)
    if flower is None or port is None:
        return ""
    if flower.worker is None or not flower.worker.running:
        return f"Flower: [red]down[/red] (restarts: {flower.restarts}; see {flower.log})\n"
    return f"Flower: http://127.0.0.1:{port} (basic auth: DATASERVICE_FLOWER_AUTH)\n"


def _consumer_line(pools: list[Pool], snap: Snapshot) -> str:
    """The change consumer, under the lanes."""
    consumer = next((pool for pool in pools if pool.command == "changes"), None)
    if consumer is None:
        return ""
    if consumer.worker is None or not consumer.worker.running:
        state = f"[red]down[/red] (restarts: {consumer.restarts}; see {consumer.log})"
    else:
        active = [s for s in snap.changes if s.get("role") == "active"]
        if active:
            now = active[0]
            # A consumer from before events were counted reports none: unknown.
            events = now.get("lag_events")
            behind = describe_events(-1 if events is None else int(events))
            state = (
                f"active, token {now.get('token')}, at {now.get('position')}, "
                f"lag {describe_lag(float(now.get('lag_s') or 0))}, {behind} behind, "
                f"{now.get('transactions')} transactions"
            )
        else:
            state = "standby (another consumer holds the lease)" if snap.changes else "starting"
    return f"change consumer: {state}\n"
