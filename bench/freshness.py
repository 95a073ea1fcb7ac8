"""Freshness under load: what a reader of ``ALLOW_CACHED`` sees while others write.

    .venv/bin/python bench/freshness.py [--duration 60] [--replicas 3] [--max-lag-s S]
                                        [--json out.json]

Sets everything up itself: a private MariaDB with a binlog (a temporary
directory and a free port) and Redis db ``--redis-db`` (flushed; never 0).
Then it runs ``dataservice loadtest --scenario cached`` (the same run the
command makes: replicas of both lanes at 60 % of their measured capacity,
reads ``ALLOW_CACHED``, writes through the service, direct SQL updates of the
same records at 5 % of the interactive capacity, the change consumer beside
them) three times, with a checker beside each:

- a **probe** reads a random record's revision straight from the database
  (its own connection, as root) at instant A: that revision was committed by A;
- the record is then read through the service with ``ALLOW_CACHED`` at A plus
  each of ``--offsets``, and at A + the bound: ``changes.max_lag_s`` plus
  ``cache.controls_max_age_ms`` (how often a worker looks at the freshness
  guard), 5 s + 1 s with the shipped values;
- a read at A + the bound that returns a lower revision is a **violation**:
  it saw a revision older than one committed more than the bound earlier.

The three runs, at the same offered load:

1. **stream**: the consumer healthy. No violation; the earlier offsets show
   how often the cache is behind right after a commit.
2. **paused**: the consumer is stopped with SIGSTOP from a third of the run to
   two thirds (it holds its lease and its last report, and then wakes), the
   guard on. No violation: the guard must close the cache within the bound.
3. **control**, the baseline: the consumer stopped as the load starts and
   ``changes.guard`` off, so only the service's own writes reach the cache.
   The same checker must find stale reads here: a checker that cannot fail
   proves nothing. The report gives the stale share at the bound in each run.

The run fails (exit 1) on any violation, and also when it could not have
found one: too few reads at the bound (``--min-checks``), a checker thread
that died, a cache hit ratio under 0.5 with the stream, or a control with no
stale read. Each offset's ``latest_start_s`` says how late its reads started.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import io
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from dataservice_tools.loadtest import environment as env
from dataservice_tools.loadtest.runner import Run, RunOptions
from dataservice_tools.loadtest.scenarios import SCENARIOS
from dataservice_tools.localservices import TemporaryBinlogMariaDB
from rich.console import Console
from sqlalchemy import create_engine, text

from bench import _env
from dataservice.client import Client
from dataservice.enums import LaneName, ReadMode
from dataservice.errors import DataServiceError

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
        self._client = Client(_env.CALLER, run.settings, run.config)
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
    args: argparse.Namespace,
    root_url: str,
    target: env.Target,
    kind: str,
    capacity: dict[LaneName, float] | None = None,
) -> tuple[Run, dict[str, Any], Checker]:
    """One loadtest run with the checker beside it. ``kind``: ``stream`` (the
    consumer healthy), ``paused`` (SIGSTOP to the consumer from a third of the
    run to two thirds, the guard on) or ``control`` (the consumer stopped as
    the load starts and the guard off)."""
    out = args.out / kind
    out.mkdir(parents=True, exist_ok=True)
    base = _base_config(kind, out, args.max_lag_s)
    options = RunOptions(
        scenario=SCENARIOS["cached"],
        duration_s=args.duration,
        rate=args.rate,
        replicas=args.replicas,
        out=out,
        base_config=base,
        root_url=root_url,
        records=args.records,
        live=False,
        target=target,
        capacity=capacity,
    )
    loadtest = Run(options, Console(file=io.StringIO()))
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
        ids = [f"obj-{n:06d}" for n in range(args.records)]
        url = env.direct_url(root_url, target.database)
        checker = Checker(loadtest, url, ids, sorted({*args.offsets, bound}), args.probes, bound)
        checker.start()
        if kind == "paused":
            time.sleep(args.duration / 3)
            os.kill(consumer.pid, signal.SIGSTOP)
            time.sleep(args.duration / 3)
            os.kill(consumer.pid, signal.SIGCONT)
            time.sleep(max(0.0, args.duration / 3 - bound))
        else:
            # Probing stops when its last read would fall after the load.
            time.sleep(max(0.0, args.duration - bound))
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


def _base_config(kind: str, out: Path, max_lag_s: float | None = None) -> Path:
    """The shipped queues.yml; for the control, a copy with the guard off;
    with ``max_lag_s``, a copy with that lag bound."""
    base = _env.REPO / "queues.yml"
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


def lag_bound_s(max_lag_s: float | None) -> float:
    """The bound a cached read keeps to: the lag bound and the controls' age."""
    data = yaml.safe_load((_env.REPO / "queues.yml").read_text(encoding="utf-8"))
    lag = data["changes"]["max_lag_s"] if max_lag_s is None else max_lag_s
    return float(lag) + data["cache"]["controls_max_age_ms"] / 1000


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


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.redis_db == 0:
        raise ValueError("--redis-db must not be 0")
    bound = lag_bound_s(args.max_lag_s)
    if args.duration / 3 <= bound + 1:
        raise ValueError(
            f"--duration must exceed {3 * (bound + 1):g} s "
            "(three phases of the pause, each past the bound by a second)"
        )
    target = env.Target("service", "ds_fresh", "ds-fresh-pw", "dataservice_fresh", args.redis_db)
    args.out = args.out or Path(".state/bench/freshness") / time.strftime("%Y%m%dT%H%M%S")
    server = TemporaryBinlogMariaDB()
    phases: dict[str, dict[str, Any]] = {}
    try:
        server.start()
        root_url = server.url("")
        machine = _env.machine_info(target.redis_url, server.url("mysql"))
        first, report, checker = phase(args, root_url, target, "stream")
        phases["stream"] = summary(report, checker)
        bound = first.config.changes.max_lag_s + first.config.cache.controls_max_age_ms / 1000
        # The same offered load, then without the stream's help.
        for kind in ("paused", "control"):
            _, report, checker = phase(args, root_url, target, kind, capacity=first.capacity)
            phases[kind] = summary(report, checker)
    finally:
        server.stop()
        env.flush_redis(target.redis_url)
    key = f"{bound:g}"
    stale = {kind: phases[kind]["by_offset_s"][key]["stale_share"] for kind in phases}
    result = {
        "command": " ".join(["python", "bench/freshness.py", *sys.argv[1:]]),
        "machine": machine,
        "setup": {
            "duration_s": args.duration,
            "replicas_per_lane": args.replicas,
            "records": args.records,
            "probes_per_s": args.probes,
            "bound_s": bound,
            "bound_key": key,
            "out": str(args.out),
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
    result["problems"] = verdict(result, args.min_checks)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--rate", type=float, help="interactive capacity (default: measured)")
    p.add_argument("--probes", type=float, default=20.0, help="probes per second")
    p.add_argument(
        "--offsets", type=float, nargs="*", default=[0.0, 0.05, 0.2, 1.0],
        help="seconds after a probe to read it (bound + 1 s is always added)",
    )  # fmt: skip
    p.add_argument("--redis-db", type=int, default=5, help="flushed before and after; not 0")
    p.add_argument(
        "--out", type=Path, help="the runs' reports (default: .state/bench/freshness/<time>)"
    )
    p.add_argument("--min-checks", type=int, default=100, help="reads at the bound, per phase")
    p.add_argument(
        "--max-lag-s", type=float, help="changes.max_lag_s for the runs (default: queues.yml's)"
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.redis_db == 0:
        p.error("--redis-db must not be 0")
    result = run(args)
    print(yaml.safe_dump({k: v for k, v in result.items() if k != "machine"}, sort_keys=False))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    for problem in result["problems"]:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
