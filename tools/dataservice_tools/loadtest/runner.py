"""One load run: set up, calibrate, offer the scenario's load, watch, report.

The harness owns everything it starts: its replicas are stopped on any exit,
and only its own Redis db numbers and databases are reset.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dataservice.broker.celery import celery_app
from dataservice.broker.rabbitmq import delete_lane_queues
from dataservice.cache.controls import RolloutControls
from dataservice.config.model import Config
from dataservice.enums import LaneName, ReadMode
from dataservice.ops.processes import WorkerProcess
from dataservice.store.engine import driver_read_timeout_s
from dataservice_tools.loadtest import changes as ch
from dataservice_tools.loadtest import environment as env
from dataservice_tools.loadtest import naive
from dataservice_tools.loadtest.aftermath import for_run
from dataservice_tools.loadtest.display import live_table
from dataservice_tools.loadtest.faults import FAULT_BEGINS, FAULT_ENDS, Fault, PrivateServers
from dataservice_tools.loadtest.findings import build_report
from dataservice_tools.loadtest.incidents import Capacity, SlowDown, lane_timeouts
from dataservice_tools.loadtest.liveness import LivenessWatch, not_applicable
from dataservice_tools.loadtest.openloop import Adapter, OpenLoop, closed_loop_capacity
from dataservice_tools.loadtest.refill import warm
from dataservice_tools.loadtest.sampler import Sample, Sampler, kill_connections
from dataservice_tools.loadtest.scenarios import (
    DEPLOY_NEW,
    DEPLOY_OLD,
    KILL,
    ROTATE,
    SLOW_DOWN,
    Scenario,
)
from dataservice_tools.loadtest.service import CALLER, ServiceAdapter
from dataservice_tools.loadtest.stalls import StallMeter

# How often the measured run looks for a due event: an event happens at most
# this late (its report time is when it happened).
TICK_S = 0.1


@dataclass
class RunOptions:
    scenario: Scenario
    system: str = "service"
    duration_s: float = 20.0
    rate: float | None = None  # interactive capacity, requests/s; None: probe it
    replicas: int = 3
    out: Path = Path(".state/loadtest")
    base_config: Path = Path("queues.yml")
    root_url: str = env.ROOT_URL
    records: int = 1000
    db_delay_ms: int = 0
    max_callers: int = 3000
    calibrate_s: float = 3.0
    live: bool = True
    capacity: dict[LaneName, float] | None = field(default=None)
    # The capacity after a slow-down, when given (the service run's probe).
    capacity_after: dict[LaneName, float] | None = None
    # Another user, database and Redis db (tests use their own, so a manual run never clashes).
    target: env.Target | None = None
    # Inject this fault mid-run, on a Redis and a MariaDB of the run's own.
    fault: Fault | None = None
    # False: each cache miss reads the database itself (cache.coalesce).
    coalesce: bool = True
    # RabbitMQ (amqp://) as the service's broker; None: the run's Redis db.
    broker_url: str | None = None


def capacities_from_rate(rate: float, config: Config) -> dict[LaneName, float]:
    """--rate names the interactive lane's capacity; batch scales with its permits."""
    ratio = config.lanes.batch.permits / config.lanes.interactive.permits
    return {LaneName.INTERACTIVE: rate, LaneName.BATCH: rate * ratio}


def find_capacity(
    o: RunOptions,
    config: Config,
    adapter: Adapter,
    timeouts: dict[LaneName, float],
    ids: list[str],
) -> tuple[dict[LaneName, float], str]:
    """Each lane's capacity (requests/s) and where it comes from: given, --rate
    or a closed-loop probe with every permit of every replica kept busy."""
    if o.capacity is not None:
        return o.capacity, "given (the service run's probe)"
    if o.rate is not None:
        return capacities_from_rate(o.rate, config), "--rate"
    if o.scenario.rotate_at is not None and isinstance(adapter, ServiceAdapter):
        # A load sized against the database, not against a warm cache.
        with adapter.reading(ReadMode.PRIMARY):
            capacity = probe_capacity(o, config, adapter, timeouts, ids)
        return capacity, "closed-loop probe reading PRIMARY"
    return probe_capacity(o, config, adapter, timeouts, ids), "closed-loop probe"


def probe_capacity(
    o: RunOptions,
    config: Config,
    adapter: Adapter,
    timeouts: dict[LaneName, float],
    ids: list[str],
) -> Capacity:
    """The closed-loop probe: twice each lane's permits in callers, back to back."""
    callers = {lane: 2 * o.replicas * config.lanes[lane].permits for lane in LaneName}
    return closed_loop_capacity(adapter, callers, timeouts, ids, env.PAYLOAD, 1.0, o.calibrate_s)


class Run:
    def __init__(self, options: RunOptions, console: Console) -> None:
        self.console = console
        self.target = options.target or env.TARGETS[options.system]
        self.servers: PrivateServers | None = None
        if options.fault is not None:
            self.servers = PrivateServers(options.fault, options.system)
            options = dataclasses.replace(options, root_url=self.servers.root_url)
            self.target = dataclasses.replace(self.target, redis_base=self.servers.redis.base)
        self.o = options
        options.out.mkdir(parents=True, exist_ok=True)
        self.delay_ms = delay = options.db_delay_ms + options.scenario.extra_delay_ms
        self.slow_down = SlowDown.of(
            options.scenario, delay, options.root_url, self.target.database
        )
        table = self.slow_down.table if self.slow_down is not None else None
        self.config_path, self.config = env.scenario_config(
            options.base_config, options.out, delay, table, options.coalesce
        )
        self.read_timeout_s = driver_read_timeout_s(self.config.database)
        # A fault watched after its end lengthens a run too short to show it.
        self.lengthened_from_s: float | None = None
        if options.fault is not None:
            run_s = options.fault.run_s(options.duration_s, self.read_timeout_s)
            if run_s != options.duration_s:
                self.lengthened_from_s = options.duration_s
                self.o = options = dataclasses.replace(options, duration_s=run_s)
        self.settings = env.service_settings(
            self.target,
            self.config_path,
            options.root_url,
            env.run_callers_file(options.out, CALLER),
            options.broker_url if options.system == "service" else None,
        )
        servers = self.servers  # the replicas' own way to them is the one a partition cuts
        self.worker_settings = servers.worker_settings(self.settings) if servers else self.settings
        self.timeouts = lane_timeouts(self.config, options.scenario)
        self.capacity_after: Capacity | None = None
        self.capacity_after_source: str | None = None
        self.liveness: dict[str, Any] = not_applicable(options.system)
        self.events: dict[str, float] = {}
        self.samples: list[Sample] = []
        self.harness_cpu_s = 0.0
        self.machine_stalls: dict[str, Any] = {}
        self.aftermath: dict[str, Any] | None = None
        self.killed = 0
        self.ready_s = 0.0
        # Set when the measured load starts (others may watch the run from then on).
        self.measuring = threading.Event()
        self.stream = ch.StreamSide.of(options.system, options.scenario, options.out / "logs")
        spawn: env.Spawn
        self.alive_dir: Path | None = None
        if options.system == "service":
            spawn = self._service_replica
            threads = {lane: self.config.lanes[lane].concurrency for lane in LaneName}
            self.alive_dir = options.out / "alive"
            self.control = celery_app("loadtest-control", self.settings, self.config)
        else:
            url = self.target.database_url(options.root_url)
            spawn = partial(naive.worker, self.config, self.target.redis_url, url, delay)
            threads = {lane: naive.threads(self.config.lanes[lane]) for lane in LaneName}
            self.control = naive.make_app(self.target.redis_url)
        self.fleet = env.Fleet(
            spawn,
            options.out / "logs",
            self.config,
            threads,
            self.alive_dir,
            administrative=options.system == "service",
        )

    def expected_callers(self, capacity: dict[LaneName, float] | None = None) -> int:
        """Callers the schedule keeps busy if every request waits up to a second."""
        o = self.o
        capacity = capacity or o.capacity or capacities_from_rate(o.rate or 100.0, self.config)
        peak = o.scenario.peak
        busy = sum(peak(lane) * capacity[lane] * min(self.timeouts[lane], 1.0) for lane in LaneName)
        return min(o.max_callers, int(busy) + 16)

    def _service_replica(self, lane: LaneName, log: Path) -> WorkerProcess:
        assert self.alive_dir is not None
        alive = env.alive_path(self.alive_dir, log)
        # A file left by an earlier run in the same directory must not pass for this one's.
        alive.unlink(missing_ok=True)
        extra = (*self.stream.replica_args(), "--alive-file", str(alive))
        worker = WorkerProcess.for_lane(self.worker_settings, lane, log, *extra)
        worker.argv[:0] = self.servers.worker_prefix() if self.servers else []
        return worker

    @property
    def changes(self) -> dict[str, Any] | None:
        """The direct writes, cache reads and consumer lag, when the scenario has them."""
        return self.stream.report

    def adapter(self) -> Adapter:
        if self.o.system == "service":
            return ServiceAdapter.create(
                self.settings, self.config, self.expected_callers(), self.o.scenario.read_mode
            )
        return naive.NaiveAdapter(self.target.redis_url, self.config)

    def execute(self) -> dict[str, Any]:
        if self.servers is None:
            return self._execute()
        try:
            with self.console.status("starting a private Redis and MariaDB"):
                self.servers.start()
            return self._execute()
        finally:
            self.servers.stop()

    def _execute(self) -> dict[str, Any]:
        o = self.o
        env.flush_redis(self.target.redis_url)
        if self.settings.broker_is_amqp:
            # What an earlier run left queued would be this run's backlog.
            delete_lane_queues(self.settings.broker_url, self.config)
        with self.console.status(f"{o.system}: preparing {self.target.database}"):
            hosts = self.servers.database_hosts() if self.servers else env.LOCAL_HOSTS
            ids = env.prepare_database(self.target, self.config, o.records, o.root_url, hosts)
            if self.slow_down is not None:
                self.slow_down.create()
        adapter = self.adapter()
        try:
            self.stream.start_consumer(self.settings, self.config, o.root_url, self.target.database)
            self.fleet.start(o.replicas, generation=0)
            with self.console.status(f"{o.system}: starting {2 * o.replicas} replicas"):
                self.ready_s = self.fleet.wait_ready(self.control)
            with self.console.status(f"{o.system}: finding the capacity"):
                self._capacity_after(adapter, ids)
                capacity, source = find_capacity(o, self.config, adapter, self.timeouts, ids)
            self.capacity, self.capacity_source = capacity, source
            if o.scenario.rotate_at is not None:
                with self.console.status(f"{o.system}: warming the cache"):
                    warm(adapter, ids, o.replicas * self.config.lanes.interactive.permits)
            return self._measure(adapter, ids, env.PAYLOAD, capacity)
        finally:
            if self.slow_down is not None:
                self.slow_down.close()
            self.fleet.stop()
            self.stream.stop()
            adapter.close()
            self.control.close()

    def _capacity_after(self, adapter: Adapter, ids: list[str]) -> None:
        """The capacity at the slower speed, before the starting speed's (see .incidents)."""
        if self.slow_down is None:
            return
        if self.o.capacity_after is not None:
            self.capacity_after = self.o.capacity_after
            self.capacity_after_source = "given (the service run's probe)"
            return
        o, config, timeouts = self.o, self.config, self.timeouts
        self.capacity_after = self.slow_down.probe_slow(
            lambda: probe_capacity(o, config, adapter, timeouts, ids)
        )
        self.capacity_after_source = "closed-loop probe at the slower speed"

    def _measure(
        self, adapter: Adapter, ids: list[str], payload: bytes, capacity: dict[LaneName, float]
    ) -> dict[str, Any]:
        """The measured part: the open-loop load, the database sampler, the
        liveness watch and the scenario's events from one start instant, for the
        scenario's duration; then the report."""
        o, scenario = self.o, self.o.scenario
        t0 = time.monotonic() + 0.5
        sampler = self._sampler(t0)
        self.samples = sampler.samples
        watch = None
        if self.alive_dir is not None:
            watch = LivenessWatch(self.settings, self.fleet.alive_files, t0)
        loop = OpenLoop(
            adapter,
            lambda lane, t: scenario.factor(lane, t / o.duration_s) * capacity[lane],
            self.timeouts,
            ids,
            payload,
            o.duration_s,
            t0,
            o.max_callers,
            **({"read_share": scenario.read_share} if scenario.read_share else {}),
        )
        faults = {} if o.fault is None else o.fault.events(o.duration_s, self.read_timeout_s)
        pending = scenario.events(o.duration_s) | faults
        database_url = env.direct_url(o.root_url, self.target.database)
        # Only a fault run checks its writes: nothing but the service writes its records then.
        aftermath = (
            None
            if o.fault is None
            else for_run(database_url, self.settings, self.config, self.timeouts)
        )
        cpu_before = time.process_time()
        live = Live(self._table(loop, sampler), console=self.console, auto_refresh=False)
        stalls = StallMeter()
        try:
            stalls.start()
            sampler.start()
            if watch is not None:
                watch.start()
            loop.start(self.expected_callers(capacity))
            self.stream.begin(
                self.config,
                self.target.redis_url,
                database_url,
                env.SCOPE,
                ids,
                capacity[LaneName.INTERACTIVE],
                o.duration_s,
                t0,
            )
            self.measuring.set()
            if o.live:
                live.start()
            ticks = 0
            while time.monotonic() - t0 < o.duration_s:
                elapsed = time.monotonic() - t0
                for name, at in list(pending.items()):
                    if elapsed >= at and self.may_perform(name):
                        # As it is done, to the ms: a 10 ms sampler's samples are placed
                        # against it.
                        self.events[name] = round(time.monotonic() - t0, 3)
                        self.perform(name)
                        del pending[name]
                ticks += 1
                # The display costs the generator's CPU: twice a second is enough.
                if o.live and ticks % 5 == 0:
                    live.update(self._table(loop, sampler), refresh=True)
                time.sleep(TICK_S)
            loop.join()
            self.aftermath = None if aftermath is None else aftermath.close(loop.records)
        finally:
            live.stop()
            sampler.stop()
            if watch is not None:
                watch.stop()
                self.liveness = watch.report()
            self.stream.finish(self.events.get(ROTATE), o.duration_s)
            stalls.stop()
            self.machine_stalls = stalls.summary(t0)
        # The generator shares the machine with the service: its CPU goes in the report.
        self.harness_cpu_s = time.process_time() - cpu_before
        return build_report(self, loop, sampler, capacity)

    def _sampler(self, t0: float) -> Sampler:
        """The database sampler, at the pace and patience the run's fault asks for."""
        sampler = Sampler(self.o.root_url, self.target.user, t0, self.fleet.share)
        fault = self.o.fault
        sampling = None if fault is None else fault.sampling(self.read_timeout_s)
        if sampling is not None:
            sampler.interval_s, sampler.read_timeout_s = sampling
        return sampler

    def _table(self, loop: OpenLoop, sampler: Sampler) -> Table:
        title = f"{self.o.system} / {self.o.scenario.name}"
        return live_table(title, self.o.duration_s, loop, sampler)

    def may_perform(self, name: str) -> bool:
        """Whether an event due now may happen: as a rolling deploy does, the old
        replicas are stopped only once the new ones are ready (on a busy machine
        a replica can take longer to start than the scenario's third of the run)."""
        return name != DEPLOY_OLD or self.fleet.ready(1)

    def perform(self, name: str) -> None:
        """One of the scenario's mid-run events."""
        if name == DEPLOY_NEW:
            self.fleet.start(self.o.replicas, generation=1)
        elif name == DEPLOY_OLD:
            self.fleet.terminate(0)
        elif name == KILL:
            self.killed = kill_connections(self.o.root_url, self.target.user)
        elif name == ROTATE:
            rotate_cache(self.settings.redis_url, self.config)
        elif name == SLOW_DOWN and self.slow_down is not None:
            self.slow_down.slow()
        elif name == FAULT_BEGINS and self.servers is not None:
            self.servers.begin()
        elif name == FAULT_ENDS and self.servers is not None:
            self.servers.end()


def rotate_cache(redis_url: str, config: Config) -> None:
    """The cold-cache scenario's event: the next namespace generation, as an operator would."""
    with redis.Redis.from_url(redis_url, socket_timeout=5) as client:
        RolloutControls(client, config.cache).rotate("loadtest")
