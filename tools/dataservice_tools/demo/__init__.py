"""The bounded demo workload behind ``make demo`` (``dataservice run --demo N``).

1. :mod:`.workload`: N records per lane written and read back, every payload
   and revision checked.
2. :mod:`.cache`: a sample read back through each cache format, and a stampede
   of concurrent reads on cold records.
3. :mod:`.drills`: what failures look like, each provoked on purpose and
   checked against the documented answer.
4. :mod:`.scrape`: what every process's metrics endpoint says at the end.

It passes (exit 0) when every record and drill came out as expected.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from dataservice.client import Client
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.supervisor import Snapshot, Supervisor
from dataservice_tools.demo import drills
from dataservice_tools.demo.cache import CacheReport, run_cache_phase
from dataservice_tools.demo.drills import Drill
from dataservice_tools.demo.scrape import counter_table, scrape, stage_table
from dataservice_tools.demo.workload import SCOPE, payload_for, report_table, run_workload

CALLER = "demo"
QUIET_WAIT_S = 10.0

__all__ = ["CALLER", "run_demo"]


def run_demo(console: Console, settings: Settings, supervisor: Supervisor, records: int) -> int:
    """Run every part against the running service; print the summary; exit code."""
    run = time.strftime("%Y%m%dT%H%M%S")
    with Client(CALLER, settings, supervisor.config) as client:
        reports = run_workload(client, records, run)
        console.print(report_table(reports))
        interactive = next(r for r in reports if r.lane is LaneName.INTERACTIVE)
        written = {i: payload_for(i) for i in interactive.ids}
        cache = run_cache_phase(client, supervisor.config, settings.redis_url, written, SCOPE)
        console.print(_cache_line(cache))
        done = [
            drills.outside_the_allowlist(client),
            drills.batch_backlog(client, SCOPE, run),
            *drills.locked_record(client, settings.database_url, SCOPE, run),
        ]
    console.print(_drill_table(done))
    console.print(supervisor.table(_quiet(supervisor)))
    if supervisor.metrics:
        scraped = scrape(supervisor.metrics)
        console.print(stage_table(scraped))
        console.print(counter_table(scraped))
    ok = all(r.ok for r in reports) and cache.ok and all(d.ok for d in done)
    console.print("demo passed" if ok else "[red]demo failed: see above[/red]")
    return 0 if ok else 1


def _quiet(supervisor: Supervisor, timeout_s: float = QUIET_WAIT_S) -> Snapshot:
    """The service once nothing waits in a queue and no permit is held: a
    request whose caller gave up may still hold one (a killed connection's,
    until the server's own bound), and its outcome belongs in the summary."""
    stop = time.monotonic() + timeout_s
    while True:
        snap = supervisor.snapshot()
        lanes = snap.lanes.values()
        if all(s.depth == 0 and s.permits_in_use == 0 for s in lanes):
            return snap
        if time.monotonic() >= stop:
            return snap
        time.sleep(0.2)


def _cache_line(cache: CacheReport) -> str:
    if not cache.fresh:
        return (
            "cache: not read (the change consumer did not report the cache fresh; "
            "reads went to the database)"
        )
    formats = ", ".join(f"{fmt} {n}/{cache.sampled}" for fmt, n in sorted(cache.verified.items()))
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(cache.errors.items())) or "none"
    return (
        f"cache: read back through each format: {formats}; stampede: {cache.stampede_keys} cold "
        f"records x {cache.stampede_reads // max(cache.stampede_keys, 1)} concurrent reads; "
        f"errors: {errors}"
    )


def _drill_table(done: list[Drill]) -> Table:
    table = Table(title="drills: failures on purpose, and how the service answered")
    for column in ("drill", "expected", "observed", ""):
        table.add_column(column)
    for drill in done:
        expected = " or ".join(drill.expected)
        table.add_row(drill.name, expected, drill.observed, "ok" if drill.ok else "[red]FAIL[/red]")
    return table
