"""What the round trip bench runs and measures: the systems (the service's
interactive read and its peers: :mod:`bench.baselines.noop`,
:mod:`bench.baselines.dramatiq_noop` and :mod:`bench.baselines.floor`), their
targets, the bench's options, and :class:`Bench`, which sets them up, measures
them in rounds whose order rotates, and reports. ``python -m bench.roundtrip`` is the command
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

import redis
from dataservice_tools.loadtest.environment import flush_redis, run_callers_file, seed_records
from dataservice_tools.localservices.rabbitmq import virtual_host
from dataservice_tools.testkit.callers import Call, Caller, run_round
from dataservice_tools.testkit.cpu import Components
from dataservice_tools.testkit.machine import machine_info, version
from dataservice_tools.testkit.series import RunResult, Series
from rich.console import Console

from bench import _env
from bench.baselines import dramatiq_noop, floor
from bench.baselines.noop import NOOP_TASK, make_app
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName, ReadMode
from dataservice.ops.processes import WorkerProcess, worker_argv, worker_environ

SERVICE = "service"
CELERY = "celery"
DRAMATIQ = "dramatiq"
FLOOR = "floor"
SYSTEMS = (SERVICE, CELERY, DRAMATIQ, FLOOR)
PEERS = SYSTEMS[1:]
# The peers that run on Redis alone: --broker amqp leaves them out.
REDIS_ONLY = (DRAMATIQ, FLOOR)
SCOPE = "bench"
PAYLOAD_BYTES = 1024
CALL_TIMEOUT_S = 5


@dataclass(frozen=True)
class Target:
    """The service / ``peer`` ratio of ``metric`` in ``phase`` (``sequential``:
    one caller; ``concurrent``: all of them): p50 at most ``bound``, throughput
    at least ``bound``."""

    peer: str
    phase: str
    metric: str
    bound: float

    @property
    def text(self) -> str:
        return f"{self.metric} {'<=' if self.metric == 'p50' else '>='} {self.bound}x"

    def met(self, value: float) -> bool:
        return value <= self.bound if self.metric == "p50" else value >= self.bound


# A cached read must beat the stock no-ops by a margin, since it skips work
# they do per message (a pool hand-off, a result backend's bookkeeping), and
# stay within a small multiple of the floor, which does nothing but the round
# trip; a database read, which does all a no-op skips and reads the database
# too, must at least match Celery's. The first Celery target of each phase is
# the one the report's ``ratios`` has carried from the start.
TARGETS = {
    "cached": (
        Target(CELERY, "sequential", "p50", 0.7),
        Target(CELERY, "concurrent", "throughput", 1.5),
        Target(CELERY, "concurrent", "throughput", 2.0),
        Target(DRAMATIQ, "concurrent", "throughput", 1.5),
        Target(FLOOR, "sequential", "p50", 3.0),
    ),
    "primary": (
        Target(CELERY, "sequential", "p50", 1.0),
        Target(CELERY, "concurrent", "throughput", 1.0),
    ),
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


def celery_factory(
    url: str, broker_url: str | None, shared: Any | None
) -> Callable[[random.Random], Call]:
    def make(rng: random.Random) -> Call:
        app = shared or make_app(url, broker_url)
        noop = app.tasks[NOOP_TASK]

        def call() -> None:
            noop.delay().get(timeout=CALL_TIMEOUT_S)

        return call

    return make


def dramatiq_factory(
    url: str, shared: dramatiq_noop.Peer | None
) -> Callable[[random.Random], Call]:
    def make(rng: random.Random) -> Call:
        peer = shared or dramatiq_noop.Peer(url)
        return lambda: peer.call(CALL_TIMEOUT_S * 1000)

    return make


def floor_factory(url: str, shared: redis.Redis | None) -> Callable[[random.Random], Call]:
    def make(rng: random.Random) -> Call:
        # A reply list per caller thread, shared client or not: answers must
        # not cross between threads.
        caller = floor.Caller(shared or redis.Redis.from_url(url))
        return lambda: caller.call(CALL_TIMEOUT_S)

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
    p.add_argument(
        "--systems",
        type=_systems,
        help=f"comma-separated, the service first (default: {','.join(SYSTEMS)};"
        f" with --broker amqp: {SERVICE},{CELERY})",
    )
    p.add_argument("--callers", type=int, default=16, help="concurrent caller threads")
    p.add_argument(
        "--requests", type=int, default=3200, help="measured requests per system and phase"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=8,
        help="rounds per phase, the systems' order rotating by one each round",
    )
    p.add_argument("--warmup", type=int, default=300, help="warm-up requests per system")
    p.add_argument("--records", type=int, default=1000, help="seeded 1 KB records")
    p.add_argument("--shared-client", action="store_true", help="one client for all callers")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--redis-host", default="127.0.0.1")
    p.add_argument("--redis-port", type=int, default=6379)
    p.add_argument("--service-db", type=int, default=9, help="Redis db for the service")
    p.add_argument(
        "--celery-db", "--bare-db", type=int, default=10, help="Redis db for stock Celery"
    )
    # Dbs that only the slow scenario tests use: the test suite flushes others
    # (11, 12) often, and a flush while a request waits in a queue loses it.
    p.add_argument("--dramatiq-db", type=int, default=3, help="Redis db for Dramatiq")
    p.add_argument("--floor-db", type=int, default=5, help="Redis db for the floor")
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
        help="amqp: the service and stock Celery on the local RabbitMQ (virtual hosts of\n"
        "their own), answers still in Redis; Dramatiq and the floor, Redis's alone,\n"
        "are left out",
    )
    p.add_argument(
        "--request-lines",
        choices=("all", "failures", "none"),
        help="the workers' logging.requests (default: queues.yml's)",
    )
    args = p.parse_args(argv)
    if args.systems is None:
        args.systems = SYSTEMS if args.broker == "redis" else (SERVICE, CELERY)
    if args.systems[0] != SERVICE:
        p.error(f"--systems: the ratios are the service's: start with {SERVICE}")
    if args.broker == "amqp" and (left := [s for s in args.systems if s in REDIS_ONLY]):
        p.error(f"--systems: {', '.join(left)}: on Redis only, not with --broker amqp")
    dbs = [getattr(args, f"{system}_db") for system in args.systems]
    if 0 in dbs or len(set(dbs)) != len(dbs):
        p.error("the systems' Redis dbs (--service-db, ...) must differ and must not be 0")
    if args.callers < 1 or args.requests < args.rounds * args.callers or args.rounds < 1:
        p.error("need callers >= 1, rounds >= 1 and requests >= rounds * callers")
    return args


def _systems(text: str) -> tuple[str, ...]:
    named = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in named if name not in SYSTEMS]
    if unknown or len(set(named)) != len(named) or not named:
        raise argparse.ArgumentTypeError(f"{text!r}: each of {', '.join(SYSTEMS)} at most once")
    return named


@dataclass
class Bench:
    """Everything one run sets up."""

    args: argparse.Namespace
    console: Console
    settings: Settings
    config: Config
    # Each system's Redis db, by system (the broker and its answers).
    urls: dict[str, str]
    # RabbitMQ's, with --broker amqp (the Redis URLs then hold answers alone).
    service_broker: str | None
    celery_broker: str | None
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
        urls = {
            system: _env.redis_url(args.redis_host, args.redis_port, getattr(args, f"{system}_db"))
            for system in args.systems
        }
        service_url = urls[SERVICE]
        service_broker = celery_broker = None
        if args.broker == "amqp":
            service_broker = virtual_host("dataservice-bench", fresh=True)
            celery_broker = virtual_host("dataservice-bench-bare", fresh=True)
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
        # The workers run the same source tree as this file (a scratch copy of the
        # repository benchmarks its own changes), not the editable install.
        environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_env.REPO), os.environ.get("PYTHONPATH")])
        )
        config = settings.load()
        concurrency = config.lanes.interactive.concurrency
        workers = {
            system: WorkerProcess(
                _worker_argv(system, urls[system], concurrency, celery_broker),
                environ,
                logdir / f"{system}-worker.log",
                system,
            )
            for system in args.systems
        }
        return cls(
            args,
            _console(),
            settings,
            config,
            urls,
            service_broker,
            celery_broker,
            environ,
            workers,
        )

    @property
    def systems(self) -> tuple[str, ...]:
        return tuple(self.args.systems)

    def serving_pid(self, system: str) -> int:
        """The process that serves ``system``'s requests: its worker's, or the
        one Dramatiq's command line forked."""
        pid = self.workers[system].pid
        return dramatiq_noop.worker_pids(pid)[-1] if system == DRAMATIQ else pid

    def cleanup(self) -> None:
        self.stop_callers()
        for worker in self.workers.values():
            worker.stop()
        if not self.args.keep:
            for url in self.urls.values():
                flush_redis(url)
            _env.drop_database(self.args.database_url)
        logdir = self.workers[SERVICE].log_path.parent
        self.console.print(f"[dim]worker logs: {logdir}[/dim]")

    def setup(self) -> None:
        """Fresh Redis dbs and database, seeded; every worker answering; callers started."""
        args, console, settings, config = self.args, self.console, self.settings, self.config
        self.started = time.monotonic()
        for url in self.urls.values():
            flush_redis(url)
        with console.status("creating and seeding the bench database"):
            _env.reset_database(args.database_url, self.environ)
            self.ids = seed_records(args.database_url, SCOPE, args.records, PAYLOAD_BYTES)
        self.machine = machine_info(self.urls[SERVICE], args.database_url)
        self.machine["dramatiq"] = version("dramatiq")
        with console.status("starting workers"):
            for worker in self.workers.values():
                worker.start()
            probe_client = Client(_env.CALLER, settings, config)
            first = self.ids[0]
            probes: dict[str, Callable[[], object]] = {
                SERVICE: lambda: probe_client.read(SCOPE, first, timeout=0.5)
            }
            if CELERY in self.urls:
                noop = make_app(self.urls[CELERY], self.celery_broker).tasks[NOOP_TASK]
                probes[CELERY] = lambda: noop.delay().get(timeout=0.5)
            if DRAMATIQ in self.urls:
                # Its results backend blocks for whole seconds only.
                dramatiq_probe = dramatiq_noop.Peer(self.urls[DRAMATIQ])
                probes[DRAMATIQ] = lambda: dramatiq_probe.call(1000)
            if FLOOR in self.urls:
                floor_probe = floor.Caller(redis.Redis.from_url(self.urls[FLOOR]))
                probes[FLOOR] = lambda: floor_probe.call(0.5)
            try:
                self.ready_s = {
                    system: _env.wait_ready(self.workers[system], probe)
                    for system, probe in probes.items()
                }
                if args.read == "cached":
                    # Every measured read is then a hit.
                    for object_id in self.ids:
                        probe_client.read(SCOPE, object_id)
            finally:
                probe_client.close()
        self.components = Components(
            {
                system: dramatiq_noop.worker_pids(worker.pid) if system == DRAMATIQ else worker.pid
                for system, worker in self.workers.items()
            },
            {
                "redis": _env.find_pid("redis-server"),
                "mariadb": _env.find_pid("mariadbd", "mysqld"),
                "rabbitmq": _env.rabbitmq_pid() if args.broker == "amqp" else None,
            },
        )
        self.callers = [Caller(i, self._factories()) for i in range(args.callers)]
        for caller in self.callers:
            caller.start()
        for caller in self.callers:
            caller.ready.wait()
            if caller.failure is not None:
                raise caller.failure
        self.phases = {"sequential": self.callers[:1], f"{args.callers} callers": self.callers}
        with console.status("warming up"):
            for system in self.systems:
                for group in self.phases.values():
                    self.round(group, system, max(1, args.warmup // len(group)))

    def _factories(self) -> dict[str, Callable[[random.Random], Call]]:
        shared = self.args.shared_client
        urls = self.urls
        factories = {
            SERVICE: service_factory(
                self.settings,
                self.config,
                self.ids,
                Client(_env.CALLER, self.settings, self.config) if shared else None,
                self.mode,
            )
        }
        if CELERY in urls:
            app = make_app(urls[CELERY], self.celery_broker) if shared else None
            factories[CELERY] = celery_factory(urls[CELERY], self.celery_broker, app)
        if DRAMATIQ in urls:
            peer = dramatiq_noop.Peer(urls[DRAMATIQ]) if shared else None
            factories[DRAMATIQ] = dramatiq_factory(urls[DRAMATIQ], peer)
        if FLOOR in urls:
            client = redis.Redis.from_url(urls[FLOOR]) if shared else None
            factories[FLOOR] = floor_factory(urls[FLOOR], client)
        return factories

    @property
    def mode(self) -> ReadMode:
        return ReadMode.ALLOW_CACHED if self.args.read == "cached" else ReadMode.PRIMARY

    def round(self, group: list[Caller], system: str, per_caller: int) -> RunResult:
        result = run_round(group, system, per_caller, self.components)
        # A dead worker ends the run (with its log) instead of timing out every call.
        self.workers[system].check_alive()
        return result

    def measure(self) -> dict[str, dict[str, Series]]:
        """Rounds of each phase, each system once a round, the order rotating by
        one each round (A B C, B C A, C A B, ...; with two systems A B, B A)."""
        systems = self.systems
        series = {p: {s: Series() for s in systems} for p in self.phases}
        for phase, group in self.phases.items():
            per_caller = self.args.requests // self.args.rounds // len(group)
            for r in range(self.args.rounds):
                shift = r % len(systems)
                # No spinner while measuring: its refresh thread would compete
                # for the GIL with the callers.
                self.console.print(f"[dim]{phase}: round {r + 1}/{self.args.rounds}[/dim]")
                for system in systems[shift:] + systems[:shift]:
                    # One call per caller first, not measured: Dramatiq's consumer
                    # polls, backing off to a second while its queue is empty, and
                    # would otherwise charge each round its wake-up from the other
                    # systems' turns.
                    self.round(group, system, 1)
                    series[phase][system].runs.append(self.round(group, system, per_caller))
        return series

    def report(self, series: dict[str, dict[str, Series]]) -> dict[str, Any]:
        args = self.args
        concurrency = self.config.lanes.interactive.concurrency
        results = {p: {s: series[p][s].summary() for s in self.systems} for p in series}
        peer_ratios = {
            peer: {
                phase: _ratio(by_system[SERVICE], by_system[peer])
                for phase, by_system in results.items()
            }
            for peer in self.systems[1:]
        }
        targets = [
            {
                "peer": t.peer,
                "phase": phase,
                "metric": t.metric,
                "target": t.text,
                "value": value,
                "met": t.met(value),
            }
            for t in TARGETS[args.read]
            if t.peer in peer_ratios
            for phase in results
            if _kind(phase) == t.phase
            for value in [peer_ratios[t.peer][phase][t.metric]]
        ]
        return {
            "command": " ".join(["python", "-m", "bench.roundtrip", *sys.argv[1:]]),
            "machine": self.machine,
            "setup": {
                "read": args.read,
                "systems": list(self.systems),
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
                    "concurrency": concurrency,
                    "prefetch_multiplier": 1,
                    "acks_late": True,
                    "without_gossip": True,
                    "without_mingle": True,
                },
                "peers": {
                    DRAMATIQ: {"processes": 1, "threads": concurrency, "results": "RedisBackend"},
                    FLOOR: {"threads": concurrency},
                },
                "worker_ready_s": self.ready_s,
                "elapsed_s": round(time.monotonic() - self.started, 1),
            },
            "results": results,
            # Service / stock Celery against the first Celery target of each
            # phase, the shape the report has always had.
            "ratios": _celery_ratios(peer_ratios.get(CELERY, {}), args.read),
            "peer_ratios": peer_ratios,
            "targets": targets,
        }

    def stop_callers(self) -> None:
        for caller in self.callers:
            caller.jobs.put(None)


def _worker_argv(system: str, url: str, concurrency: int, celery_broker: str | None) -> list[str]:
    """``system``'s worker, the peers' with the service lane's concurrency as threads."""
    if system == SERVICE:
        return worker_argv(LaneName.INTERACTIVE)
    module = {
        CELERY: "bench.baselines.noop",
        DRAMATIQ: dramatiq_noop.MODULE,
        FLOOR: "bench.baselines.floor",
    }[system]
    argv = [sys.executable, "-m", module, "--url", url]
    if system == CELERY:
        broker = ["--broker-url", celery_broker] if celery_broker else []
        return [*argv, *broker, "--concurrency", str(concurrency)]
    return [*argv, "--threads", str(concurrency)]


def _kind(phase: str) -> str:
    return "sequential" if phase == "sequential" else "concurrent"


def _ratio(service: dict[str, Any], peer: dict[str, Any]) -> dict[str, float]:
    rounds = [
        s / b for s, b in zip(service["rounds_p50_ms"], peer["rounds_p50_ms"], strict=True) if b
    ]
    return {
        "p50": service["p50_ms"] / peer["p50_ms"],
        "p50_rounds_median": statistics.median(rounds),
        "p99": service["p99_ms"] / peer["p99_ms"],
        "throughput": service["throughput_per_s"] / peer["throughput_per_s"],
        "p50_rounds_min": min(rounds),
        "p50_rounds_max": max(rounds),
    }


def _celery_ratios(by_phase: dict[str, dict[str, float]], read: str) -> dict[str, dict[str, Any]]:
    ratios: dict[str, dict[str, Any]] = {}
    for phase, ratio in by_phase.items():
        target = next(t for t in TARGETS[read] if t.peer == CELERY and t.phase == _kind(phase))
        ratios[phase] = {
            **ratio,
            "target": target.text,
            "meets_target": target.met(ratio[target.metric]),
        }
    return ratios


def _console() -> Console:
    # Piped output would otherwise be cut to 80 columns, which squashes the table.
    return Console() if sys.stdout.isatty() else Console(width=150)
