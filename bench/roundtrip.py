"""Interactive read round trip vs a bare Celery no-op, same broker, options and machine.

    .venv/bin/python bench/roundtrip.py [--read cached|primary] [--callers 16] [--json out.json]

``--read cached`` (the default) reads ``ALLOW_CACHED`` after every seeded
record has been read once, so every measured read is a cache hit; ``--read
primary`` reads ``PRIMARY``, the database under a permit.

Sets everything up itself: flushes its own Redis db numbers (``--service-db``,
``--bare-db``; never db 0), recreates the ``dataservice_bench`` database with
``dataservice db upgrade`` and seeds it with 1 KB records, starts
``dataservice worker --lane interactive`` and a stock Celery worker
(:mod:`bench.bare_app`) with the same worker options as subprocesses, waits
until both answer, warms up, then measures

1. one caller, sequential requests;
2. ``--callers`` threads, each with its own ``Client`` (or stock Celery app),
   issuing requests back to back (``--shared-client``: one of each for all).

The two systems alternate in rounds (A B, then B A, ...) so drift on a noisy
machine hits both alike. Latency is the caller's wall time per call
(``client.read(...)`` against ``noop.delay().get()``); throughput in the
concurrent phase counts completions while every caller is still busy. The CPU
each process used per request (client = this process, worker, redis-server,
mariadbd, and with ``--broker amqp`` RabbitMQ's Erlang VM) is read from
``/proc``. Subprocesses are stopped on any exit.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml
from dataservice_tools.loadtest.environment import flush_redis, run_callers_file, seed_records
from dataservice_tools.localservices.rabbitmq import virtual_host
from dataservice_tools.testkit.cpu import process_cpu_s
from dataservice_tools.testkit.machine import machine_info
from rich.console import Console
from rich.table import Table

from bench import _env
from bench.bare_app import NOOP_TASK, make_app
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.ops.processes import WorkerProcess, worker_argv, worker_environ

SERVICE = "service"
BARE = "bare"
SYSTEMS = (SERVICE, BARE)
SCOPE = "bench"
PAYLOAD_BYTES = 1024
# Service / bare: p50 with one caller, throughput with many. A cached read
# must beat the no-op by a margin; a database read, which does all a no-op
# skips and reads the database too, must at least match it.
TARGETS = {
    "cached": {"sequential": ("p50", 0.7), "concurrent": ("throughput", 1.5)},
    "primary": {"sequential": ("p50", 1.0), "concurrent": ("throughput", 1.0)},
}
CPU_COMPONENTS = ("client", "worker", "redis", "mariadb", "rabbitmq")
# A caller gives up on a round after this many failed calls (a dead worker
# would otherwise cost a full deadline per remaining request).
MAX_ERRORS_PER_ROUND = 10

Call = Callable[[], None]


# Statistics ---------------------------------------------------------------------


def percentile(sorted_ns: list[int], q: float) -> float:
    """Linear-interpolated percentile of sorted nanosecond samples, in ms."""
    if not sorted_ns:
        return float("nan")
    pos = (len(sorted_ns) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(sorted_ns) - 1)
    value = sorted_ns[low] + (sorted_ns[high] - sorted_ns[low]) * (pos - low)
    return value / 1e6


@dataclass
class RunResult:
    """One measured run of one system: latencies and what it cost."""

    latencies_ns: list[int]
    window_s: float  # the steady window: until the first caller finished
    window_count: int  # completions inside it
    wall_s: float
    errors: int
    first_error: str | None
    cpu_s: dict[str, float | None]


@dataclass
class Series:
    """All runs of one system in one phase."""

    runs: list[RunResult] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = sorted(x for run in self.runs for x in run.latencies_ns)
        window_s = sum(run.window_s for run in self.runs)
        window_count = sum(run.window_count for run in self.runs)
        cpu_ms: dict[str, float | None] = {}
        for part in CPU_COMPONENTS:
            values = [run.cpu_s.get(part) for run in self.runs]
            cpu_ms[part] = (
                None
                if any(v is None for v in values) or not lat
                else 1000 * sum(v for v in values if v is not None) / len(lat)
            )
        return {
            "requests": len(lat),
            "errors": sum(run.errors for run in self.runs),
            "first_error": next((run.first_error for run in self.runs if run.first_error), None),
            "p50_ms": percentile(lat, 50),
            "p95_ms": percentile(lat, 95),
            "p99_ms": percentile(lat, 99),
            "mean_ms": sum(lat) / len(lat) / 1e6 if lat else float("nan"),
            "max_ms": lat[-1] / 1e6 if lat else float("nan"),
            "throughput_per_s": window_count / window_s if window_s else float("nan"),
            "cpu_ms_per_request": cpu_ms,
            "rounds_p50_ms": [percentile(sorted(run.latencies_ns), 50) for run in self.runs],
            "rounds_throughput_per_s": [
                run.window_count / run.window_s if run.window_s else float("nan")
                for run in self.runs
            ],
        }


# Callers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    system: str
    count: int
    barrier: threading.Barrier
    out: queue.Queue[Outcome]


@dataclass(frozen=True)
class Outcome:
    latencies_ns: list[int]
    ends_ns: list[int]
    errors: int
    first_error: str | None


class Caller(threading.Thread):
    """A caller thread that owns its clients for its whole life.

    Stock Celery keeps its result backend (and its pub/sub connection) per
    thread, and the service client its connection pools per ``Client``: a
    thread made per round would measure their set-up.
    """

    def __init__(self, index: int, factories: dict[str, Callable[[random.Random], Call]]) -> None:
        super().__init__(name=f"caller-{index}", daemon=True)
        self._factories = factories
        self._rng = random.Random(index)
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.ready = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            calls = {name: make(self._rng) for name, make in self._factories.items()}
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            self.ready.set()
        while (job := self.jobs.get()) is not None:
            call = calls[job.system]
            latencies: list[int] = []
            ends: list[int] = []
            errors = 0
            first_error: str | None = None
            clock = time.perf_counter_ns
            job.barrier.wait()
            for _ in range(job.count):
                started = clock()
                try:
                    call()
                except Exception as exc:
                    errors += 1
                    first_error = first_error or f"{type(exc).__name__}: {exc}"
                    if errors >= MAX_ERRORS_PER_ROUND:
                        break
                    continue
                ended = clock()
                latencies.append(ended - started)
                ends.append(ended)
            job.out.put(Outcome(latencies, ends, errors, first_error))


class Components:
    """CPU-time snapshots of this process, the worker under test, Redis, MariaDB
    and (with ``--broker amqp``) RabbitMQ's Erlang VM."""

    def __init__(
        self,
        workers: dict[str, int],
        redis_pid: int | None,
        db_pid: int | None,
        rabbitmq_pid: int | None,
    ):
        self._workers = workers
        self._pids = {"redis": redis_pid, "mariadb": db_pid, "rabbitmq": rabbitmq_pid}

    def snapshot(self, system: str) -> dict[str, float | None]:
        return {
            "client": time.process_time(),
            "worker": process_cpu_s(self._workers[system]),
            **{part: process_cpu_s(pid) if pid else None for part, pid in self._pids.items()},
        }


def run_round(
    callers: list[Caller], system: str, per_caller: int, components: Components
) -> RunResult:
    out: queue.Queue[Outcome] = queue.Queue()
    barrier = threading.Barrier(len(callers) + 1)
    for caller in callers:
        caller.jobs.put(Job(system, per_caller, barrier, out))
    before = components.snapshot(system)
    barrier.wait()
    started = time.perf_counter_ns()
    results = [out.get() for _ in callers]
    after = components.snapshot(system)
    latencies = [x for r in results for x in r.latencies_ns]
    all_ends = [r.ends_ns for r in results]
    first_done = min((ends[-1] for ends in all_ends if ends), default=started)
    last_done = max((ends[-1] for ends in all_ends if ends), default=started)
    cpu: dict[str, float | None] = {}
    for part in CPU_COMPONENTS:
        b, a = before[part], after[part]
        cpu[part] = None if a is None or b is None else a - b
    return RunResult(
        latencies_ns=latencies,
        window_s=(first_done - started) / 1e9,
        window_count=sum(1 for ends in all_ends for end in ends if end <= first_done),
        wall_s=(last_done - started) / 1e9,
        errors=sum(r.errors for r in results),
        first_error=next((r.first_error for r in results if r.first_error), None),
        cpu_s=cpu,
    )


def service_factory(
    settings: Settings, config: Config, ids: list[str], shared: Client | None, mode: ReadMode
) -> Callable[[random.Random], Call]:
    def make(rng: random.Random) -> Call:
        client = shared or Client(_env.CALLER, settings, config)

        def call() -> None:
            record = client.read(SCOPE, rng.choice(ids), mode=mode)
            if len(record.payload) != PAYLOAD_BYTES:
                raise AssertionError("wrong payload size")

        return call

    return make


def bare_factory(
    url: str, broker_url: str | None, shared: Any | None
) -> Callable[[random.Random], Call]:
    def make(rng: random.Random) -> Call:
        app = shared or make_app(url, broker_url)
        noop = app.tasks[NOOP_TASK]

        def call() -> None:
            noop.delay().get(timeout=5)

        return call

    return make


# Orchestration -------------------------------------------------------------------


def _unguarded_config(directory: Path, request_lines: str | None = None) -> Path:
    """The shipped queues.yml, reading the cache without a change consumer:
    none runs here, and nothing but the bench changes the records. With
    ``request_lines``, ``logging.requests`` set to it."""
    document = yaml.safe_load((_env.REPO / "queues.yml").read_text(encoding="utf-8"))
    document["changes"]["guard"] = False
    if request_lines is not None:
        document.setdefault("logging", {})["requests"] = request_lines
    path = directory / "queues.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--read", choices=tuple(TARGETS), default="cached", help="the service's read mode"
    )
    p.add_argument("--callers", type=int, default=16, help="concurrent caller threads")
    p.add_argument(
        "--requests", type=int, default=3200, help="measured requests per system and phase"
    )
    p.add_argument("--rounds", type=int, default=8, help="alternating rounds per phase")
    p.add_argument("--warmup", type=int, default=300, help="warm-up requests per system")
    p.add_argument("--records", type=int, default=1000, help="seeded 1 KB records")
    p.add_argument("--shared-client", action="store_true", help="one client for all callers")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--redis-host", default="127.0.0.1")
    p.add_argument("--redis-port", type=int, default=6379)
    p.add_argument("--service-db", type=int, default=9, help="Redis db for the service")
    p.add_argument("--bare-db", type=int, default=10, help="Redis db for bare Celery")
    p.add_argument(
        "--database-url",
        default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_bench",
        help="the bench database (must end in _bench: it is dropped and recreated)",
    )
    p.add_argument("--keep", action="store_true", help="leave the database and Redis dbs")
    p.add_argument(
        "--broker",
        choices=("redis", "amqp"),
        default="redis",
        help="amqp: both systems on the local RabbitMQ (virtual hosts of their own);"
        " answers stay in Redis",
    )
    p.add_argument(
        "--request-lines",
        choices=("all", "failures", "none"),
        help="the workers' logging.requests (default: queues.yml's)",
    )
    args = p.parse_args(argv)
    if 0 in (args.service_db, args.bare_db) or args.service_db == args.bare_db:
        p.error("--service-db and --bare-db must differ and must not be 0")
    if args.callers < 1 or args.requests < args.rounds * args.callers or args.rounds < 1:
        p.error("need callers >= 1, rounds >= 1 and requests >= rounds * callers")
    return args


@dataclass
class Bench:
    """Everything one run sets up."""

    args: argparse.Namespace
    console: Console
    settings: Settings
    config: Config
    service_url: str
    bare_url: str
    # RabbitMQ's, with --broker amqp (the Redis URLs then hold answers alone).
    service_broker: str | None
    bare_broker: str | None
    environ: dict[str, str]
    workers: dict[str, WorkerProcess]
    # Filled in by setup().
    started: float = field(init=False, default=0.0)
    ids: list[str] = field(init=False, default_factory=list)
    machine: dict[str, Any] = field(init=False, default_factory=dict)
    ready_s: dict[str, float] = field(init=False, default_factory=dict)
    components: Components = field(init=False)
    callers: list[Caller] = field(init=False, default_factory=list)
    phases: dict[str, list[Caller]] = field(init=False, default_factory=dict)

    @classmethod
    def create(cls, args: argparse.Namespace) -> Bench:
        service_url = _env.redis_url(args.redis_host, args.redis_port, args.service_db)
        bare_url = _env.redis_url(args.redis_host, args.redis_port, args.bare_db)
        service_broker = bare_broker = None
        if args.broker == "amqp":
            service_broker = virtual_host("dataservice-bench", fresh=True)
            bare_broker = virtual_host("dataservice-bench-bare", fresh=True)
        logdir = Path(tempfile.mkdtemp(prefix="dataservice-bench-"))
        settings = Settings(
            config_path=_unguarded_config(logdir, args.request_lines),
            broker_url=service_broker or service_url,
            result_backend_url=service_url,
            redis_url=service_url,
            database_url=args.database_url,
            callers_file=run_callers_file(logdir, _env.CALLER),
        )
        environ = worker_environ(settings)
        # The worker runs the same source tree as this file (a scratch copy of the
        # repository benchmarks its own changes), not the editable install.
        environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_env.REPO), os.environ.get("PYTHONPATH")])
        )
        config = settings.load()
        concurrency = str(config.lanes.interactive.concurrency)
        service_argv = worker_argv(LaneName.INTERACTIVE)
        bare_argv = [sys.executable, "-m", "bench.bare_app", "--url", bare_url]
        if bare_broker is not None:
            bare_argv += ["--broker-url", bare_broker]
        workers = {
            SERVICE: WorkerProcess(service_argv, environ, logdir / "service-worker.log", SERVICE),
            BARE: WorkerProcess(
                [*bare_argv, "--concurrency", concurrency], environ, logdir / "bare.log", BARE
            ),
        }
        return cls(
            args,
            _console(),
            settings,
            config,
            service_url,
            bare_url,
            service_broker,
            bare_broker,
            environ,
            workers,
        )

    def cleanup(self) -> None:
        self.stop_callers()
        for worker in self.workers.values():
            worker.stop()
        if not self.args.keep:
            for url in (self.service_url, self.bare_url):
                flush_redis(url)
            _env.drop_database(self.args.database_url)
        logdir = self.workers[SERVICE].log_path.parent
        self.console.print(f"[dim]worker logs: {logdir}[/dim]")

    def setup(self) -> None:
        """Fresh Redis dbs and database, seeded; both workers answering; callers started."""
        args, console, settings, config = self.args, self.console, self.settings, self.config
        self.started = time.monotonic()
        for url in (self.service_url, self.bare_url):
            flush_redis(url)
        with console.status("creating and seeding the bench database"):
            _env.reset_database(args.database_url, self.environ)
            self.ids = seed_records(args.database_url, SCOPE, args.records, PAYLOAD_BYTES)
        self.machine = machine_info(self.service_url, args.database_url)
        with console.status("starting workers"):
            for worker in self.workers.values():
                worker.start()
            probe_client = Client(_env.CALLER, settings, config)
            noop = make_app(self.bare_url, self.bare_broker).tasks[NOOP_TASK]
            first = self.ids[0]
            try:
                self.ready_s = {
                    SERVICE: _env.wait_ready(
                        self.workers[SERVICE], lambda: probe_client.read(SCOPE, first, timeout=0.5)
                    ),
                    BARE: _env.wait_ready(
                        self.workers[BARE], lambda: noop.delay().get(timeout=0.5)
                    ),
                }
                if args.read == "cached":
                    # Every measured read is then a hit.
                    for object_id in self.ids:
                        probe_client.read(SCOPE, object_id)
            finally:
                probe_client.close()
        self.components = Components(
            {name: worker.pid for name, worker in self.workers.items()},
            _env.find_pid("redis-server"),
            _env.find_pid("mariadbd", "mysqld"),
            _env.rabbitmq_pid() if args.broker == "amqp" else None,
        )
        shared_client = Client(_env.CALLER, settings, config) if args.shared_client else None
        shared_app = make_app(self.bare_url, self.bare_broker) if args.shared_client else None
        factories = {
            SERVICE: service_factory(settings, config, self.ids, shared_client, self.mode),
            BARE: bare_factory(self.bare_url, self.bare_broker, shared_app),
        }
        self.callers = [Caller(i, factories) for i in range(args.callers)]
        for caller in self.callers:
            caller.start()
        for caller in self.callers:
            caller.ready.wait()
            if caller.failure is not None:
                raise caller.failure
        self.phases = {"sequential": self.callers[:1], f"{args.callers} callers": self.callers}
        with console.status("warming up"):
            for system in SYSTEMS:
                for group in self.phases.values():
                    self.round(group, system, max(1, args.warmup // len(group)))

    @property
    def mode(self) -> ReadMode:
        return ReadMode.ALLOW_CACHED if self.args.read == "cached" else ReadMode.PRIMARY

    def round(self, group: list[Caller], system: str, per_caller: int) -> RunResult:
        result = run_round(group, system, per_caller, self.components)
        # A dead worker ends the run (with its log) instead of timing out every call.
        self.workers[system].check_alive()
        return result

    def measure(self) -> dict[str, dict[str, Series]]:
        """Alternating rounds (A B, B A, ...) of each phase."""
        series = {p: {s: Series() for s in SYSTEMS} for p in self.phases}
        for phase, group in self.phases.items():
            per_caller = self.args.requests // self.args.rounds // len(group)
            for r in range(self.args.rounds):
                order = SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]
                # No spinner while measuring: its refresh thread would compete
                # for the GIL with the callers.
                self.console.print(f"[dim]{phase}: round {r + 1}/{self.args.rounds}[/dim]")
                for system in order:
                    series[phase][system].runs.append(self.round(group, system, per_caller))
        return series

    def report(self, series: dict[str, dict[str, Series]]) -> dict[str, Any]:
        args = self.args
        results = {p: {s: series[p][s].summary() for s in SYSTEMS} for p in series}
        return {
            "command": " ".join(["python", "bench/roundtrip.py", *sys.argv[1:]]),
            "machine": self.machine,
            "setup": {
                "read": args.read,
                "callers": args.callers,
                "requests_per_system_and_phase": args.requests,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "records": args.records,
                "payload_bytes": PAYLOAD_BYTES,
                "broker": args.broker,
                "client_per_caller": not args.shared_client,
                "worker": {
                    "pool": "threads",
                    "concurrency": self.config.lanes.interactive.concurrency,
                    "prefetch_multiplier": 1,
                    "acks_late": True,
                    "without_gossip": True,
                    "without_mingle": True,
                },
                "worker_ready_s": self.ready_s,
                "elapsed_s": round(time.monotonic() - self.started, 1),
            },
            "results": results,
            "ratios": _ratios(results, args.read),
        }

    def stop_callers(self) -> None:
        for caller in self.callers:
            caller.jobs.put(None)


def main(argv: list[str] | None = None) -> int:
    bench = Bench.create(parse_args(argv))
    with sigterm_as_exit():
        try:
            bench.setup()
            report = bench.report(bench.measure())
        except KeyboardInterrupt:
            bench.console.print("[red]interrupted[/red]")
            return 130
        finally:
            bench.cleanup()
    _print_report(bench.console, report)
    if bench.args.json:
        bench.args.json.write_text(json.dumps(report, indent=2) + "\n")
        bench.console.print(f"wrote {bench.args.json}")
    return 0


def _ratios(results: dict[str, dict[str, dict[str, Any]]], read: str) -> dict[str, dict[str, Any]]:
    ratios: dict[str, dict[str, Any]] = {}
    for phase, by_system in results.items():
        metric, target = TARGETS[read]["sequential" if phase == "sequential" else "concurrent"]
        svc, bare = by_system[SERVICE], by_system[BARE]
        rounds = [
            s / b for s, b in zip(svc["rounds_p50_ms"], bare["rounds_p50_ms"], strict=True) if b
        ]
        ratios[phase] = {
            "p50": svc["p50_ms"] / bare["p50_ms"],
            "p50_rounds_median": statistics.median(rounds),
            "p99": svc["p99_ms"] / bare["p99_ms"],
            "throughput": svc["throughput_per_s"] / bare["throughput_per_s"],
            "p50_rounds_min": min(rounds),
            "p50_rounds_max": max(rounds),
            "target": f"{metric} {'<=' if metric == 'p50' else '>='} {target}x",
        }
        value = ratios[phase][metric]
        ratios[phase]["meets_target"] = value <= target if metric == "p50" else value >= target
    return ratios


def _console() -> Console:
    # Piped output would otherwise be cut to 80 columns, which squashes the table.
    return Console() if sys.stdout.isatty() else Console(width=150)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _print_report(console: Console, report: dict[str, Any]) -> None:
    m = report["machine"]
    console.print(
        f"[bold]machine[/bold]: {m['cpu_model']}, {m['cpus']} CPUs ({m['cpus_usable']} usable), "
        f"Linux {m['kernel']}, load {m['loadavg_at_start']}\n"
        f"Python {m['python']}, celery {m['celery']}, kombu {m['kombu']}, "
        f"redis-py {m['redis_py']} (hiredis {m['hiredis']}), SQLAlchemy {m['sqlalchemy']}, "
        f"mysqlclient {m['mysqlclient']}, protobuf {m['protobuf']}\n"
        f"Redis {m['redis_server']}, MariaDB {m['mariadb']}"
    )
    s = report["setup"]
    console.print(
        f"[bold]setup[/bold]: {s['read']} reads; "
        f"threads pool -c{s['worker']['concurrency']}, prefetch 1, acks_late, no gossip/mingle; "
        f"{s['rounds']} alternating rounds; "
        f"{s['requests_per_system_and_phase']} requests per system and phase; "
        f"{'one client per caller' if s['client_per_caller'] else 'one shared client'}"
    )
    table = Table(title="round trip: service read vs bare Celery no-op")
    for column in ("phase", "system", "n", "err", "p50 ms", "p95 ms", "p99 ms", "mean ms"):
        table.add_column(column, justify="right" if column not in ("phase", "system") else "left")
    table.add_column("req/s", justify="right")
    for part in CPU_COMPONENTS:
        table.add_column(f"CPU {part}\nms/req", justify="right")
    for phase, by_system in report["results"].items():
        for system, r in by_system.items():
            cpu = r["cpu_ms_per_request"]
            table.add_row(
                phase,
                system,
                str(r["requests"]),
                str(r["errors"]),
                _fmt(r["p50_ms"]),
                _fmt(r["p95_ms"]),
                _fmt(r["p99_ms"]),
                _fmt(r["mean_ms"]),
                _fmt(r["throughput_per_s"], 0),
                *(_fmt(cpu[part]) for part in CPU_COMPONENTS),
            )
        table.add_section()
    console.print(table)
    for phase, by_system in report["results"].items():
        for system, r in by_system.items():
            if r["errors"]:
                console.print(
                    f"[red]{phase}, {system}: {r['errors']} failed calls "
                    f"(first: {r['first_error']})[/red]"
                )
    ratios = Table(title="service / bare")
    for column in ("phase", "p50", "p50 per round: median (range)", "p99", "throughput", "target"):
        ratios.add_column(column)
    for phase, r in report["ratios"].items():
        met = "[green]met[/green]" if r["meets_target"] else "[red]missed[/red]"
        verdict = f"{r['target']}: {met}"
        ratios.add_row(
            phase,
            f"{r['p50']:.2f}x",
            f"{r['p50_rounds_median']:.2f}x ({r['p50_rounds_min']:.2f}-{r['p50_rounds_max']:.2f})",
            f"{r['p99']:.2f}x",
            f"{r['throughput']:.2f}x",
            verdict,
        )
    console.print(ratios)
    console.print(f"[dim]elapsed {s['elapsed_s']} s[/dim]")


if __name__ == "__main__":
    sys.exit(main())
