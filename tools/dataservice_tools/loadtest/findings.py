"""A load run's report: what was set up and offered, the figures per lane and
of the database, and the verdicts drawn from them."""

from __future__ import annotations

from collections.abc import Sized
from pathlib import Path
from typing import Any, Protocol

from dataservice.config.budget import check_budget
from dataservice.config.model import Config
from dataservice.enums import LaneName
from dataservice.store.engine import driver_read_timeout_s
from dataservice_tools.loadtest import report as rep
from dataservice_tools.loadtest.faults import FAULT_ENDS, Fault
from dataservice_tools.loadtest.incidents import Capacity, SlowDown
from dataservice_tools.loadtest.invariants import fault_report, watched_end
from dataservice_tools.loadtest.openloop import OpenLoop
from dataservice_tools.loadtest.recovery import recovery_report
from dataservice_tools.loadtest.sampler import Sampler
from dataservice_tools.loadtest.scenarios import KILL, Scenario

# Slack on the connection-ramp bound: a sample's time is when its answer
# arrived, but the server counted a moment before (a few ms on a busy
# machine), and the bound credits each process 20/s: 6 x 20/s x 5 ms is under one.
RAMP_TOLERANCE = 2
# Overload that fails fast: at most this share of interactive attempts time out,
# and refused callers hear so within this long (p99).
TIMEOUT_SHARE = 0.05
FAST_REFUSAL_MS = 50.0


class Options(Protocol):
    """What the report reads of a run's options."""

    @property
    def scenario(self) -> Scenario: ...
    @property
    def system(self) -> str: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def replicas(self) -> int: ...
    @property
    def records(self) -> int: ...
    @property
    def max_callers(self) -> int: ...
    @property
    def coalesce(self) -> bool: ...
    @property
    def fault(self) -> Fault | None: ...


class Fleet(Protocol):
    """What the report reads of a run's replicas."""

    @property
    def replicas(self) -> Sized: ...


class Measured(Protocol):
    """What the report reads of a run whose load is over: its set-up, what it
    found on the way and what happened during it."""

    @property
    def o(self) -> Options: ...
    @property
    def config(self) -> Config: ...
    @property
    def config_path(self) -> Path: ...
    @property
    def fleet(self) -> Fleet: ...
    @property
    def delay_ms(self) -> int: ...
    @property
    def timeouts(self) -> dict[LaneName, float]: ...
    @property
    def capacity_source(self) -> str: ...
    @property
    def slow_down(self) -> SlowDown | None: ...
    @property
    def capacity_after(self) -> Capacity | None: ...
    @property
    def capacity_after_source(self) -> str | None: ...
    @property
    def ready_s(self) -> float: ...
    @property
    def harness_cpu_s(self) -> float: ...
    @property
    def machine_stalls(self) -> dict[str, Any]: ...
    @property
    def events(self) -> dict[str, float]: ...
    @property
    def killed(self) -> int: ...
    @property
    def liveness(self) -> dict[str, Any]: ...
    @property
    def changes(self) -> dict[str, Any] | None: ...
    @property
    def aftermath(self) -> dict[str, Any] | None: ...
    @property
    def lengthened_from_s(self) -> float | None: ...


def build_report(
    run: Measured, loop: OpenLoop, sampler: Sampler, capacity: dict[LaneName, float]
) -> dict[str, Any]:
    """The run's JSON report: its set-up, the figures per lane and of the database, the verdicts."""
    o, scenario, config = run.o, run.o.scenario, run.config
    seconds = int(max((r.done for r in loop.records), default=o.duration_s)) + 1
    lanes = {lane.value: rep.lane_stats(loop.records, lane, 0.0, o.duration_s) for lane in LaneName}
    series = rep.per_second(loop.records, seconds)
    database = rep.database_stats(sampler.samples, seconds)
    whole_active = config.budget.database_active - config.budget.reserved
    per_replica = sum(config.lanes[lane].permits for lane in LaneName)
    report: dict[str, Any] = {
        "scenario": {"name": scenario.name, "description": scenario.description},
        "system": o.system,
        "config": {
            "duration_s": o.duration_s,
            # The --duration asked for, when the fault needed a longer run to show.
            **({"duration_asked_s": run.lengthened_from_s} if run.lengthened_from_s else {}),
            "replicas_per_lane": o.replicas,
            "records": o.records,
            "injected_delay_ms": run.delay_ms,
            "timeouts_s": {lane.value: t for lane, t in run.timeouts.items()},
            "capacity_per_s": {lane.value: round(c, 1) for lane, c in capacity.items()},
            "capacity_source": run.capacity_source,
            "coalesce": o.coalesce,
            **_after(run),
            "offered_factor": {
                lane.value: [list(s) for s in scenario.segments.get(lane, ())] for lane in LaneName
            },
            "replicas_ready_s": round(run.ready_s, 1),
            "config_file": str(run.config_path),
        },
        "budget": {
            "service_share_active": whole_active,
            "service_max_connections": config.budget.max_connections,
            "per_replica_pair_permits": per_replica,
            "run_share_active": database.get("peak_share_active"),
            "connect_burst": config.database.connect_burst,
            "connect_rate_per_s": config.database.connect_rate_per_s,
            "budget_lines": check_budget(config).lines,
        },
        "generator": {
            "max_callers": o.max_callers,
            "callers_used": loop.callers,
            "lagged_requests": loop.lagged,
            "max_lag_ms": round(loop.max_lag_s * 1000, 1),
            "harness_cpu_s": round(run.harness_cpu_s, 1),
            "harness_cpu_ms_per_request": round(
                1000 * run.harness_cpu_s / max(1, len(loop.records)), 2
            ),
        },
        "machine_stalls": run.machine_stalls,
        "lanes": lanes,
        "database": database,
        "events": run.events,
        "series": series,
        "sampler_error": sampler.error,
        "active_states_per_s": {
            str(t): dict(c.most_common(4)) for t, c in sorted(sampler.states.items())
        },
    }
    if run.changes is not None:
        report["changes"] = run.changes
    report["liveness"] = run.liveness
    recovery = recovery_report(
        scenario, loop.records, run.events, capacity, run.capacity_after, o.duration_s
    )
    if recovery is not None:
        report["recovery"] = recovery
    report["verdicts"] = _verdicts(run, capacity, report, loop, sampler, series, seconds)
    if o.fault is not None:
        report["fault"] = fault_report(
            o.fault.value,
            run.events,
            loop.records,
            run.timeouts,
            series,
            seconds,
            o.duration_s,
            o.fault.settles_after_s(driver_read_timeout_s(config.database)),
        )
        if run.aftermath is not None:
            report["fault"].update(run.aftermath)
            verdicts = report["fault"]["verdicts"]
            verdicts["acknowledged_writes_kept_once"] = run.aftermath["writes"]["verdict"]
            verdicts["admission_counts_at_rest"] = run.aftermath["admission"]["verdict"]
            verdicts["limits_and_controls_sane"] = run.aftermath["limits"]["verdict"]
        if o.fault.watch_after_s and FAULT_ENDS in run.events:
            watched = watched_end(
                sampler.samples,
                run.events,
                o.fault.watch_after_s,
                config.budget.max_connections,
                series,
                capacity[LaneName.INTERACTIVE],
            )
            report["fault"]["watched_end"] = watched
            report["fault"]["verdicts"].update(watched["verdicts"])
        report["verdicts"].update(report["fault"]["verdicts"])
    return report


def _after(run: Measured) -> dict[str, Any]:
    """The database's speeds and the capacity at the slower one, when the run slows it."""
    if run.slow_down is None or run.capacity_after is None:
        return {}
    return {
        **run.slow_down.describe(),
        "capacity_after_per_s": {lane.value: round(c, 1) for lane, c in run.capacity_after.items()},
        "capacity_after_source": run.capacity_after_source,
    }


def _verdicts(
    run: Measured,
    capacity: dict[LaneName, float],
    report: dict[str, Any],
    loop: OpenLoop,
    sampler: Sampler,
    series: dict[str, Any],
    seconds: int,
) -> dict[str, Any]:
    o, scenario, config = run.o, run.o.scenario, run.config
    db, lanes = report["database"], report["lanes"]
    whole = report["budget"]["service_share_active"]
    verdicts: dict[str, Any] = {
        "connections_within_share_every_sample": db.get("samples", 0) > 0
        and db.get("samples_over_connection_share") == 0,
        "within_run_share": db.get("samples_over_connection_share") == 0
        and db.get("samples_over_active_share") == 0,
        "within_service_share": db.get("peak_active", 0) <= whole
        and db.get("peak_connections", 0) <= config.budget.max_connections,
    }
    if o.system == "naive":
        # A baseline over the share is not compared on the same budget
        # (dataservice_tools.loadtest.naive): the comparison would say nothing.
        verdicts["baseline_within_share"] = (
            db.get("samples", 0) > 0 and verdicts["within_run_share"]
        )
    interactive = LaneName.INTERACTIVE.value
    deadline_ms = run.timeouts[LaneName.INTERACTIVE] * 1000
    p99 = lanes[interactive]["p99_ms"]
    verdicts["interactive_p99_within_deadline"] = p99 is not None and p99 <= deadline_ms
    # Overload fails fast: few callers wait out their deadline, and a refusal
    # reaches its caller at once (its retries inside the call included).
    timeouts = lanes[interactive]["timeout_rate"]
    verdicts["interactive_timeouts_within_share"] = timeouts <= TIMEOUT_SHARE
    refused_p99 = lanes[interactive]["refused_p99_ms"]
    verdicts["interactive_refusals_fast"] = refused_p99 is None or refused_p99 <= FAST_REFUSAL_MS
    verdicts["goodput_over_capacity"] = {
        lane.value: round(lanes[lane.value]["goodput_per_s"] / capacity[lane], 3)
        if capacity[lane]
        else None
        for lane in LaneName
    }
    # Every process's bucket starts at most full, so from the run's start the
    # same bound holds for all new connections (statement-timeout discards included).
    verdicts["connection_ramp"] = rep.reconnect_ramp(
        sampler.samples,
        0.0,
        len(run.fleet.replicas),
        config.database.connect_burst,
        config.database.connect_rate_per_s,
        RAMP_TOLERANCE,
    )
    if KILL in run.events:
        kill_t = run.events[KILL]
        processes = len(run.fleet.replicas)
        verdicts["killed_connections"] = run.killed
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
    liveness = report["liveness"]
    verdicts["liveness_green_throughout"] = (
        liveness["green_throughout"] if liveness["applicable"] else None
    )
    if "recovery" in report:
        verdicts["recovery_after_event_s"] = report["recovery"]["recovery_s"]
        verdicts["recovered_within_10s"] = report["recovery"]["recovered_within_limit"]
        verdicts["goodput_held_after_recovery"] = report["recovery"]["held"]
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
