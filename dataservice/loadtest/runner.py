"""One load run: set up, calibrate, offer the scenario's load, watch, report.

The harness owns everything it starts: its replicas are stopped on any exit,
and only its own Redis db numbers and databases are reset.
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery
from rich.console import Console
from rich.live import Live
from rich.table import Table

from dataservice.broker import celery_settings
from dataservice.budget import check_budget
from dataservice.config import Config
from dataservice.enums import LaneName
from dataservice.errors import ServiceSetupError
from dataservice.loadtest import environment as env
from dataservice.loadtest import report as rep
from dataservice.loadtest.sampler import Sample, Sampler, kill_connections
from dataservice.loadtest.scenarios import Scenario
from dataservice.loadtest.traffic import (
    CALLER,
    Adapter,
    OpenLoop,
    ServiceAdapter,
    closed_loop_capacity,
)

BATCH_TIMEOUT_S = 5.0
# Slack on the connection-ramp bound: a sample's time is taken before its two
# queries run (a few ms), so its count can include connections from a moment
# the bound has not yet credited: 6 processes x 20/s x 5 ms is under one.
RAMP_TOLERANCE = 2


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


class Pinger:
    """Process ids of the replicas that answer Celery's control ping."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def __call__(self) -> set[int]:
        replies = self.app.control.ping(timeout=0.5) or []
        # Node names are "<lane>-<pid>@host" (naive: "naive-<queue>-<pid>@host").
        return {int(next(iter(r)).split("@")[0].rsplit("-", 1)[1]) for r in replies}

    def close(self) -> None:
        self.app.close()


def _naive() -> Any:
    # bench/ is not part of the installed package: the baseline is found in the
    # source tree the harness runs from, whatever the working directory.
    if str(env.REPO) not in sys.path and (env.REPO / "bench" / "naive").is_dir():
        sys.path.insert(0, str(env.REPO))
    try:
        return importlib.import_module("bench.naive.harness")
    except ImportError as exc:
        raise ServiceSetupError(
            "the naive baseline lives in bench/naive/: run from the repository root"
        ) from exc


class Run:
    def __init__(self, options: RunOptions, console: Console) -> None:
        self.o = options
        self.console = console
        self.target = options.target or env.TARGETS[options.system]
        options.out.mkdir(parents=True, exist_ok=True)
        delay = options.db_delay_ms + options.scenario.extra_delay_ms
        self.config_path, self.config = env.scenario_config(options.base_config, options.out, delay)
        self.delay_ms = delay
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
        if options.system == "service":
            self.environ = env.python_env(self.settings.to_env())
            argv_for: env.ArgvFor = env.service_argv
            control = Celery("loadtest-control", set_as_current=False)
            control.conf.update(celery_settings(self.settings, self.config))
            self.ping = Pinger(control)
        else:
            naive = _naive()
            self.environ = env.python_env({})
            url = self.target.database_url(options.root_url)
            redis_url = self.target.redis_url

            def argv_for(lane: LaneName) -> list[str]:
                return list(naive.worker_argv(lane, self.config, redis_url, url, delay))

            self.ping = Pinger(naive.make_app(redis_url))
        self.fleet = env.Fleet(argv_for, self.environ, options.out / "logs", self.config)

    def expected_callers(self, capacity: dict[LaneName, float] | None = None) -> int:
        """Callers the schedule keeps busy if every request waits up to a second."""
        o = self.o
        capacity = capacity or o.capacity or capacities_from_rate(o.rate or 100.0, self.config)
        peak = {
            lane: max((f for _, _, f in o.scenario.segments.get(lane, ())), default=0.0)
            for lane in LaneName
        }
        busy = sum(peak[lane] * capacity[lane] * min(self.timeouts[lane], 1.0) for lane in LaneName)
        return min(o.max_callers, int(busy) + 16)

    def adapter(self) -> Adapter:
        if self.o.system == "service":
            return ServiceAdapter(self.settings, self.config, self.expected_callers())
        adapter: Adapter = _naive().NaiveAdapter(self.target.redis_url, self.config)
        return adapter

    def execute(self) -> dict[str, Any]:
        o = self.o
        env.flush_redis(self.target.redis_url)
        with self.console.status(f"{o.system}: preparing {self.target.database}"):
            ids = env.prepare_database(self.target, self.config, o.records, o.root_url)
        payload = bytes(range(256)) * (env.PAYLOAD_BYTES // 256)
        adapter = self.adapter()
        try:
            self.fleet.start(o.replicas, generation=0)
            with self.console.status(f"{o.system}: starting {2 * o.replicas} replicas"):
                self.ready_s = env.wait_ready(self.fleet, self.ping)
            capacity, source = o.capacity, "given (the service run's probe)"
            if capacity is None and o.rate is not None:
                capacity, source = capacities_from_rate(o.rate, self.config), "--rate"
            if capacity is None:
                source = "closed-loop probe"
                callers = {
                    lane: 2 * o.replicas * self.config.lanes[lane].permits for lane in LaneName
                }
                with self.console.status(f"{o.system}: probing capacity"):
                    capacity = closed_loop_capacity(
                        adapter, callers, self.timeouts, ids, payload, 1.0, o.calibrate_s
                    )
            self.capacity, self.capacity_source = capacity, source
            return self._measure(adapter, ids, payload, capacity)
        finally:
            self.fleet.stop()
            adapter.close()
            self.ping.close()

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
        pending = {
            name: at * o.duration_s
            for name, at in (
                ("deploy: new replicas", scenario.overlap_start),
                ("deploy: old replicas SIGTERM", scenario.overlap_stop),
                ("kill all connections", scenario.kill_at),
            )
            if at is not None
        }
        cpu_before = time.process_time()
        sampler.start()
        loop.start(self.expected_callers(capacity))
        live = Live(self._table(loop, sampler), console=self.console, auto_refresh=False)
        if o.live:
            live.start()
        try:
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
        # The generator shares the machine with the service: its CPU goes in the report.
        self.harness_cpu_s = time.process_time() - cpu_before
        return self._report(loop, sampler, capacity)

    def _event(self, name: str) -> None:
        if name.startswith("deploy: new"):
            self.fleet.start(self.o.replicas, generation=1)
        elif name.startswith("deploy: old"):
            self.fleet.terminate(0)
        else:
            self.killed = kill_connections(self.o.root_url, self.target.user)

    def _table(self, loop: OpenLoop, sampler: Sampler) -> Table:
        elapsed = time.monotonic() - loop.t0
        table = Table(
            title=f"{self.o.system} / {self.o.scenario.name}: {max(elapsed, 0):.0f}"
            f" of {self.o.duration_s:.0f} s",
            caption=f"callers {loop.callers}, generator lag {loop.lagged}",
        )
        for column in ("lane", "offered", "ok", "rejected", "timeout", "error", "p99 ms"):
            table.add_column(column, justify="left" if column == "lane" else "right")
        records = list(loop.records)
        for lane in LaneName:
            mine = [r for r in records if r.lane is lane]
            counts = {o: sum(1 for r in mine if r.outcome.value == o) for o in ("ok", "rejected")}
            timeouts = sum(1 for r in mine if r.outcome.value == "timeout")
            errors = sum(1 for r in mine if r.outcome.value == "error")
            recent = [r.latency_ms for r in mine[-2000:] if r.outcome.value == "ok"]
            p99 = rep.percentile(recent, 99)
            table.add_row(
                lane.value,
                str(loop.scheduled[lane]),
                str(counts["ok"]),
                str(counts["rejected"]),
                str(timeouts),
                str(errors),
                "-" if p99 is None else f"{p99:.0f}",
            )
        now = sampler.latest()
        if now is not None:
            table.add_row(
                "database",
                f"conns {now.connections}",
                f"active {now.active}",
                f"share {now.share_active}",
                f"opened {now.opened_total}",
                f"{sampler.achieved_hz():.0f} Hz",
                "",
            )
        return table

    def _report(
        self, loop: OpenLoop, sampler: Sampler, capacity: dict[LaneName, float]
    ) -> dict[str, Any]:
        o, scenario, config = self.o, self.o.scenario, self.config
        seconds = int(max((r.done for r in loop.records), default=o.duration_s)) + 1
        lanes = {
            lane.value: rep.lane_stats(loop.records, lane, 0.0, o.duration_s) for lane in LaneName
        }
        series = rep.per_second(loop.records, seconds)
        database = rep.database_stats(sampler.samples, seconds)
        whole_active = config.budget.database_active - config.budget.reserved
        per_replica = sum(config.lanes[lane].permits for lane in LaneName)
        report: dict[str, Any] = {
            "scenario": {"name": scenario.name, "description": scenario.description},
            "system": o.system,
            "config": {
                "duration_s": o.duration_s,
                "replicas_per_lane": o.replicas,
                "records": o.records,
                "injected_delay_ms": self.delay_ms,
                "timeouts_s": {lane.value: t for lane, t in self.timeouts.items()},
                "capacity_per_s": {lane.value: round(c, 1) for lane, c in capacity.items()},
                "capacity_source": self.capacity_source,
                "offered_factor": {
                    lane.value: [list(s) for s in scenario.segments.get(lane, ())]
                    for lane in LaneName
                },
                "replicas_ready_s": round(self.ready_s, 1),
                "config_file": str(self.config_path),
            },
            "budget": {
                "service_share_active": whole_active,
                "service_max_connections": config.budget.max_connections,
                "per_replica_pair_permits": per_replica,
                "run_share_active": database.get("peak_share_active"),
                "budget_lines": check_budget(config).lines,
            },
            "generator": {
                "max_callers": o.max_callers,
                "callers_used": loop.callers,
                "lagged_requests": loop.lagged,
                "max_lag_ms": round(loop.max_lag_s * 1000, 1),
                "harness_cpu_s": round(self.harness_cpu_s, 1),
                "harness_cpu_ms_per_request": round(
                    1000 * self.harness_cpu_s / max(1, len(loop.records)), 2
                ),
            },
            "lanes": lanes,
            "database": database,
            "events": self.events,
            "series": series,
            "sampler_error": sampler.error,
            "active_states_per_s": {
                str(t): dict(c.most_common(4)) for t, c in sorted(sampler.states.items())
            },
        }
        report["verdicts"] = self._verdicts(report, loop, sampler, series, seconds)
        return report

    def _verdicts(
        self,
        report: dict[str, Any],
        loop: OpenLoop,
        sampler: Sampler,
        series: dict[str, Any],
        seconds: int,
    ) -> dict[str, Any]:
        o, scenario, config = self.o, self.o.scenario, self.config
        db, lanes = report["database"], report["lanes"]
        whole = report["budget"]["service_share_active"]
        verdicts: dict[str, Any] = {
            "within_run_share": db.get("samples_over_connection_share") == 0
            and db.get("samples_over_active_share") == 0,
            "within_service_share": db.get("peak_active", 0) <= whole
            and db.get("peak_connections", 0) <= config.budget.max_connections,
        }
        interactive = LaneName.INTERACTIVE.value
        deadline_ms = self.timeouts[LaneName.INTERACTIVE] * 1000
        p99 = lanes[interactive]["p99_ms"]
        verdicts["interactive_p99_within_deadline"] = p99 is not None and p99 <= deadline_ms
        verdicts["goodput_over_capacity"] = {
            lane.value: round(lanes[lane.value]["goodput_per_s"] / self.capacity[lane], 3)
            if self.capacity[lane]
            else None
            for lane in LaneName
        }
        # Every process's bucket starts at most full, so from the run's start the
        # same bound holds for all new connections (statement-timeout discards included).
        verdicts["connection_ramp"] = rep.reconnect_ramp(
            sampler.samples,
            0.0,
            len(self.fleet.pids()),
            config.database.connect_burst,
            config.database.connect_rate_per_s,
            RAMP_TOLERANCE,
        )
        if "kill all connections" in self.events:
            kill_t = self.events["kill all connections"]
            processes = len(self.fleet.pids())
            verdicts["killed_connections"] = self.killed
            verdicts["reconnect"] = rep.reconnect_ramp(
                sampler.samples,
                kill_t,
                processes,
                config.database.connect_burst,
                config.database.connect_rate_per_s,
                RAMP_TOLERANCE,
            )
            verdicts["recovery_s"] = rep.recovery_s(
                series, LaneName.INTERACTIVE, kill_t, min(seconds, int(o.duration_s))
            )
        if scenario.compare_at is not None:
            # The first second (replicas' first connections) is left out of "alone".
            split = scenario.compare_at * o.duration_s
            alone = rep.lane_stats(loop.records, LaneName.INTERACTIVE, 1.0, split)
            flooded = rep.lane_stats(loop.records, LaneName.INTERACTIVE, split, o.duration_s)
            ratio = (
                round(flooded["p99_ms"] / alone["p99_ms"], 3)
                if alone["p99_ms"] and flooded["p99_ms"]
                else None
            )
            verdicts["interactive_alone"] = alone
            verdicts["interactive_with_flood"] = flooded
            verdicts["p99_ratio_flood_vs_alone"] = ratio
            verdicts["p99_rise_within_20_percent"] = ratio is not None and ratio <= 1.2
        return verdicts
