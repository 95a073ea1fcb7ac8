"""The demo's records: for each lane, a fixed number of records is written and read back through the
real client (awaited calls on the interactive lane, submitted handles on the
batch lane) by a few concurrent callers; every read is checked against what
was written. The report gives throughput and p50/p99 latency per lane.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rich.table import Table

from dataservice.client import Client
from dataservice.enums import LaneName
from dataservice.errors import DataServiceError, ResourceExhausted
from dataservice.types import Operation, ReadOp, Record, WriteOp, WriteResult
from dataservice_tools.testkit.series import percentile

SCOPE = "demo"
CALLERS = 8


def payload_for(object_id: str) -> bytes:
    """A deterministic 256-1,024 byte payload, so a read can be checked without state."""
    seed = hashlib.sha256(object_id.encode()).digest()
    size = 256 + int.from_bytes(seed[:2], "big") % 769
    return (seed * (size // len(seed) + 1))[:size]


@dataclass
class LaneReport:
    lane: LaneName
    records: int
    elapsed_s: float = 0.0
    write_ms: list[float] = field(default_factory=list)
    read_ms: list[float] = field(default_factory=list)
    verified: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    ids: list[str] = field(default_factory=list)

    @property
    def operations(self) -> int:
        return len(self.write_ms) + len(self.read_ms)

    @property
    def throughput(self) -> float:
        return self.operations / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def ok(self) -> bool:
        return self.verified == self.records and not self.errors


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - start) * 1000


# A batch job told to come back (the caller's rate, a full lane) tries again
# after the retry-after it was given, this many times at most.
BATCH_ATTEMPTS = 5


def _submitted(client: Client, operation: Operation) -> object:
    """``operation`` submitted on the batch lane and its result, as a batch job
    keeps within the service's backpressure: a refused submit waits its retry-after."""
    for attempt in range(1, BATCH_ATTEMPTS + 1):
        try:
            return client.submit(operation).result()
        except ResourceExhausted as exc:
            if attempt == BATCH_ATTEMPTS:
                raise
            time.sleep(exc.retry_after)
    raise AssertionError("unreachable")


def _one_record(client: Client, lane: LaneName, object_id: str, report: LaneReport) -> None:
    payload = payload_for(object_id)
    try:
        if lane is LaneName.INTERACTIVE:
            written, write_ms = _timed(lambda: client.write(SCOPE, object_id, payload))
            read, read_ms = _timed(lambda: client.read(SCOPE, object_id))
        else:
            written, write_ms = _timed(
                lambda: _submitted(client, WriteOp(SCOPE, object_id, payload))
            )
            read, read_ms = _timed(lambda: _submitted(client, ReadOp(SCOPE, object_id)))
    except DataServiceError as exc:
        name = type(exc).__name__
        report.errors[name] = report.errors.get(name, 0) + 1
        return
    report.write_ms.append(write_ms)
    report.read_ms.append(read_ms)
    if (
        isinstance(written, WriteResult)
        and isinstance(read, Record)
        and read.payload == payload
        and read.revision == written.revision
    ):
        report.verified += 1
    else:
        report.errors["mismatch"] = report.errors.get("mismatch", 0) + 1


def run_lane(client: Client, lane: LaneName, records: int, run_id: str) -> LaneReport:
    ids = [f"{run_id}-{lane.value}-{n:06d}" for n in range(records)]
    report = LaneReport(lane, records, ids=ids)
    start = time.perf_counter()
    with ThreadPoolExecutor(CALLERS, thread_name_prefix=f"demo-{lane.value}") as pool:
        for future in [pool.submit(_one_record, client, lane, i, report) for i in ids]:
            future.result()
    report.elapsed_s = time.perf_counter() - start
    return report


def run_workload(client: Client, records: int, run_id: str) -> list[LaneReport]:
    return [run_lane(client, lane, records, run_id) for lane in LaneName]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}ms"


def report_table(reports: list[LaneReport]) -> Table:
    table = Table(title=f"demo: each record written and read back, {CALLERS} callers per lane")
    for column in ("lane", "verified", "ops/s", "write p50", "p99", "read p50", "p99", "errors"):
        table.add_column(column, justify="left" if column == "lane" else "right")
    for r in reports:
        table.add_row(
            r.lane.value,
            f"{r.verified}/{r.records}",
            f"{r.throughput:.0f}",
            _ms(percentile(r.write_ms, 50)),
            _ms(percentile(r.write_ms, 99)),
            _ms(percentile(r.read_ms, 50)),
            _ms(percentile(r.read_ms, 99)),
            ", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())) or "none",
        )
    return table
