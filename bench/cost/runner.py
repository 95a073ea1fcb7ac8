"""The bench's options and :class:`Bench`: what it sets up, the order it
measures in, and the figures it reports (``python -m bench.cost`` prints them)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataservice_tools.loadtest.environment import flush_redis, run_callers_file, seed_records
from dataservice_tools.localservices import PrivateRedis
from dataservice_tools.testkit.callers import Caller, run_round
from dataservice_tools.testkit.cpu import Components
from dataservice_tools.testkit.machine import machine_info
from dataservice_tools.testkit.series import RunResult, percentile
from rich.console import Console
from sqlalchemy.engine import make_url

from bench import _env
from bench.cost import origins
from bench.cost.kinds import CACHED_READ, KINDS, PAYLOAD_BYTES, SCOPE, Clients, Kind
from bench.cost.meters import (
    BATCH,
    CPU_PARTS,
    INTERACTIVE,
    OTHER,
    SIDES,
    Delta,
    Meter,
    check_methods,
    listening_pid,
)
from dataservice import WriteOp
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, worker_argv, worker_environ

SEQUENTIAL = "sequential"
WORKER_OF = {LaneName.INTERACTIVE: INTERACTIVE, LaneName.BATCH: BATCH}
LOCAL = ("127.0.0.1", "localhost", "::1")
# A cached read's share of Redis: what it should come down to.
TARGET = {"commands": 20.0, "redis_cpu_ms": 0.1}


def parse_args(argv: list[str] | None, description: str | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.cost",
        description=description,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument(
        "--requests", type=int, default=2000, help="requests per kind and phase (ops, ids)"
    )
    p.add_argument("--callers", type=int, default=16, help="caller threads, concurrent phase")
    p.add_argument(
        "--batch", type=int, default=100, help="operations per submit_many, ids per read_many"
    )
    p.add_argument("--warmup", type=int, default=300, help="warm-up requests per kind and phase")
    p.add_argument("--sample", type=int, default=200, help="requests per kind under MONITOR")
    p.add_argument("--records", type=int, default=1000, help="seeded 1 KB records")
    p.add_argument("--quick", action="store_true", help="a small run that only checks it works")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--redis-host", default="127.0.0.1", help="with --redis-port")
    p.add_argument(
        "--redis-port",
        type=int,
        help="a Redis already running there (default: a private redis-server on a free port:"
        " its counters are then the bench's alone)",
    )
    p.add_argument("--redis-db", type=int, default=13, help="Redis db of its own, flushed")
    p.add_argument(
        "--database-url",
        default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_cost_bench",
        help="the bench database (must end in _bench: it is dropped and recreated)",
    )
    p.add_argument("--keep", action="store_true", help="leave the database and the Redis db")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.callers, args.warmup, args.sample, args.records = 200, 4, 50, 100, 200
    if args.redis_db == 0:
        p.error("--redis-db must not be 0")
    if args.callers < 1 or args.batch < 1 or args.requests < args.batch:
        p.error("need callers >= 1, batch >= 1 and requests >= batch")
    if args.records < args.batch:
        p.error("need records >= batch: read_many reads distinct seeded ids")
    return args


@dataclass
class Measured:
    """One kind in one phase: its requests, and what they and as long idle cost."""

    kind: Kind
    phase: str
    requests: int
    calls: int
    # Calls admission refused and that were made again (each counted once more).
    refused: int
    run: RunResult
    busy: Delta
    idle: Delta


@dataclass
class Bench:
    args: argparse.Namespace
    console: Console
    settings: Settings
    config: Config
    url: str
    # None when the bench uses a Redis already running (--redis-port).
    private: PrivateRedis | None
    environ: dict[str, str]
    workers: dict[LaneName, WorkerProcess]
    clients: Clients
    started: float = field(init=False, default=0.0)
    private_started: bool = field(init=False, default=False)
    ids: list[str] = field(init=False, default_factory=list)
    machine: dict[str, Any] = field(init=False, default_factory=dict)
    checks: dict[str, object] = field(init=False, default_factory=dict)
    meter: Meter | None = field(init=False, default=None)
    components: Components = field(init=False)
    callers: list[Caller] = field(init=False, default_factory=list)
    phases: dict[str, list[Caller]] = field(init=False, default_factory=dict)
    origins: dict[str, dict[str, Counter[str]]] = field(init=False, default_factory=dict)

    @classmethod
    def create(cls, args: argparse.Namespace) -> Bench:
        logdir = Path(tempfile.mkdtemp(prefix="dataservice-bench-cost-"))
        private = None if args.redis_port else PrivateRedis(logdir)
        if private is None:
            url = _env.redis_url(args.redis_host, args.redis_port, args.redis_db)
        else:
            url = f"{private.base}/{args.redis_db}"
        settings = Settings(
            config_path=_env.unguarded_config(logdir),
            broker_url=url,
            result_backend_url=url,
            redis_url=url,
            database_url=args.database_url,
            callers_file=run_callers_file(logdir, _env.CALLER),
        )
        environ = worker_environ(settings)
        # The workers run this source tree (a scratch copy measures its own changes).
        environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_env.REPO), os.environ.get("PYTHONPATH")])
        )
        config = settings.load()
        workers = {
            lane: WorkerProcess(
                worker_argv(lane), environ, logdir / f"{lane.value}.log", lane.value
            )
            for lane in WORKER_OF
        }
        console = Console() if sys.stdout.isatty() else Console(width=150)
        clients = Clients(settings, config)
        return cls(args, console, settings, config, url, private, environ, workers, clients)

    def setup(self) -> None:
        """A fresh Redis db and database, seeded; both workers answering; every
        record read once; the callers started and warmed up; where each kind's
        commands come from."""
        args, console = self.args, self.console
        self.started = time.monotonic()
        if self.private is not None:
            self.private.start()
            self.private_started = True
        flush_redis(self.url)
        with console.status("creating and seeding the bench database"):
            _env.reset_database(args.database_url, self.environ)
            self.ids = seed_records(args.database_url, SCOPE, args.records, PAYLOAD_BYTES)
        self.machine = machine_info(self.url, args.database_url)
        self.checks = check_methods(self.url)
        with console.status("starting workers"):
            for worker in self.workers.values():
                worker.start()
            with Client(_env.CALLER, self.settings, self.config) as probe:
                first = self.ids[0]
                _env.wait_ready(
                    self.workers[LaneName.INTERACTIVE],
                    lambda: probe.read(SCOPE, first, timeout=0.5),
                )
                _env.wait_ready(
                    self.workers[LaneName.BATCH],
                    lambda: probe.submit(WriteOp("probe", "p", b"p"), timeout=0.5).result(),
                )
                # Every cached read measured is then a hit.
                for object_id in self.ids:
                    probe.read(SCOPE, object_id)
        pids = {WORKER_OF[lane]: self._pid(lane) for lane in WORKER_OF}
        database = make_url(args.database_url)
        mariadb = listening_pid(database.port or 3306) if database.host in LOCAL else None
        self.meter = Meter(self.url, pids, mariadb)
        self.components = Components({k.name: pids[WORKER_OF[k.lane]] for k in KINDS}, {})
        factories = self.clients.factories(self.ids, args.batch)
        self.callers = [Caller(i, factories) for i in range(args.callers)]
        for caller in self.callers:
            caller.start()
        for caller in self.callers:
            caller.ready.wait()
            if caller.failure is not None:
                raise caller.failure
        self.phases = {SEQUENTIAL: self.callers[:1], f"{args.callers} callers": self.callers}
        with console.status("warming up"):
            for kind in KINDS:
                for group in self.phases.values():
                    self.round(group, kind, args.warmup)
        for kind in KINDS:
            console.print(f"[dim]where the commands come from: {kind.name}[/dim]")
            self.origins[kind.name] = self.sample(kind)

    def sample(self, kind: Kind) -> dict[str, Counter[str]]:
        """``--sample`` requests of ``kind`` from one caller, under ``MONITOR``."""
        assert self.meter is not None
        return origins.sample(
            self.url,
            self.args.redis_db,
            self.meter,
            lambda: self.round(self.callers[:1], kind, self.args.sample),
        )

    def _pid(self, lane: LaneName) -> int:
        pid = self.workers[lane].pid
        if pid is None:
            raise RuntimeError(f"the {lane.value} worker has no pid")
        return pid

    def calls(self, kind: Kind, requests: int, callers: int) -> int:
        """Calls per caller for about ``requests`` requests in all."""
        return max(1, requests // kind.per_call(self.args.batch) // callers)

    def round(self, group: list[Caller], kind: Kind, requests: int) -> tuple[RunResult, int]:
        per_caller = self.calls(kind, requests, len(group))
        result = run_round(group, kind.name, per_caller, self.components)
        # A dead worker ends the run (with its log) instead of timing out every call.
        for worker in self.workers.values():
            worker.check_alive()
        return result, per_caller * len(group)

    def measure(self) -> list[Measured]:
        """Each kind in each phase, each followed by as long with nothing asked."""
        assert self.meter is not None
        meter, measured = self.meter, []
        for phase, group in self.phases.items():
            for kind in KINDS:
                # No spinner while measuring: its thread would compete with the callers.
                self.console.print(f"[dim]{phase}: {kind.name}[/dim]")
                refused = self.clients.refused[kind.name]
                before = meter.read()
                run, calls = self.round(group, kind, self.args.requests)
                busy = meter.delta(before, meter.read())
                refused = self.clients.refused[kind.name] - refused
                before = meter.read()
                time.sleep(busy.seconds)
                idle = meter.delta(before, meter.read())
                requests = calls * kind.per_call(self.args.batch)
                measured.append(Measured(kind, phase, requests, calls, refused, run, busy, idle))
        return measured

    def cleanup(self) -> None:
        for caller in self.callers:
            caller.jobs.put(None)
        self.clients.close()
        if self.meter is not None:
            self.meter.close()
        for worker in self.workers.values():
            worker.stop()
        if self.private_started:
            assert self.private is not None
            self.private.signal(signal.SIGTERM)
        elif not self.args.keep:
            flush_redis(self.url)
        if not self.args.keep:
            _env.drop_database(self.args.database_url)
        logdir = self.workers[LaneName.INTERACTIVE].log_path.parent
        self.console.print(f"[dim]worker logs: {logdir}[/dim]")

    def report(self, measured: list[Measured]) -> dict[str, Any]:
        args = self.args
        phases: dict[str, dict[str, Any]] = {}
        for m in measured:
            phases.setdefault(m.phase, {})[m.kind.name] = _figures(m, self.origins[m.kind.name])
        idle = [m.idle for m in measured]
        return {
            "command": " ".join(["python", "-m", "bench.cost", *sys.argv[1:]]),
            "machine": self.machine,
            "setup": {
                "requests_per_kind_and_phase": args.requests,
                "callers": args.callers,
                "batch": args.batch,
                "warmup": args.warmup,
                "sample": args.sample,
                "records": args.records,
                "payload_bytes": PAYLOAD_BYTES,
                "redis": "private" if self.private else f"{args.redis_host}:{args.redis_port}",
                "redis_db": args.redis_db,
                "lanes": {
                    lane.value: {
                        "concurrency": getattr(self.config.lanes, lane.value).concurrency,
                        "permits": getattr(self.config.lanes, lane.value).permits,
                    }
                    for lane in WORKER_OF
                },
                "elapsed_s": round(time.monotonic() - self.started, 1),
            },
            "checks": self.checks,
            "kinds": {k.name: {"lane": k.lane.value, "unit": k.unit} for k in KINDS},
            "phases": phases,
            "idle_per_s": _per_second(idle),
            "target": _target(phases),
        }


def _per(values: dict[str, float], n: int, digits: int = 3) -> dict[str, float]:
    return {k: round(v / n, digits) for k, v in sorted(values.items()) if round(v / n, digits)}


def _figures(m: Measured, seen: dict[str, Counter[str]]) -> dict[str, Any]:
    """One kind in one phase, per request, net of the idle interval after it."""
    net, n = m.busy.net(m.idle), m.requests
    by_name = _per(net.commands, n)
    lat = m.run.latencies_ns
    return {
        "requests": n,
        "calls": m.calls,
        "errors": m.run.errors,
        "first_error": m.run.first_error,
        "refused_and_made_again": m.refused,
        "seconds": round(m.busy.seconds, 3),
        "p50_ms_per_call": round((percentile(lat, 50) or 0) / 1e6, 3),
        "calls_per_s": round(m.calls / m.run.wall_s, 1) if m.run.wall_s else None,
        "commands": round(sum(net.commands.values()) / n, 3),
        "commands_by_name": by_name,
        "commands_by_origin": _by_origin(by_name, seen),
        "segments": {side: round(net.segments[side] / n, 3) for side in SIDES},
        "bytes_sent": {side: round(net.bytes_sent[side] / n, 1) for side in SIDES},
        "cpu_ms": {
            part: None if net.cpu_s.get(part) is None else round(1000 * net.cpu_s[part] / n, 4)  # type: ignore[operator]
            for part in CPU_PARTS
        },
        "sockets_opened": net.opened,
        "sockets_closed": net.closed,
        "idle": {
            "seconds": round(m.idle.seconds, 3),
            "commands": {k: v for k, v in sorted(m.idle.commands.items()) if v},
            "segments": {k: v for k, v in m.idle.segments.items() if v},
            "cpu_ms": {
                part: None if v is None else round(1000 * v, 2) for part, v in m.idle.cpu_s.items()
            },
        },
        "monitor_sample": {name: dict(counts) for name, counts in sorted(seen.items())},
    }


def _by_origin(by_name: dict[str, float], seen: dict[str, Counter[str]]) -> dict[str, Any]:
    """Each command's count per request, shared among its origins as the
    ``MONITOR`` sample shares it (``unseen``: a command the sample never showed)."""
    shares: dict[str, Any] = {}
    for name, count in by_name.items():
        counts = seen.get(name)
        total = sum(counts.values()) if counts else 0
        if not counts or not total:
            shares[name] = {"unseen": count}
            continue
        shares[name] = {o: round(count * c / total, 3) for o, c in counts.most_common()}
    return shares


def _per_second(idle: list[Delta]) -> dict[str, Any]:
    seconds = sum(d.seconds for d in idle)
    commands: Counter[str] = Counter()
    segments: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    for d in idle:
        commands.update({k: v for k, v in d.commands.items() if v})
        segments.update({k: v for k, v in d.segments.items() if v})
        cpu.update({k: v for k, v in d.cpu_s.items() if v is not None})
    return {
        "seconds": round(seconds, 1),
        "commands": {k: round(v / seconds, 2) for k, v in commands.most_common()},
        "commands_total": round(sum(commands.values()) / seconds, 2),
        "segments": {k: round(v / seconds, 2) for k, v in segments.items()},
        "cpu_ms": {k: round(1000 * v / seconds, 3) for k, v in cpu.items()},
        "other_side_segments": segments.get(OTHER, 0),
    }


def _target(phases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The cached read against :data:`TARGET`, in every phase."""
    runs = {phase: kinds[CACHED_READ] for phase, kinds in phases.items()}
    commands = {phase: r["commands"] for phase, r in runs.items()}
    redis_cpu = {phase: r["cpu_ms"]["redis"] for phase, r in runs.items()}
    return {
        "kind": CACHED_READ,
        "commands_at_most": TARGET["commands"],
        "redis_cpu_ms_at_most": TARGET["redis_cpu_ms"],
        "commands": commands,
        "redis_cpu_ms": redis_cpu,
        "met": all(c <= TARGET["commands"] for c in commands.values())
        and all(c is not None and c <= TARGET["redis_cpu_ms"] for c in redis_cpu.values()),
    }
