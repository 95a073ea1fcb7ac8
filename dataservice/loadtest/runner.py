"""One load run: set up, calibrate, offer the scenario's load, watch, report.

The harness owns everything it starts: its replicas are stopped on any exit,
and only its own Redis db numbers and databases are reset.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from dataservice.broker import celery_app
from dataservice.config import Config
from dataservice.enums import LaneName
from dataservice.loadtest import changes as ch
from dataservice.loadtest import environment as env
from dataservice.loadtest import naive
from dataservice.loadtest.display import live_table
from dataservice.loadtest.findings import build_report
from dataservice.loadtest.openloop import Adapter, OpenLoop, closed_loop_capacity
from dataservice.loadtest.sampler import Sample, Sampler, kill_connections
from dataservice.loadtest.scenarios import Scenario
from dataservice.loadtest.service import CALLER, ServiceAdapter
from dataservice.processes import WorkerProcess

BATCH_TIMEOUT_S = 5.0


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
    # Another user, database and Redis db (tests use their own, so a manual run never clashes).
    target: env.Target | None = None


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
    callers = {lane: 2 * o.replicas * config.lanes[lane].permits for lane in LaneName}
    payload = bytes(range(256)) * (env.PAYLOAD_BYTES // 256)
    capacity = closed_loop_capacity(adapter, callers, timeouts, ids, payload, 1.0, o.calibrate_s)
    return capacity, "closed-loop probe"


class Run:
    def __init__(self, options: RunOptions, console: Console) -> None:
        self.o = options
        self.console = console
        self.target = options.target or env.TARGETS[options.system]
        options.out.mkdir(parents=True, exist_ok=True)
        self.delay_ms = delay = options.db_delay_ms + options.scenario.extra_delay_ms
        self.config_path, self.config = env.scenario_config(options.base_config, options.out, delay)
        self.settings = env.service_settings(
            self.target,
            self.config_path,
            options.root_url,
            env.run_callers_file(options.out, CALLER),
        )
        self.timeouts = {
            LaneName.INTERACTIVE: self.config.lanes.interactive.default_deadline_ms / 1000,
            LaneName.BATCH: BATCH_TIMEOUT_S,
        }
        self.events: dict[str, float] = {}
        self.samples: list[Sample] = []
        self.harness_cpu_s = 0.0
        self.killed = 0
        self.ready_s = 0.0
        # Set when the measured load starts (others may watch the run from then on).
        self.measuring = threading.Event()
        self.stream = ch.StreamSide.of(options.system, options.scenario, options.out / "logs")
        spawn: env.Spawn
        if options.system == "service":
            spawn = self._service_replica
            self.control = celery_app("loadtest-control", self.settings, self.config)
        else:
            url = self.target.database_url(options.root_url)
            spawn = partial(naive.worker, self.config, self.target.redis_url, url, delay)
            self.control = naive.make_app(self.target.redis_url)
        self.fleet = env.Fleet(spawn, options.out / "logs", self.config)

    def expected_callers(self, capacity: dict[LaneName, float] | None = None) -> int:
        """Callers the schedule keeps busy if every request waits up to a second."""
        o = self.o
        capacity = capacity or o.capacity or capacities_from_rate(o.rate or 100.0, self.config)
        peak = o.scenario.peak
        busy = sum(peak(lane) * capacity[lane] * min(self.timeouts[lane], 1.0) for lane in LaneName)
        return min(o.max_callers, int(busy) + 16)

    def _service_replica(self, lane: LaneName, log: Path) -> WorkerProcess:
        return WorkerProcess.for_lane(self.settings, lane, log, *self.stream.replica_args())

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
        o = self.o
        env.flush_redis(self.target.redis_url)
        with self.console.status(f"{o.system}: preparing {self.target.database}"):
            ids = env.prepare_database(self.target, self.config, o.records, o.root_url)
        payload = bytes(range(256)) * (env.PAYLOAD_BYTES // 256)
        adapter = self.adapter()
        try:
            self.stream.start_consumer(self.settings, self.config, o.root_url, self.target.database)
            self.fleet.start(o.replicas, generation=0)
            with self.console.status(f"{o.system}: starting {2 * o.replicas} replicas"):
                self.ready_s = self.fleet.wait_ready(self.control)
            with self.console.status(f"{o.system}: finding the capacity"):
                capacity, source = find_capacity(o, self.config, adapter, self.timeouts, ids)
            self.capacity, self.capacity_source = capacity, source
            return self._measure(adapter, ids, payload, capacity)
        finally:
            self.fleet.stop()
            self.stream.stop()
            adapter.close()
            self.control.close()

    def _measure(
        self, adapter: Adapter, ids: list[str], payload: bytes, capacity: dict[LaneName, float]
    ) -> dict[str, Any]:
        o, scenario = self.o, self.o.scenario
        t0 = time.monotonic() + 0.5
        sampler = Sampler(o.root_url, self.target.user, t0, self.fleet.share)
        self.samples = sampler.samples
        loop = OpenLoop(
            adapter,
            lambda lane, t: scenario.factor(lane, t / o.duration_s) * capacity[lane],
            self.timeouts,
            ids,
            payload,
            o.duration_s,
            t0,
            o.max_callers,
        )
        pending = scenario.events(o.duration_s)
        cpu_before = time.process_time()
        live = Live(self._table(loop, sampler), console=self.console, auto_refresh=False)
        try:
            sampler.start()
            loop.start(self.expected_callers(capacity))
            self.stream.begin(
                self.config,
                self.target.redis_url,
                env.direct_url(o.root_url, self.target.database),
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
                    if elapsed >= at:
                        self._event(name)
                        self.events[name] = round(elapsed, 2)
                        del pending[name]
                ticks += 1
                # The display costs the generator's CPU: twice a second is enough.
                if o.live and ticks % 5 == 0:
                    live.update(self._table(loop, sampler), refresh=True)
                time.sleep(0.1)
            loop.join()
        finally:
            live.stop()
            sampler.stop()
            self.stream.finish()
        # The generator shares the machine with the service: its CPU goes in the report.
        self.harness_cpu_s = time.process_time() - cpu_before
        return build_report(self, loop, sampler, capacity)

    def _event(self, name: str) -> None:
        if name.startswith("deploy: new"):
            self.fleet.start(self.o.replicas, generation=1)
        elif name.startswith("deploy: old"):
            self.fleet.terminate(0)
        else:
            self.killed = kill_connections(self.o.root_url, self.target.user)

    def _table(self, loop: OpenLoop, sampler: Sampler) -> Table:
        title = f"{self.o.system} / {self.o.scenario.name}"
        return live_table(title, self.o.duration_s, loop, sampler)
