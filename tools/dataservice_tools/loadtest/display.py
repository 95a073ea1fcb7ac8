"""What a load run shows: the live table while it runs, the summary tables after."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from dataservice.enums import LaneName
from dataservice_tools.loadtest.openloop import OpenLoop, Outcome
from dataservice_tools.loadtest.sampler import Sampler
from dataservice_tools.testkit.series import percentile


def live_table(title: str, duration_s: float, loop: OpenLoop, sampler: Sampler) -> Table:
    """Outcomes so far per lane, and the database's latest sample."""
    elapsed = time.monotonic() - loop.t0
    table = Table(
        title=f"{title}: {max(elapsed, 0):.0f} of {duration_s:.0f} s",
        caption=f"callers {loop.callers}, generator lag {loop.lagged}",
    )
    outcomes = [o for o in Outcome if o is not Outcome.OK]
    for column in ("lane", "offered", "ok", *(o.value for o in outcomes), "p99 ms"):
        table.add_column(column, justify="left" if column == "lane" else "right")
    records = list(loop.records)
    for lane in LaneName:
        mine = [r for r in records if r.lane is lane]
        counts = {o: sum(1 for r in mine if r.outcome is o) for o in Outcome}
        recent = [r.latency_ms for r in mine[-2000:] if r.outcome is Outcome.OK]
        p99 = percentile(recent, 99)
        table.add_row(
            lane.value,
            str(loop.scheduled[lane]),
            str(counts[Outcome.OK]),
            *(str(counts[o]) for o in outcomes),
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
            "",
        )
    return table


def _cell(value: Any, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _table(title: str, columns: tuple[str, ...], caption: str) -> Table:
    table = Table(title=title, caption=caption)
    for column in columns:
        left = column in ("system", "lane")
        table.add_column(column, justify="left" if left else "right", no_wrap=left)
    return table


def summary_tables(reports: list[dict[str, Any]]) -> list[Table]:
    """Per lane: load, outcomes and latency; per system: the database's view."""
    lanes = _table(
        "loadtest: lanes",
        ("system", "lane", "in/s", "ok/s", "x cap", "rej", "unav", "t/o", "p50", "p95", "p99"),
        "in: offered; ok: goodput; x cap: goodput / capacity; rej: refused for load; "
        "unav: a dependency down; t/o: timed out; latency in ms, of ok answers",
    )
    database = _table(
        "loadtest: database (sampled as root)",
        ("system", "conns", "active", "share", "over", "new/s", "Hz", "lagged"),
        "peaks; share: what the live replicas may hold; over: samples above it",
    )
    for report in reports:
        ratio = report["verdicts"]["goodput_over_capacity"]
        for n, (lane, stats) in enumerate(report["lanes"].items()):
            lanes.add_row(
                report.get("variant", report["system"]) if n == 0 else "",
                lane,
                _cell(stats["offered_per_s"], "{:.1f}"),
                _cell(stats["goodput_per_s"], "{:.1f}"),
                _cell(ratio.get(lane), "{:.2f}"),
                _cell(stats["rejection_rate"], "{:.0%}"),
                _cell(stats["unavailable_rate"], "{:.0%}"),
                _cell(stats["timeout_rate"], "{:.0%}"),
                _cell(stats["p50_ms"]),
                _cell(stats["p95_ms"]),
                _cell(stats["p99_ms"]),
            )
        db = report["database"]
        over = (db.get("samples_over_connection_share") or 0) + (
            db.get("samples_over_active_share") or 0
        )
        database.add_row(
            report.get("variant", report["system"]),
            _cell(db.get("peak_connections")),
            _cell(db.get("peak_active")),
            _cell(db.get("peak_share_active")),
            str(over),
            _cell(db.get("peak_new_connections_per_s")),
            _cell(db.get("sample_hz")),
            str(report["generator"]["lagged_requests"]),
        )
    return [lanes, database]
