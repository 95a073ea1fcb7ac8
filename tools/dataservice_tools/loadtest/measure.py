"""The measured part of a run: the open-loop load, the database sampler, the
liveness watch and the scenario's events, from one start instant; then the report."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.live import Live
from rich.table import Table

from dataservice.enums import LaneName
from dataservice_tools.loadtest import environment as env
from dataservice_tools.loadtest.aftermath import for_run
from dataservice_tools.loadtest.display import live_table
from dataservice_tools.loadtest.findings import build_report
from dataservice_tools.loadtest.liveness import LivenessWatch
from dataservice_tools.loadtest.openloop import Adapter, OpenLoop
from dataservice_tools.loadtest.sampler import Sampler
from dataservice_tools.loadtest.scenarios import ROTATE
from dataservice_tools.loadtest.stalls import StallMeter

if TYPE_CHECKING:
    from dataservice_tools.loadtest.runner import Run

# How often the loop looks for a due event: an event happens at most this late
# (its report time is when it happened).
TICK_S = 0.1


def measure(
    run: Run, adapter: Adapter, ids: list[str], payload: bytes, capacity: dict[LaneName, float]
) -> dict[str, Any]:
    """Offer the scenario's load for its duration, perform its events, and report."""
    o, scenario = run.o, run.o.scenario
    t0 = time.monotonic() + 0.5
    sampler = Sampler(o.root_url, run.target.user, t0, run.fleet.share)
    run.samples = sampler.samples
    watch = None
    if run.alive_dir is not None:
        watch = LivenessWatch(run.settings, run.fleet.alive_files, t0)
    loop = OpenLoop(
        adapter,
        lambda lane, t: scenario.factor(lane, t / o.duration_s) * capacity[lane],
        run.timeouts,
        ids,
        payload,
        o.duration_s,
        t0,
        o.max_callers,
        **({"read_share": scenario.read_share} if scenario.read_share else {}),
    )
    faults = {} if o.fault is None else o.fault.events(o.duration_s)
    pending = scenario.events(o.duration_s) | faults
    aftermath = for_run(run)
    cpu_before = time.process_time()
    live = Live(_table(run, loop, sampler), console=run.console, auto_refresh=False)
    stalls = StallMeter()
    try:
        stalls.start()
        sampler.start()
        if watch is not None:
            watch.start()
        loop.start(run.expected_callers(capacity))
        run.stream.begin(
            run.config,
            run.target.redis_url,
            env.direct_url(o.root_url, run.target.database),
            env.SCOPE,
            ids,
            capacity[LaneName.INTERACTIVE],
            o.duration_s,
            t0,
        )
        run.measuring.set()
        if o.live:
            live.start()
        ticks = 0
        while time.monotonic() - t0 < o.duration_s:
            elapsed = time.monotonic() - t0
            for name, at in list(pending.items()):
                if elapsed >= at and run.may_perform(name):
                    run.perform(name)
                    run.events[name] = round(elapsed, 2)
                    del pending[name]
            ticks += 1
            # The display costs the generator's CPU: twice a second is enough.
            if o.live and ticks % 5 == 0:
                live.update(_table(run, loop, sampler), refresh=True)
            time.sleep(TICK_S)
        loop.join()
        run.aftermath = None if aftermath is None else aftermath.close(loop.records)
    finally:
        live.stop()
        sampler.stop()
        if watch is not None:
            watch.stop()
            run.liveness = watch.report()
        run.stream.finish(run.events.get(ROTATE), o.duration_s)
        stalls.stop()
        run.machine_stalls = stalls.summary(t0)
    # The generator shares the machine with the service: its CPU goes in the report.
    run.harness_cpu_s = time.process_time() - cpu_before
    return build_report(run, loop, sampler, capacity)


def _table(run: Run, loop: OpenLoop, sampler: Sampler) -> Table:
    title = f"{run.o.system} / {run.o.scenario.name}"
    return live_table(title, run.o.duration_s, loop, sampler)
