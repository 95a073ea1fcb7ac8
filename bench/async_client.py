"""AsyncClient against Client: the cached read round trip, one caller process each.

    .venv/bin/python bench/async_client.py [--runs 3] [--seconds 6] [--json out.json]

Sets everything up itself, as ``python -m bench.roundtrip`` does: flushes its own Redis
db (``--db``; never db 0), recreates the ``dataservice_bench`` database and
seeds it with 1 KB records, starts ``--replicas`` interactive workers
(``dataservice worker --lane interactive``), waits until each answers and
reads every record once, so that every measured read is a cache hit. Then,
per run, each phase runs once per client, in alternating order (sync first
in odd runs, async first in even ones), each in a fresh caller process:

1. **sequential**: one caller, ``--sequential`` reads back to back
   (``client.read`` against ``await client.read``): p50 and p99 latency;
2. **concurrent**: one process whose ``--threads`` threads share one
   ``Client``, against one whose ``--coroutines`` coroutines share one
   ``AsyncClient``, each reading back to back for ``--seconds``:
   completions per second after a one-second warm-up;
3. **fan-in**: three bursts of ``--fan-in-threads`` threads (one read each,
   all at once) through one ``Client``, and of ``--fan-in-coroutines``
   coroutines through one ``AsyncClient``.

In every phase the caller process's most Redis connections are sampled
every 20 ms (its sockets, from ``/proc``).
The caller process's CPU per call (``time.process_time`` over the measured
window, every thread included) and the workers' (from ``/proc``) are
reported beside each. Targets: async p50 at most the sync client's (1.0x),
concurrent throughput at least twice (2.0x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from dataservice_tools.loadtest.environment import flush_redis, run_callers_file, seed_records
from dataservice_tools.testkit.cpu import process_cpu_s
from dataservice_tools.testkit.machine import machine_info
from dataservice_tools.testkit.replicas import Replicas
from dataservice_tools.testkit.sockets import connections_to
from rich.console import Console
from rich.table import Table

from bench import _env
from dataservice import AsyncClient, Client
from dataservice.config.settings import Settings
from dataservice.ops.processes import worker_environ

SCOPE = "bench"
PAYLOAD_BYTES = 1024
KINDS = ("sync", "async")
# async / sync: the p50 of one caller at most, the throughput of many at least.
TARGETS = {"sequential": ("p50", 1.0), "concurrent": ("throughput", 2.0)}
WARMUP_S = 1.0
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Phase:
    """What one caller process does."""

    kind: str
    callers: int
    # The Redis server's port: the process's connections to it are counted.
    redis_port: int
    # Reads per caller (sequential), seconds of reading (concurrent), or
    # bursts of one read per caller, all at once (fan-in).
    count: int = 0
    seconds: float = 0.0
    bursts: int = 0


class PeakConnections:
    """The most connections to Redis this process held, sampled every 20 ms."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.most = 0

    def sample(self) -> None:
        self.most = max(self.most, connections_to(self.port))


def _summary(latencies_ns: list[int], window_s: float, cpu_s: float) -> dict[str, Any]:
    """The calls that completed in a window of ``window_s`` seconds, in which
    the caller process used ``cpu_s`` of CPU."""
    completed = len(latencies_ns)
    ordered = sorted(latencies_ns)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6 if ordered else 0.0

    return {
        "calls": completed,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "mean_ms": statistics.fmean(ordered) / 1e6 if ordered else 0.0,
        "throughput": completed / window_s if window_s else 0.0,
        "client_cpu_ms_per_call": 1000 * cpu_s / completed if completed else 0.0,
    }


def _sync_phase(settings: Settings, ids: list[str], phase: Phase) -> dict[str, Any]:
    peak = PeakConnections(phase.redis_port)
    sampling = threading.Event()

    def sampler() -> None:
        while not sampling.wait(0.02):
            peak.sample()

    threading.Thread(target=sampler, daemon=True).start()
    try:
        with Client(_env.CALLER, settings, settings.load()) as client:
            client.read(SCOPE, ids[0], timeout=TIMEOUT_S)  # connected before the clock starts
            run = _sync_fan_in if phase.bursts else _sync_calls
            result = run(client, ids, phase)
    finally:
        sampling.set()
    return {**result, "peak_connections": peak.most}


def _sync_fan_in(client: Client, ids: list[str], phase: Phase) -> dict[str, Any]:
    latencies: list[int] = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(phase.bursts):
        start = threading.Barrier(phase.callers)
        threads = [
            threading.Thread(
                target=_one_of_burst, args=(client, ids[n % len(ids)], start, latencies)
            )
            for n in range(phase.callers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    return _summary(latencies, time.perf_counter() - t0, time.process_time() - cpu0)


def _one_of_burst(
    client: Client, object_id: str, start: threading.Barrier, latencies: list[int]
) -> None:
    start.wait(TIMEOUT_S)
    began = time.perf_counter_ns()
    client.read(SCOPE, object_id, timeout=30)
    latencies.append(time.perf_counter_ns() - began)


def _sync_calls(client: Client, ids: list[str], phase: Phase) -> dict[str, Any]:
    """``phase.count`` reads from one caller, or ``phase.callers`` threads
    reading for ``phase.seconds`` after the warm-up."""
    if phase.count:
        latencies = []
        rng = random.Random(0)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(phase.count):
            began = time.perf_counter_ns()
            client.read(SCOPE, rng.choice(ids), timeout=TIMEOUT_S)
            latencies.append(time.perf_counter_ns() - began)
        return _summary(latencies, time.perf_counter() - t0, time.process_time() - cpu0)
    measured: list[list[int]] = [[] for _ in range(phase.callers)]
    stop = threading.Event()
    window: dict[str, float] = {}

    def caller(n: int) -> None:
        rng = random.Random(n)
        while not stop.is_set():
            began = time.perf_counter_ns()
            client.read(SCOPE, rng.choice(ids), timeout=TIMEOUT_S)
            if "from" in window and not stop.is_set():
                measured[n].append(time.perf_counter_ns() - began)

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(phase.callers)]
    for thread in threads:
        thread.start()
    time.sleep(WARMUP_S)
    cpu0, window["from"] = time.process_time(), time.perf_counter()
    time.sleep(phase.seconds)
    cpu1, t1 = time.process_time(), time.perf_counter()
    stop.set()
    for thread in threads:
        thread.join(TIMEOUT_S + 5)
    return _summary([x for one in measured for x in one], t1 - window["from"], cpu1 - cpu0)


async def _async_phase(settings: Settings, ids: list[str], phase: Phase) -> dict[str, Any]:
    peak = PeakConnections(phase.redis_port)

    async def sampler() -> None:
        while True:
            peak.sample()
            await asyncio.sleep(0.02)

    sampling = asyncio.create_task(sampler())
    try:
        async with AsyncClient(_env.CALLER, settings, settings.load()) as client:
            await client.read(SCOPE, ids[0], timeout=TIMEOUT_S)
            run = _async_fan_in if phase.bursts else _async_calls
            result = await run(client, ids, phase)
    finally:
        sampling.cancel()
    return {**result, "peak_connections": peak.most}


async def _async_fan_in(client: AsyncClient, ids: list[str], phase: Phase) -> dict[str, Any]:
    latencies: list[int] = []

    async def call(n: int) -> None:
        began = time.perf_counter_ns()
        await client.read(SCOPE, ids[n % len(ids)], timeout=30)
        latencies.append(time.perf_counter_ns() - began)

    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(phase.bursts):
        await asyncio.gather(*(call(n) for n in range(phase.callers)))
    return _summary(latencies, time.perf_counter() - t0, time.process_time() - cpu0)


async def _async_calls(client: AsyncClient, ids: list[str], phase: Phase) -> dict[str, Any]:
    """As :func:`_sync_calls`, with coroutines."""
    if phase.count:
        latencies = []
        rng = random.Random(0)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(phase.count):
            began = time.perf_counter_ns()
            await client.read(SCOPE, rng.choice(ids), timeout=TIMEOUT_S)
            latencies.append(time.perf_counter_ns() - began)
        return _summary(latencies, time.perf_counter() - t0, time.process_time() - cpu0)
    measured: list[list[int]] = [[] for _ in range(phase.callers)]
    stop = asyncio.Event()
    window: dict[str, float] = {}

    async def caller(n: int) -> None:
        rng = random.Random(n)
        while not stop.is_set():
            began = time.perf_counter_ns()
            await client.read(SCOPE, rng.choice(ids), timeout=TIMEOUT_S)
            if "from" in window and not stop.is_set():
                measured[n].append(time.perf_counter_ns() - began)

    tasks = [asyncio.create_task(caller(n)) for n in range(phase.callers)]
    await asyncio.sleep(WARMUP_S)
    cpu0, window["from"] = time.process_time(), time.perf_counter()
    await asyncio.sleep(phase.seconds)
    cpu1, t1 = time.process_time(), time.perf_counter()
    stop.set()
    await asyncio.gather(*tasks)
    return _summary([x for one in measured for x in one], t1 - window["from"], cpu1 - cpu0)


def _child(settings: Settings, ids: list[str], phase: Phase, out: Any) -> None:
    try:
        if phase.kind == "sync":
            out.put(_sync_phase(settings, ids, phase))
        else:
            out.put(asyncio.run(_async_phase(settings, ids, phase)))
    except BaseException as exc:  # reported to the parent, which fails the run
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def run_phase(
    settings: Settings, ids: list[str], phase: Phase, workers: list[int]
) -> dict[str, Any]:
    """``phase`` in a fresh caller process, with the workers' CPU per call beside it."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=_child, args=(settings, ids, phase, out))
    before = [process_cpu_s(pid) or 0.0 for pid in workers]
    child.start()
    result: dict[str, Any] = out.get(timeout=phase.seconds + 120)
    child.join(30)
    after = [process_cpu_s(pid) or 0.0 for pid in workers]
    if "error" in result:
        raise RuntimeError(f"{phase.kind} caller failed: {result['error']}")
    # The workers served the warm-up (and the first read) too: their CPU per
    # call is an upper bound.
    served = result["calls"] + 1 + (result["throughput"] * WARMUP_S if phase.seconds else 0)
    result["worker_cpu_ms_per_call"] = 1000 * (sum(after) - sum(before)) / max(served, 1)
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="concurrent phase length")
    parser.add_argument("--sequential", type=int, default=2000, help="reads, sequential phase")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--coroutines", type=int, default=64)
    parser.add_argument("--fan-in-threads", type=int, default=1000)
    parser.add_argument("--fan-in-coroutines", type=int, default=5000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--redis-host", default="127.0.0.1")
    parser.add_argument("--redis-port", type=int, default=6379)
    parser.add_argument("--db", type=int, default=12)
    parser.add_argument(
        "--database-url",
        default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_bench",
        help="the bench database (must end in _bench: it is dropped and recreated)",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    if args.db == 0:
        parser.error("--db 0 is never flushed by a bench")
    return args


def measure(
    args: argparse.Namespace, settings: Settings, ids: list[str], workers: list[int]
) -> list[dict[str, Any]]:
    port = int(settings.broker_url.rsplit(":", 1)[1].split("/", 1)[0])
    phases = {
        "sequential": {kind: Phase(kind, 1, port, count=args.sequential) for kind in KINDS},
        "concurrent": {
            "sync": Phase("sync", args.threads, port, seconds=args.seconds),
            "async": Phase("async", args.coroutines, port, seconds=args.seconds),
        },
        "fan-in": {
            "sync": Phase("sync", args.fan_in_threads, port, bursts=3),
            "async": Phase("async", args.fan_in_coroutines, port, bursts=3),
        },
    }
    runs = []
    for run in range(1, args.runs + 1):
        order = KINDS if run % 2 else tuple(reversed(KINDS))
        figures = {
            name: {kind: run_phase(settings, ids, by_kind[kind], workers) for kind in order}
            for name, by_kind in phases.items()
        }
        ratios = {
            "sequential_p50": figures["sequential"]["async"]["p50_ms"]
            / figures["sequential"]["sync"]["p50_ms"],
            "concurrent_throughput": figures["concurrent"]["async"]["throughput"]
            / figures["concurrent"]["sync"]["throughput"],
        }
        runs.append({"run": run, "order": list(order), "figures": figures, "ratios": ratios})
    return runs


def _bench_config(directory: Path) -> Path:
    """The shipped queues.yml as ``python -m bench.roundtrip`` runs it, its interactive
    lane admitting the fan-in's 5,000 at once (the shipped bounds refuse most
    of such a burst: 2,000 messages, a 500 ms standing queue)."""
    path = _env.unguarded_config(directory)
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    admission = document["lanes"]["interactive"]["admission"]
    admission["max_messages"] = 20_000
    admission.pop("target_wait_ms", None)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    url = _env.redis_url(args.redis_host, args.redis_port, args.db)
    logdir = Path(tempfile.mkdtemp(prefix="dataservice-bench-async-"))
    settings = Settings(
        config_path=_bench_config(logdir),
        broker_url=url,
        result_backend_url=url,
        redis_url=url,
        database_url=args.database_url,
        callers_file=run_callers_file(logdir, _env.CALLER),
    )
    config = settings.load()
    environ = worker_environ(settings)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_env.REPO), os.environ.get("PYTHONPATH")])
    )
    flush_redis(url)
    replicas = Replicas(settings, config, args.replicas, logdir)
    try:
        with console.status("creating and seeding the bench database"):
            _env.reset_database(args.database_url, environ)
            ids = seed_records(args.database_url, SCOPE, args.records, PAYLOAD_BYTES)
        machine = machine_info(url, args.database_url)
        with console.status("starting workers, warming the cache"):
            replicas.start()
            with Client(_env.CALLER, settings, config) as client:
                for object_id in ids:
                    client.read(SCOPE, object_id, timeout=TIMEOUT_S)
        with console.status("measuring"):
            runs = measure(args, settings, ids, [w.pid for w in replicas.workers])
    finally:
        replicas.stop()
        flush_redis(url)
        _env.drop_database(args.database_url)
    report = {
        "bench": "async_client",
        "machine": machine,
        "args": {k: str(v) for k, v in vars(args).items()},
        "targets": TARGETS,
        "runs": runs,
    }
    _print(console, report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def _print(console: Console, report: dict[str, Any]) -> None:
    table = Table(title="AsyncClient against Client, cached reads")
    for column in (
        "run",
        "phase",
        "client",
        "p50 ms",
        "p99 ms",
        "calls/s",
        "CPU ms/call: caller / workers",
        "Redis connections",
    ):
        table.add_column(column)
    for run in report["runs"]:
        for phase, by_kind in run["figures"].items():
            for kind in run["order"]:
                f = by_kind[kind]
                table.add_row(
                    str(run["run"]),
                    phase,
                    kind,
                    f"{f['p50_ms']:.2f}",
                    f"{f['p99_ms']:.2f}",
                    f"{f['throughput']:.0f}",
                    f"{f['client_cpu_ms_per_call']:.3f} / {f['worker_cpu_ms_per_call']:.3f}",
                    str(f["peak_connections"]),
                )
    console.print(table)
    for run in report["runs"]:
        r = run["ratios"]
        console.print(
            f"run {run['run']}: async/sync p50 {r['sequential_p50']:.2f}x (target <= 1.0), "
            f"throughput {r['concurrent_throughput']:.2f}x (target >= 2.0)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
