"""The scenarios: offered load per lane over time, and what happens mid-run.

Offered load is a multiple of each lane's capacity (requests per second the
lane completes when saturated, measured by a closed-loop probe or given with
``--rate``). A scenario is a list of segments per lane (from, to, factor), as
fractions of the run, plus the events the runner performs.

Two scenarios replay incidents: ``proxy-storm`` (callers whose timeout equals
the pool's borrow wait, demand about twice what the connections serve, then
every connection dropped at once) and ``downsized-db`` (the database's
capacity halves mid-run, unannounced).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dataservice.enums import LaneName, ReadMode

# (start fraction, end fraction, multiple of the lane's capacity)
Segment = tuple[float, float, float]

# Event names, as the report and the chart show them.
DEPLOY_NEW = "deploy: new replicas"
DEPLOY_OLD = "deploy: old replicas SIGTERM"
KILL = "kill all connections"
SLOW_DOWN = "database slowed down"
ROTATE = "cache generation rotated"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    segments: dict[LaneName, tuple[Segment, ...]]
    # Start as many replicas again at this fraction of the run, then warm-stop
    # the first generation at ``overlap_stop``: a rolling deploy.
    overlap_start: float | None = None
    overlap_stop: float | None = None
    # KILL every service connection (as root) at this fraction of the run.
    kill_at: float | None = None
    # Extra statement time injected in the database (queues.yml database.injected_delay_ms).
    extra_delay_ms: int = 0
    # At this fraction of the run, every operation's injected time in the
    # database is multiplied by ``slow_down_factor`` under the running workers
    # (the delay table, database.injected_delay_table): capacity divided by it.
    slow_down_at: float | None = None
    slow_down_factor: float = 1.0
    # The interactive callers' timeout is the service's own wait for a permit and
    # a pooled connection (database.pool_timeout_ms), not the lane's deadline.
    timeout_is_pool_wait: bool = False
    # Compare interactive latency before and after this fraction (batch-flood).
    compare_at: float | None = None
    # How every read asks: ALLOW_CACHED runs the change consumer beside the
    # replicas, so the run needs a server with a binlog.
    read_mode: ReadMode = ReadMode.PRIMARY
    # Writes per second by direct SQL (not through the service), as a multiple
    # of the interactive capacity: changes only the change stream can report.
    direct_writes: float = 0.0
    # Rotate the cache's namespace generation at this fraction of the run: every
    # entry unreachable at once. The capacity is then the database's (probed
    # reading PRIMARY), and the run is made twice, coalescing on and off.
    rotate_at: float | None = None
    # Each lane's share of reads in its mix (the rest writes); None: openloop's.
    read_share: dict[LaneName, float] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def changes(self) -> bool:
        """Whether the run needs the change consumer (and a binlog)."""
        return self.read_mode is ReadMode.ALLOW_CACHED

    @property
    def incident(self) -> tuple[str, float] | None:
        """The event whose recovery the report measures, and its fraction of the run."""
        if self.slow_down_at is not None:
            return SLOW_DOWN, self.slow_down_at
        if self.kill_at is not None:
            return KILL, self.kill_at
        return None

    def events(self, duration_s: float) -> dict[str, float]:
        """What the runner does mid-run, and when (seconds from the start)."""
        return {
            name: at * duration_s
            for name, at in (
                (DEPLOY_NEW, self.overlap_start),
                (DEPLOY_OLD, self.overlap_stop),
                (KILL, self.kill_at),
                (SLOW_DOWN, self.slow_down_at),
                (ROTATE, self.rotate_at),
            )
            if at is not None
        }

    def peak(self, lane: LaneName) -> float:
        """The highest multiple of capacity ``lane`` is offered."""
        return max((factor for _, _, factor in self.segments.get(lane, ())), default=0.0)

    def factor(self, lane: LaneName, fraction: float) -> float:
        for start, end, factor in self.segments.get(lane, ()):
            if start <= fraction < end:
                return factor
        return 0.0


def _both(interactive: float, batch: float) -> dict[LaneName, tuple[Segment, ...]]:
    return {
        LaneName.INTERACTIVE: ((0.0, 1.0, interactive),),
        LaneName.BATCH: ((0.0, 1.0, batch),),
    }


SLOW_DB_EXTRA_MS = 50
# The step scenario's overload, a multiple of the interactive capacity.
STEP_FACTOR = 3.0
# A connection proxy's outage: about 7,600 connections of demand met a proxy
# that could open about 3,360, so callers are offered that multiple of what the
# service serves.
PROXY_DEMAND = 7600 / 3360
# A database downsized without a load test had about half the capacity. Before it,
# the load is comfortable (80 %); after it, 1.6x what the database serves.
DOWNSIZED_FACTOR = 2.0
DOWNSIZED_LOAD = 0.8
# A load sized for a warm cache: more than the database serves uncached. Each
# write leaves a miss after it, so the mix is read-heavy for a warm hit ratio
# well above the refill mark (dataservice_tools.loadtest.refill.REFILLED).
COLD_LOAD = 1.5
COLD_BATCH = 0.2
COLD_READS = 0.98

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "steady",
            "both lanes at 60% of capacity",
            _both(0.6, 0.6),
        ),
        Scenario(
            "overload",
            "both lanes offered 3x capacity",
            _both(3.0, 3.0),
            notes=("peak throughput = the closed-loop capacity probe's goodput",),
        ),
        Scenario(
            "step",
            f"interactive offered 1x capacity, {STEP_FACTOR:g}x from 1/3 of the run, 1x again "
            "from 2/3; batch at 50% throughout",
            {
                LaneName.INTERACTIVE: (
                    (0.0, 1 / 3, 1.0),
                    (1 / 3, 2 / 3, STEP_FACTOR),
                    (2 / 3, 1.0, 1.0),
                ),
                LaneName.BATCH: ((0.0, 1.0, 0.5),),
            },
            notes=(
                "refusals should start within 2 s of the step up and stop within 2 s "
                "of the step down",
            ),
        ),
        Scenario(
            "overlap",
            "2x capacity; a second generation of replicas starts at 1/3 of the run and the "
            "first is warm-stopped (SIGTERM) at 2/3, or once the second is ready if later: "
            "twice the replicas during the deploy",
            _both(2.0, 2.0),
            overlap_start=1 / 3,
            overlap_stop=2 / 3,
        ),
        Scenario(
            "reconnect-burst",
            "both lanes at 60% of capacity; every service connection is killed at 40%",
            _both(0.6, 0.6),
            kill_at=0.4,
        ),
        Scenario(
            "slow-db",
            f"the steady rates, with every statement slowed by {SLOW_DB_EXTRA_MS} ms "
            "in the database",
            _both(0.6, 0.6),
            extra_delay_ms=SLOW_DB_EXTRA_MS,
        ),
        Scenario(
            "batch-flood",
            "interactive at 50% of capacity throughout; batch idle in the first half, "
            "then offered 5x its capacity",
            {
                LaneName.INTERACTIVE: ((0.0, 1.0, 0.5),),
                LaneName.BATCH: ((0.5, 1.0, 5.0),),
            },
            compare_at=0.5,
            notes=("interactive p99 of the second half is compared with the first half",),
        ),
        Scenario(
            "cached",
            "both lanes at 60% of capacity reading ALLOW_CACHED, the cache kept fresh by the "
            "change consumer; direct SQL updates of the same records at 5% of the interactive "
            "capacity besides the service's writes",
            _both(0.6, 0.6),
            read_mode=ReadMode.ALLOW_CACHED,
            direct_writes=0.05,
            notes=("needs a server with a binlog (make services starts one)",),
        ),
        Scenario(
            "cold-cache",
            f"interactive offered {COLD_LOAD:g}x the database's capacity reading ALLOW_CACHED "
            f"({COLD_READS:.0%} reads) over a warm cache kept fresh by the change consumer, "
            f"batch at {COLD_BATCH:.0%}; the cache's generation is rotated at 40%; run with "
            "coalescing on, then off",
            _both(COLD_LOAD, COLD_BATCH),
            read_mode=ReadMode.ALLOW_CACHED,
            rotate_at=0.4,
            read_share={LaneName.INTERACTIVE: COLD_READS, LaneName.BATCH: COLD_READS},
            notes=(
                "needs a server with a binlog (make services starts one)",
                "capacity: the database's, probed reading PRIMARY",
            ),
        ),
        Scenario(
            "proxy-storm",
            f"both lanes offered {PROXY_DEMAND:.2f}x capacity, interactive callers timing out "
            "after the service's own pool wait (database.pool_timeout_ms); every service "
            "connection is dropped at 40%",
            _both(PROXY_DEMAND, PROXY_DEMAND),
            kill_at=0.4,
            timeout_is_pool_wait=True,
            notes=("replays a proxy whose borrow wait equalled its callers' timeout",),
        ),
        Scenario(
            "downsized-db",
            f"both lanes at {DOWNSIZED_LOAD:.0%} of capacity; at 50% every operation's time in "
            f"the database is multiplied by {DOWNSIZED_FACTOR:g} under the running workers",
            _both(DOWNSIZED_LOAD, DOWNSIZED_LOAD),
            slow_down_at=0.5,
            slow_down_factor=DOWNSIZED_FACTOR,
            notes=(
                "replays a database downsized without a load test",
                "the capacity at both database speeds is probed before the run",
            ),
        ),
    )
}
