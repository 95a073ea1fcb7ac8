"""What the round trip bench runs and measures: the two systems (the service's
interactive read and :mod:`bench.baselines.noop`), the bench's options, and
:class:`Bench`, which sets both up, measures them in alternating rounds and
reports. ``python -m bench.roundtrip`` is the command
(:mod:`bench.roundtrip.__main__`); :mod:`bench.roundtrip.profiled` runs the same
set-up under py-spy, and :mod:`bench.worker_ab` uses its callers."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataservice_tools.loadtest.environment import flush_redis, run_callers_file, seed_records
from dataservice_tools.localservices.rabbitmq import virtual_host
from dataservice_tools.testkit.callers import Call, Caller, run_round
from dataservice_tools.testkit.cpu import Components
from dataservice_tools.testkit.machine import machine_info
from dataservice_tools.testkit.series import RunResult, Series
from rich.console import Console

from bench import _env
from bench.baselines.noop import NOOP_TASK, make_app
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
# The processes whose CPU each request is charged: this one (the callers), the
# system's worker, and the servers (RabbitMQ's only with --broker amqp).
CPU_COMPONENTS = ("client", "worker", "redis", "mariadb", "rabbitmq")


# Systems -----------------------------------------------------------------------


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


def parse_args(
    argv: list[str] | None, description: str | None, prog: str = "python -m bench.roundtrip"
) -> argparse.Namespace:
    """The bench's options, for the command ``prog`` described by ``description``."""
    p = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawTextHelpFormatter
    )
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
            config_path=_env.unguarded_config(logdir, args.request_lines),
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
        bare_argv = [sys.executable, "-m", "bench.baselines.noop", "--url", bare_url]
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
            {
                "redis": _env.find_pid("redis-server"),
                "mariadb": _env.find_pid("mariadbd", "mysqld"),
                "rabbitmq": _env.rabbitmq_pid() if args.broker == "amqp" else None,
            },
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
            "command": " ".join(["python", "-m", "bench.roundtrip", *sys.argv[1:]]),
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
