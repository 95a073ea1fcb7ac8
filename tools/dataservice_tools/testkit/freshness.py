"""Freshness under load: what a reader of ``ALLOW_CACHED`` sees while others write.

:func:`run` runs ``dataservice loadtest --scenario cached`` (replicas of both
lanes at 60 % of their measured capacity, reads ``ALLOW_CACHED``, writes
through the service, direct SQL updates of the same records, the change
consumer beside them) three times, on a private MariaDB with a binlog, with a
:class:`Checker` beside each:

- a **probe** reads a random record's revision straight from the database
  (its own connection, as root) at instant A: that revision was committed by A;
- the record is then read through the service with ``ALLOW_CACHED`` at A plus
  each of the offsets, and at A + the bound: ``changes.max_lag_s`` plus
  ``cache.controls_max_age_ms`` (how often a worker looks at the freshness
  guard);
- a read at A + the bound that returns a lower revision is a **violation**:
  it saw a revision older than one committed more than the bound earlier.

The three runs, at the same offered load: **stream** (the consumer healthy),
**paused** (the consumer stopped with SIGSTOP from a third of the run to two
thirds, the guard on) and **control** (the consumer stopped as the load starts
and ``changes.guard`` off: the checker must find stale reads there, or it
proves nothing). :func:`verdict` names what fails a run.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from sqlalchemy import create_engine, text

from dataservice.client import Client
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import DataServiceError
from dataservice_tools.loadtest import environment as env
from dataservice_tools.loadtest.runner import Run, RunOptions
from dataservice_tools.loadtest.scenarios import SCENARIOS
from dataservice_tools.loadtest.service import CALLER
from dataservice_tools.localservices import TemporaryBinlogMariaDB
from dataservice_tools.testkit.machine import machine_info


@dataclass(frozen=True)
class Options:
    """What one :func:`run` does."""

    # The queues.yml the runs derive theirs from.
    base_config: Path
    # Where each run writes its report, a folder per run.
    out: Path
    duration: float = 60.0
    replicas: int = 3
    records: int = 1000
    # Interactive capacity, requests/s; measured by the first run if None.
    rate: float | None = None
    probes: float = 20.0  # per second
    # Seconds after a probe to read its record; the bound is always added.
    offsets: tuple[float, ...] = (0.0, 0.05, 0.2, 1.0)
    # Flushed before and after; never 0.
    redis_db: int = 5
    # Reads at the bound a phase must make for its verdict to count.
    min_checks: int = 100
    # changes.max_lag_s for the runs; None keeps base_config's.
    max_lag_s: float | None = None


# Enough that reads start when due even when the guard sends them all to the
# database: each may take tens of milliseconds, and five are due per probe.
READERS = 32
_LANE_FIGURES = ("attempts", "offered_per_s", "goodput_per_s", "p99_ms")
_REVISION = text("SELECT revision FROM records WHERE scope = :scope AND object_id = :object_id")


@dataclass(order=True)
class _Read:
    due: float
    offset: float
    object_id: str
    committed: int  # the database's revision at the probe


class Checker:
    """Probes at ``probes_per_s`` and their reads, until :meth:`stop`."""

    def __init__(
        self,
        run: Run,
        url: str,
        ids: list[str],
        offsets: list[float],
        probes_per_s: float,
        bound_s: float,
    ) -> None:
        self._client = Client(CALLER, run.settings, run.config)
        self._engine = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1)
        self._ids, self._offsets, self._every_s = ids, offsets, 1.0 / probes_per_s
        self._bound_s = bound_s
        self._timeout_s = run.config.lanes.interactive.default_deadline_ms / 1000
        self._due: list[_Read] = []
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self.probes = 0
        self.reads: dict[float, Counter[str]] = {o: Counter() for o in offsets}
        # How long after its due time each offset's reads started, at worst.
        self.late_s: dict[float, float] = dict.fromkeys(offsets, 0.0)
        self.violations: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._guarded, args=(self._probe,))] + [
            threading.Thread(target=self._guarded, args=(self._reader,)) for _ in range(READERS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _guarded(self, work: Callable[[], None]) -> None:
        # A thread that died would leave checks unmade: the run must say so.
        try:
            work()
        except Exception as exc:
            self.failures.append(f"{work.__name__}: {type(exc).__name__}: {exc}")
            self._stop.set()

    def stop(self) -> None:
        """Stop probing; the reads already due are still made."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        for thread in self._threads:
            thread.join()
        self._client.close()
        self._engine.dispose()

    def _probe(self) -> None:
        rng = random.Random(7)
        with self._engine.connect() as conn:
            while not self._stop.wait(self._every_s):
                object_id = rng.choice(self._ids)
                revision = conn.execute(
                    _REVISION, {"scope": env.SCOPE, "object_id": object_id}
                ).scalar_one()
                at = time.monotonic()
                with self._lock:
                    self.probes += 1
                    for offset in self._offsets:
                        heapq.heappush(self._due, _Read(at + offset, offset, object_id, revision))
                    self._lock.notify_all()

    def _next(self) -> _Read | None:
        with self._lock:
            while True:
                if self._due and self._due[0].due <= time.monotonic():
                    return heapq.heappop(self._due)
                if self._stop.is_set() and not self._due:
                    return None
                wait = self._due[0].due - time.monotonic() if self._due else 0.1
                self._lock.wait(max(0.0, min(wait, 0.1)))

    def _reader(self) -> None:
        while (read := self._next()) is not None:
            started = time.monotonic()
            self.late_s[read.offset] = max(self.late_s[read.offset], started - read.due)
            try:
                record = self._client.read(
                    env.SCOPE, read.object_id, mode=ReadMode.ALLOW_CACHED, timeout=self._timeout_s
                )
            except DataServiceError as exc:
                self.reads[read.offset][type(exc).__name__] += 1
                continue
            fresh = record.revision >= read.committed
            self.reads[read.offset]["fresh" if fresh else "stale"] += 1
            if not fresh and read.offset >= self._bound_s:
                self.violations.append(
                    {
                        "object_id": read.object_id,
                        "committed_by_probe": read.committed,
                        "read": record.revision,
                        "seconds_after_probe": round(started - (read.due - read.offset), 3),
                    }
                )


def phase(
    options: Options,
    root_url: str,
    target: env.Target,
    kind: str,
    capacity: dict[LaneName, float] | None = None,
) -> tuple[Run, dict[str, Any], Checker]:
    """One loadtest run with the checker beside it. ``kind``: ``stream`` (the
    consumer healthy), ``paused`` (SIGSTOP to the consumer from a third of the
    run to two thirds, the guard on) or ``control`` (the consumer stopped as
    the load starts and the guard off)."""
    out = options.out / kind
    out.mkdir(parents=True, exist_ok=True)
    base = _base_config(options.base_config, kind, out, options.max_lag_s)
    run_options = RunOptions(
        scenario=SCENARIOS["cached"],
        duration_s=options.duration,
        rate=options.rate,
        replicas=options.replicas,
        out=out,
        base_config=base,
        root_url=root_url,
        records=options.records,
        live=False,
        target=target,
        capacity=capacity,
    )
    loadtest = Run(run_options, Console(file=io.StringIO()))
    bound = loadtest.config.changes.max_lag_s + loadtest.config.cache.controls_max_age_ms / 1000
    outcome: dict[str, Any] = {}

    def execute() -> None:
        try:
            outcome["report"] = loadtest.execute()
        except BaseException as exc:  # raised again by the caller's thread
            outcome["error"] = exc
            loadtest.measuring.set()

    runner = threading.Thread(target=execute, name="loadtest", daemon=True)
    runner.start()
    loadtest.measuring.wait()
    checker: Checker | None = None
    try:
        if "error" in outcome:
            raise outcome["error"]
        consumer = loadtest.stream.consumer
        assert consumer is not None
        if kind == "control":
            loadtest.stream.stop()
        ids = [f"obj-{n:06d}" for n in range(options.records)]
        url = env.direct_url(root_url, target.database)
        offsets = sorted({*options.offsets, bound})
        checker = Checker(loadtest, url, ids, offsets, options.probes, bound)
        checker.start()
        if kind == "paused":
            time.sleep(options.duration / 3)
            os.kill(consumer.pid, signal.SIGSTOP)
            time.sleep(options.duration / 3)
            os.kill(consumer.pid, signal.SIGCONT)
            time.sleep(max(0.0, options.duration / 3 - bound))
        else:
            # Probing stops when its last read would fall after the load.
            time.sleep(max(0.0, options.duration - bound))
    finally:
        if kind == "paused" and loadtest.stream.consumer is not None:
            # Whatever went wrong, a stopped consumer must not outlive the run frozen.
            with contextlib.suppress(ProcessLookupError):
                os.kill(loadtest.stream.consumer.pid, signal.SIGCONT)
        if checker is not None:
            checker.stop()
        runner.join()
    if "error" in outcome:
        raise outcome["error"]
    return loadtest, outcome["report"], checker


def _base_config(base: Path, kind: str, out: Path, max_lag_s: float | None = None) -> Path:
    """``base``; for the control, a copy with the guard off; with
    ``max_lag_s``, a copy with that lag bound."""
    if kind != "control" and max_lag_s is None:
        return base
    data = yaml.safe_load(base.read_text(encoding="utf-8"))
    if kind == "control":
        data["changes"]["guard"] = False
    if max_lag_s is not None:
        data["changes"]["max_lag_s"] = max_lag_s
    path = out / "base.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def lag_bound_s(base: Path, max_lag_s: float | None) -> float:
    """The bound a cached read keeps to under ``base`` (a queues.yml): the lag
    bound and the controls' age."""
    data = yaml.safe_load(base.read_text(encoding="utf-8"))
    lag = data["changes"]["max_lag_s"] if max_lag_s is None else max_lag_s
    return float(lag) + float(data["cache"]["controls_max_age_ms"]) / 1000


def summary(report: dict[str, Any], checker: Checker) -> dict[str, Any]:
    lanes = {
        lane: {k: v for k, v in stats.items() if k in _LANE_FIGURES or k.endswith("_rate")}
        for lane, stats in report["lanes"].items()
    }
    by_offset = {
        f"{offset:g}": {
            **dict(counts),
            "stale_share": _stale_share(counts),
            "latest_start_s": round(checker.late_s[offset], 3),
        }
        for offset, counts in checker.reads.items()
    }
    return {
        "capacity_per_s": report["config"]["capacity_per_s"],
        "lanes": lanes,
        "changes": report["changes"],
        "probes": checker.probes,
        "by_offset_s": by_offset,
        "violations": checker.violations,
        "failures": checker.failures,
    }


def _stale_share(counts: Counter[str]) -> float:
    return round(counts["stale"] / max(1, counts["fresh"] + counts["stale"]), 4)


def verdict(result: dict[str, Any], min_checks: int) -> list[str]:
    """What makes the run fail: a violation, or a run that could not have found one."""
    problems = []
    at_bound = result["stale_at_bound"]
    for kind in ("with_change_stream", "stream_paused"):
        phase = result[kind]
        checked = phase["by_offset_s"][result["setup"]["bound_key"]]
        if phase["violations"]:
            problems.append(f"{kind}: {len(phase['violations'])} violation(s)")
        if checked.get("fresh", 0) + checked.get("stale", 0) < min_checks:
            problems.append(f"{kind}: fewer than {min_checks} reads at the bound")
        if phase["failures"]:
            problems.append(f"{kind}: checker failed: {phase['failures']}")
    if (result["with_change_stream"]["changes"]["hit_ratio"] or 0) < 0.5:
        problems.append("with the stream, under half the reads were cache hits")
    if not at_bound["control"]:
        problems.append("the control found no stale read: the checker proved nothing")
    return problems


def run(options: Options) -> dict[str, Any]:
    """The three runs and what they found; ``problems`` is :func:`verdict`'s."""
    if options.redis_db == 0:
        raise ValueError("redis_db must not be 0")
    bound = lag_bound_s(options.base_config, options.max_lag_s)
    if options.duration / 3 <= bound + 1:
        raise ValueError(
            f"duration must exceed {3 * (bound + 1):g} s "
            "(three phases of the pause, each past the bound by a second)"
        )
    target = env.Target("service", "ds_fresh", "ds-fresh-pw", "dataservice_fresh", options.redis_db)
    server = TemporaryBinlogMariaDB()
    phases: dict[str, dict[str, Any]] = {}
    try:
        server.start()
        root_url = server.url("")
        machine = machine_info(target.redis_url, server.url("mysql"))
        first, report, checker = phase(options, root_url, target, "stream")
        phases["stream"] = summary(report, checker)
        bound = first.config.changes.max_lag_s + first.config.cache.controls_max_age_ms / 1000
        # The same offered load, then without the stream's help.
        for kind in ("paused", "control"):
            _, report, checker = phase(options, root_url, target, kind, capacity=first.capacity)
            phases[kind] = summary(report, checker)
    finally:
        server.stop()
        env.flush_redis(target.redis_url)
    key = f"{bound:g}"
    stale = {kind: phases[kind]["by_offset_s"][key]["stale_share"] for kind in phases}
    result: dict[str, Any] = {
        "machine": machine,
        "setup": {
            "duration_s": options.duration,
            "replicas_per_lane": options.replicas,
            "records": options.records,
            "probes_per_s": options.probes,
            "bound_s": bound,
            "bound_key": key,
            "out": str(options.out),
        },
        "with_change_stream": phases["stream"],
        "stream_paused": phases["paused"],
        "control_without_stream": phases["control"],
        "stale_at_bound": {
            "with_stream": stale["stream"],
            "paused": stale["paused"],
            "control": stale["control"],
            "ratio": round(stale["stream"] / stale["control"], 4) if stale["control"] else None,
        },
    }
    result["problems"] = verdict(result, options.min_checks)
    return result
