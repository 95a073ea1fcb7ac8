"""Batch writes through the service against a stock Celery task and mysqlclient alone.

    .venv/bin/python bench/batch.py [--writes 20000] [--runs 3] [--json out.json]
    .venv/bin/python bench/batch.py --threads 3 4 6 8 [--paced-rate 6000] [--json out.json]

Sets everything up itself: its own Redis db numbers (``--service-db``,
``--bare-db``; never db 0) flushed, the ``dataservice_bench`` database
recreated with ``dataservice db upgrade``, one ``dataservice worker --lane
batch`` with the shipped ``queues.yml`` (its permits, concurrency and batch
bounds) and a stock Celery worker (:mod:`bench.baselines.upsert`, threads pool,
as many threads as the lane's permits) as subprocesses. Then, in each run,
every system writes ``--writes`` records of 1 KB to distinct ids of a scope
of its own, the systems taking turns (A B C, then C B A, ...):

- **service**: one ``Client.submit_many`` of every write, then each handle's
  answer (the client packs them into batch messages; the worker commits them
  a transaction per permit);
- **stock Celery**: ``upsert.delay(...)`` per write, then each result's
  ``.get()``; the task runs the service's own upsert statement;
- **mysqlclient**: as many connections as the lane has permits, each writing
  its share in 100-row transactions, one statement per row (``rows``) and,
  apart, one multi-row ``executemany`` per transaction (``executemany``);
- **service, 8 callers one at a time**: 8 threads each ``submit(...).result()``
  in turn, one write per message (``--single-writes`` in all).

With ``--threads``, the service alone, its batch worker run with each of
those thread counts in turn (a fresh worker per run, the counts taking turns:
3 4 6 8, then 8 6 4 3, ...) against the lane's permits: in each run the same
one ``submit_many`` of ``--writes`` (throughput, permits busy), then the same
offered load, ``--paced-rate`` writes/s in messages of the lane's
``max_ops_per_message`` for ``--paced-seconds``, each message's latency from
its publish to its answer. What threads beyond the permits are for is to get
the next message ready (decoded, checked, authorised) while the permits commit.

Throughput is writes over the time from the first publish to the last answer
(or commit). While the service runs, the bench samples the worker's
``dataservice_permits_in_use`` gauge (``--metrics-port``) every 200 ms and
its ``dataservice_permits_held_seconds_total`` before and after (the exact
busy share: seconds held over permits times the run's seconds), and
``information_schema.innodb_trx`` every 120 ms (the server refreshes that
table only after 100 ms without a read): a transaction seen in samples
spanning ``t`` was open at least ``t`` and at most ``t`` plus two sampling
intervals, and one never seen was open less than two intervals. CPU per
write is read from ``/proc`` for this process (the client), the worker,
redis-server and mariadbd.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import MySQLdb
from dataservice_tools.loadtest.environment import flush_redis, run_callers_file
from dataservice_tools.localservices import free_port
from dataservice_tools.testkit.cpu import process_cpu_s
from dataservice_tools.testkit.machine import machine_info
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url

from bench import _env
from bench.baselines.upsert import UPSERT_TASK, upsert_args
from bench.baselines.upsert import make_app as bare_app
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import DataServiceError, ResourceExhausted
from dataservice.observe.metrics.endpoint import scrape_port
from dataservice.ops.processes import WorkerProcess, worker_argv, worker_environ
from dataservice.types import WriteOp, WriteResult

SERVICE = "service"
BARE = "stock celery"
ROWS = "mysqlclient rows"
MANY = "mysqlclient executemany"
SINGLES = "service, 8 callers one at a time"
SYSTEMS = (SERVICE, BARE, ROWS, MANY, SINGLES)
PAYLOAD_BYTES = 1024
ROWS_PER_TRANSACTION = 100
SINGLE_CALLERS = 8
# With --threads, written before each run's measured ones: a fresh worker's
# connections, caches and code paths warmed up.
WARM_WRITES = 2000
CPU_COMPONENTS = ("client", "worker", "redis", "mariadb")
# The targets: service / stock task, service / mysqlclient (rows).
TARGETS = {BARE: 10.0, ROWS: 0.5}
PERMIT_BUSY_TARGET = 0.7
PERMITS_EVERY_S = 0.2
# MariaDB refreshes information_schema.innodb_trx only once it has not been
# read for 100 ms: polled faster, it shows the same snapshot for ever.
TRX_EVERY_S = 0.12
_UPSERT_SQL = (
    "INSERT INTO records (scope, object_id, revision, payload, created_at, updated_at)"
    " VALUES (%s, %s, 1, %s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
    " ON DUPLICATE KEY UPDATE revision = revision + 1, payload = VALUES(payload),"
    " updated_at = VALUES(updated_at)"
)


# Samplers ------------------------------------------------------------------------


def _scraped(port: int, name: str) -> float | None:
    for sample in scrape_port(port) or ():
        if sample.name == name and sample.labels.get("lane") == LaneName.BATCH.value:
            return float(sample.value)
    return None


class PermitSampler:
    """The batch lane's permits in use, from the worker's metrics page: the
    gauge every ``PERMITS_EVERY_S`` (a scrape costs the worker a little, so
    not too often), and the seconds permits were held, before and after."""

    def __init__(self, port: int) -> None:
        self._port = port
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="permits", daemon=True)
        self._held = (0.0, 0.0)
        self.held_s = 0.0
        self.elapsed_s = 0.0

    def _run(self) -> None:
        while not self._stop.wait(PERMITS_EVERY_S):
            in_use = _scraped(self._port, "dataservice_permits_in_use")
            if in_use is not None:
                self.samples.append(in_use)

    def _held_now(self) -> tuple[float, float]:
        # The scrape's middle: the page is rendered some time during it.
        before = time.monotonic()
        held = _scraped(self._port, "dataservice_permits_held_seconds_total")
        return (before + time.monotonic()) / 2, held or 0.0

    def __enter__(self) -> PermitSampler:
        self._held = self._held_now()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # Read before the gauge's thread is stopped: a scrape of its in flight
        # would otherwise widen the window.
        at, held = self._held_now()
        self._stop.set()
        self._thread.join()
        self.elapsed_s, self.held_s = at - self._held[0], held - self._held[1]


class TransactionSampler:
    """How long InnoDB transactions stay open, by sampling ``innodb_trx``."""

    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        self._connect = {
            "host": url.host or "127.0.0.1",
            "port": url.port or 3306,
            "user": url.username or "root",
            "passwd": url.password or "",
        }
        # Per transaction (by connection and start second): when first and
        # last seen; and what each connection's transaction showed last.
        self._seen: dict[tuple[int, str, int], tuple[float, float]] = {}
        self._last: dict[int, tuple[str, int, int]] = {}
        # The sample each connection's current transaction was first seen in.
        self._open: dict[int, int] = {}
        self._sample = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="innodb_trx", daemon=True)

    def _run(self) -> None:
        conn = MySQLdb.connect(**self._connect, autocommit=True)
        try:
            cursor = conn.cursor()
            cursor.execute("SELECT CONNECTION_ID()")
            own = cursor.fetchone()[0]
            while not self._stop.wait(TRX_EVERY_S):
                self._observe(cursor, own)
        finally:
            conn.close()

    def _observe(self, cursor: Any, own: int) -> None:
        """One sample. A pooled connection runs one transaction after another,
        and InnoDB shows a transaction that has written nothing yet under an
        id its next one may reuse: one is taken for the same only if its
        connection showed it in the previous sample too, with the same id and
        start (a long transaction is then seen in every sample it spans)."""
        now = time.monotonic()
        self._sample += 1
        cursor.execute(
            "SELECT trx_mysql_thread_id, trx_started, trx_id"
            " FROM information_schema.innodb_trx WHERE trx_mysql_thread_id <> %s",
            (own,),
        )
        for thread, began, trx_id in cursor.fetchall():
            started = f"{began}/{trx_id}"
            last = self._last.get(thread)
            same = last is not None and last[0] == started and last[2] == self._sample - 1
            key = (thread, started, self._sample if not same else self._open[thread])
            if not same:
                self._open[thread] = self._sample
            first, _ = self._seen.get(key, (now, now))
            self._seen[key] = (first, now)
            self._last[thread] = (started, 0, self._sample)

    @property
    def longest_ms(self) -> float:
        """The longest time one transaction was seen open (ms; a lower bound)."""
        return max(((last - first) * 1000 for first, last in self._seen.values()), default=0.0)

    @property
    def count(self) -> int:
        return len(self._seen)

    def __enter__(self) -> TransactionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# Systems -------------------------------------------------------------------------


@dataclass
class Run:
    """One system's run: how many writes, how long, what failed, what it cost."""

    writes: int
    seconds: float
    errors: int = 0
    first_error: str | None = None
    cpu_s: dict[str, float | None] = field(default_factory=dict)
    permits: dict[str, float] = field(default_factory=dict)
    transactions: dict[str, float] = field(default_factory=dict)

    @property
    def per_s(self) -> float:
        return self.writes / self.seconds if self.seconds else float("nan")


def _payload(n: int) -> bytes:
    return (b"%08d" % n) * (PAYLOAD_BYTES // 8)


def _answers(client: Client, handles: list[Any]) -> tuple[int, str | None]:
    errors, first = 0, None
    for answer in client.results(handles):
        if not isinstance(answer, WriteResult):
            errors += 1
            first = first or f"{type(answer).__name__}: {answer}"
    return errors, first


def write_service(client: Client, scope: str, count: int) -> tuple[int, str | None]:
    """As a batch job would: everything in one ``submit_many``; what admission
    refuses (with what it accepted before) goes again after its retry-after."""
    ops = [
        WriteOp(scope, f"r{n:06d}", _payload(n), idempotency_key=f"{scope}-{n}")
        for n in range(count)
    ]
    handles: list[Any] = []
    while len(handles) < len(ops):
        try:
            handles += client.submit_many(ops[len(handles) :])
        except ResourceExhausted as exc:
            handles += exc.accepted
            time.sleep(exc.retry_after)
    return _answers(client, handles)


@dataclass
class Paced:
    """A paced phase: each message's latency (ms), and what failed."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None
    behind_s: float = 0.0


def write_paced(client: Client, scope: str, rate: float, seconds: float, per_message: int) -> Paced:
    """``rate`` writes/s for ``seconds``, a message of ``per_message`` writes at a
    time on schedule (open loop: a late publish is counted in ``behind_s``, never
    skipped); each message's latency from its publish to its answer."""
    paced = Paced()
    lock = threading.Lock()
    interval = per_message / rate
    messages = max(1, round(seconds * rate / per_message))

    def answered(handles: list[Any], sent: float) -> None:
        errors, first = _answers(client, handles)
        took_ms = (time.perf_counter() - sent) * 1000
        with lock:
            paced.latencies_ms.append(took_ms)
            paced.errors += errors
            paced.first_error = paced.first_error or first

    with ThreadPoolExecutor(64) as waiters:
        start = time.perf_counter()
        for m in range(messages):
            due = start + m * interval
            time.sleep(max(0.0, due - time.perf_counter()))
            paced.behind_s = max(paced.behind_s, time.perf_counter() - due)
            ops = [
                WriteOp(scope, f"p{m:05d}-{n:03d}", _payload(n), idempotency_key=f"{scope}-{m}-{n}")
                for n in range(per_message)
            ]
            sent = time.perf_counter()
            try:
                handles = client.submit_many(ops)
            except DataServiceError as exc:
                with lock:
                    paced.errors += per_message
                    paced.first_error = paced.first_error or f"{type(exc).__name__}: {exc}"
                continue
            waiters.submit(answered, handles, sent)
    return paced


def write_singles(
    settings: Settings, config: Config, scope: str, count: int
) -> tuple[int, str | None]:
    per_caller = count // SINGLE_CALLERS

    def caller(index: int) -> tuple[int, str | None]:
        with Client(_env.CALLER, settings, config) as client:
            errors, first = 0, None
            for n in range(index * per_caller, (index + 1) * per_caller):
                try:
                    client.submit(WriteOp(scope, f"s{n:06d}", _payload(n))).result()
                except DataServiceError as exc:
                    errors += 1
                    first = first or f"{type(exc).__name__}: {exc}"
            return errors, first

    with ThreadPoolExecutor(SINGLE_CALLERS) as pool:
        outcomes = list(pool.map(caller, range(SINGLE_CALLERS)))
    return sum(e for e, _ in outcomes), next((f for _, f in outcomes if f), None)


def write_bare(app: Any, scope: str, count: int) -> tuple[int, str | None]:
    task = app.tasks[UPSERT_TASK]
    results = [task.delay(*upsert_args(scope, f"r{n:06d}", _payload(n))) for n in range(count)]
    errors, first = 0, None
    for result in results:
        try:
            result.get(timeout=120)
        except Exception as exc:
            errors += 1
            first = first or f"{type(exc).__name__}: {exc}"
    return errors, first


def write_mysqlclient(
    database_url: str, scope: str, count: int, connections: int, *, many: bool
) -> tuple[int, str | None]:
    url = make_url(database_url)

    def writer(index: int) -> None:
        conn = MySQLdb.connect(
            host=url.host or "127.0.0.1",
            port=url.port or 3306,
            user=url.username or "root",
            passwd=url.password or "",
            db=url.database,
            autocommit=True,
        )
        try:
            cursor = conn.cursor()
            mine = list(range(index, count, connections))
            for start in range(0, len(mine), ROWS_PER_TRANSACTION):
                rows = [
                    (scope, f"r{n:06d}", _payload(n))
                    for n in mine[start : start + ROWS_PER_TRANSACTION]
                ]
                cursor.execute("START TRANSACTION")
                if many:
                    cursor.executemany(_UPSERT_SQL, rows)
                else:
                    for row in rows:
                        cursor.execute(_UPSERT_SQL, row)
                cursor.execute("COMMIT")
        finally:
            conn.close()

    with ThreadPoolExecutor(connections) as pool:
        list(pool.map(writer, range(connections)))
    return 0, None


# Orchestration -------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--writes", type=int, default=20_000, help="writes per system and run")
    p.add_argument(
        "--bare-writes", type=int, help="the stock task's writes per run (default: --writes)"
    )
    p.add_argument(
        "--single-writes", type=int, default=2000, help="writes of the 8 one-at-a-time callers"
    )
    p.add_argument("--runs", type=int, default=3, help="alternating runs")
    p.add_argument(
        "--threads",
        type=int,
        nargs="+",
        help="compare the service alone at these batch worker thread counts",
    )
    p.add_argument(
        "--paced-rate", type=float, default=6000, help="with --threads: the offered writes/s"
    )
    p.add_argument(
        "--paced-seconds", type=float, default=10, help="with --threads: how long it is offered"
    )
    p.add_argument("--quick", action="store_true", help="a small run that only checks it works")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--redis-host", default="127.0.0.1")
    p.add_argument("--redis-port", type=int, default=6379)
    p.add_argument("--service-db", type=int, default=9, help="Redis db for the service")
    p.add_argument("--bare-db", type=int, default=10, help="Redis db for stock Celery")
    p.add_argument(
        "--database-url",
        default="mysql+mysqldb://root@127.0.0.1:3306/dataservice_bench",
        help="the bench database (must end in _bench: it is dropped and recreated)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.writes, args.bare_writes, args.single_writes, args.runs = 1000, 200, 200, 1
    if 0 in (args.service_db, args.bare_db) or args.service_db == args.bare_db:
        p.error("--service-db and --bare-db must differ and must not be 0")
    if args.writes < 1 or args.runs < 1 or args.single_writes < SINGLE_CALLERS:
        p.error("need writes >= 1, runs >= 1 and single-writes >= 8")
    if args.threads and (min(args.threads) < 1 or len(set(args.threads)) != len(args.threads)):
        p.error("--threads takes distinct counts of at least 1")
    if args.paced_rate <= 0 or args.paced_seconds <= 0:
        p.error("--paced-rate and --paced-seconds must be positive")
    return args


@dataclass
class Bench:
    args: argparse.Namespace
    console: Console
    settings: Settings
    config: Config
    service_url: str
    bare_url: str
    environ: dict[str, str]
    workers: dict[str, WorkerProcess]
    metrics_port: int
    machine: dict[str, Any] = field(default_factory=dict)
    pids: dict[str, int | None] = field(default_factory=dict)

    @classmethod
    def create(cls, args: argparse.Namespace) -> Bench:
        service_url = _env.redis_url(args.redis_host, args.redis_port, args.service_db)
        bare_url = _env.redis_url(args.redis_host, args.redis_port, args.bare_db)
        logdir = Path(tempfile.mkdtemp(prefix="dataservice-bench-batch-"))
        settings = Settings(
            config_path=_env.REPO / "queues.yml",
            broker_url=service_url,
            result_backend_url=service_url,
            redis_url=service_url,
            database_url=args.database_url,
            callers_file=run_callers_file(logdir, _env.CALLER),
        )
        config = settings.load()
        environ = worker_environ(settings)
        environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(_env.REPO), os.environ.get("PYTHONPATH")])
        )
        port = free_port()
        threads = str(config.lanes.batch.permits)
        if args.threads:
            workers = {
                threads_system(n): WorkerProcess(
                    worker_argv(
                        LaneName.BATCH, "--metrics-port", str(port), "--concurrency", str(n)
                    ),
                    environ,
                    logdir / f"service-{n}-threads.log",
                    threads_system(n),
                )
                for n in args.threads
            }
            console = Console() if sys.stdout.isatty() else Console(width=150)
            return cls(
                args, console, settings, config, service_url, bare_url, environ, workers, port
            )
        workers = {
            SERVICE: WorkerProcess(
                worker_argv(LaneName.BATCH, "--metrics-port", str(port)),
                environ,
                logdir / "service-worker.log",
                SERVICE,
            ),
            BARE: WorkerProcess(
                [
                    sys.executable,
                    "-m",
                    "bench.baselines.upsert",
                    "--url",
                    bare_url,
                    "--concurrency",
                    threads,
                    "--database-url",
                    args.database_url,
                ],
                environ,
                logdir / "bare.log",
                "bare",
            ),
        }
        console = Console() if sys.stdout.isatty() else Console(width=150)
        return cls(args, console, settings, config, service_url, bare_url, environ, workers, port)

    def setup(self) -> None:
        for url in (self.service_url, self.bare_url):
            flush_redis(url)
        with self.console.status("creating the bench database"):
            _env.reset_database(self.args.database_url, self.environ)
        self.machine = machine_info(self.service_url, self.args.database_url)
        if self.args.threads:
            # One worker at a time, started for its run (measure_threads).
            self.pids = {
                "redis": _env.find_pid("redis-server"),
                "mariadb": _env.find_pid("mariadbd", "mysqld"),
            }
            return
        with self.console.status("starting workers"):
            for worker in self.workers.values():
                worker.start()
            with Client(_env.CALLER, self.settings, self.config) as probe:
                _env.wait_ready(
                    self.workers[SERVICE],
                    lambda: probe.submit(WriteOp("probe", "p", b"p"), timeout=0.5).result(),
                )
            task = bare_app(self.bare_url).tasks[UPSERT_TASK]
            _env.wait_ready(
                self.workers[BARE],
                lambda: task.delay(*upsert_args("probe", "p", b"p")).get(timeout=0.5),
            )
        self.pids = {
            SERVICE: self.workers[SERVICE].pid,
            BARE: self.workers[BARE].pid,
            "redis": _env.find_pid("redis-server"),
            "mariadb": _env.find_pid("mariadbd", "mysqld"),
        }

    def cleanup(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        for url in (self.service_url, self.bare_url):
            flush_redis(url)
        _env.drop_database(self.args.database_url)
        logs = next(iter(self.workers.values())).log_path.parent
        self.console.print(f"[dim]worker logs: {logs}[/dim]")

    def _cpu(self, worker: str | None) -> dict[str, float | None]:
        return {
            "client": time.process_time(),
            "worker": process_cpu_s(self.pids[worker]) if worker else 0.0,
            "redis": process_cpu_s(self.pids["redis"]) if self.pids["redis"] else None,
            "mariadb": process_cpu_s(self.pids["mariadb"]) if self.pids["mariadb"] else None,
        }

    def _timed(
        self, worker: str | None, count: int, write: Callable[[], tuple[int, str | None]]
    ) -> Run:
        before = self._cpu(worker)
        started = time.perf_counter()
        errors, first = write()
        seconds = time.perf_counter() - started
        after = self._cpu(worker)
        cpu = {
            part: None
            if after[part] is None or before[part] is None
            else after[part] - before[part]  # type: ignore[operator]
            for part in CPU_COMPONENTS
        }
        return Run(count, seconds, errors, first, cpu)

    def _service(self, scope: str) -> Run:
        """One ``submit_many`` of every write, with the permits and transactions sampled."""
        args = self.args
        permits = self.config.lanes.batch.permits
        # The permits' window is the run's own: opened last and closed
        # first, so that the other samplers' start and stop fall outside.
        with (
            Client(_env.CALLER, self.settings, self.config) as client,
            TransactionSampler(args.database_url) as trx,
            PermitSampler(self.metrics_port) as sampled,
        ):
            run = self._timed(
                SERVICE, args.writes, lambda: write_service(client, scope, args.writes)
            )
        # The samples while writes were in flight (the sampler's first and
        # last may fall before the first publish or after the last answer).
        busy = sampled.samples
        run.permits = {
            "capacity": permits,
            "mean_in_use": statistics.fmean(busy) if busy else 0.0,
            "busy_share_sampled": (statistics.fmean(busy) / permits) if busy else 0.0,
            # Exact: the seconds permits were held over the run's permit-seconds.
            "busy_share": sampled.held_s / (permits * sampled.elapsed_s),
            "max_in_use": max(busy, default=0.0),
            "samples": len(busy),
        }
        run.transactions = {
            "seen": trx.count,
            "longest_seen_ms": round(trx.longest_ms, 1),
            "at_most_ms": round(trx.longest_ms + 2 * TRX_EVERY_S * 1000, 1),
            "bound_ms": self.config.lanes.batch.max_transaction_ms,
        }
        return run

    def run(self, system: str, run_index: int) -> Run:
        args = self.args
        scope = f"run{run_index}-{SYSTEMS.index(system)}"
        permits = self.config.lanes.batch.permits
        if system == SERVICE:
            return self._service(scope)
        if system == SINGLES:
            return self._timed(
                SERVICE,
                args.single_writes,
                lambda: write_singles(self.settings, self.config, scope, args.single_writes),
            )
        if system == BARE:
            count = args.bare_writes or args.writes
            app = bare_app(self.bare_url)
            try:
                return self._timed(BARE, count, lambda: write_bare(app, scope, count))
            finally:
                app.close()
        many = system == MANY
        return self._timed(
            None,
            args.writes,
            lambda: write_mysqlclient(args.database_url, scope, args.writes, permits, many=many),
        )

    def measure(self) -> dict[str, list[Run]]:
        systems = SYSTEMS
        runs: dict[str, list[Run]] = {s: [] for s in systems}
        for r in range(self.args.runs):
            for system in systems if r % 2 == 0 else systems[::-1]:
                self.console.print(f"[dim]run {r + 1}/{self.args.runs}: {system}[/dim]")
                runs[system].append(self.run(system, r))
                for worker in self.workers.values():
                    worker.check_alive()
        return runs

    def run_threads(self, threads: int, run_index: int) -> tuple[Run, Paced]:
        """A fresh worker of ``threads`` threads: warmed up, then the burst and
        the paced phase; stopped afterwards."""
        worker = self.workers[threads_system(threads)]
        worker.start()
        try:
            with Client(_env.CALLER, self.settings, self.config) as client:
                _env.wait_ready(
                    worker,
                    lambda: client.submit(WriteOp("probe", "p", b"p"), timeout=0.5).result(),
                )
                self.pids[SERVICE] = worker.pid
                write_service(client, f"warm{run_index}-t{threads}", WARM_WRITES)
                run = self._service(f"run{run_index}-t{threads}")
                paced = write_paced(
                    client,
                    f"paced{run_index}-t{threads}",
                    self.args.paced_rate,
                    self.args.paced_seconds,
                    self.config.lanes.batch.max_ops_per_message,
                )
            worker.check_alive()
            return run, paced
        finally:
            worker.stop()

    def measure_threads(self) -> dict[int, list[tuple[Run, Paced]]]:
        counts = list(self.args.threads)
        runs: dict[int, list[tuple[Run, Paced]]] = {n: [] for n in counts}
        for r in range(self.args.runs):
            for n in counts if r % 2 == 0 else counts[::-1]:
                self.console.print(f"[dim]run {r + 1}/{self.args.runs}: {n} threads[/dim]")
                runs[n].append(self.run_threads(n, r))
        return runs


def threads_system(threads: int) -> str:
    return f"service, {threads} threads"


def _ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def report_threads(bench: Bench, runs: dict[int, list[tuple[Run, Paced]]]) -> dict[str, Any]:
    lane = bench.config.lanes.batch
    results = {}
    for threads, pairs in runs.items():
        bursts = [run for run, _ in pairs]
        paced = [p for _, p in pairs]
        pooled = [ms for p in paced for ms in p.latencies_ms]
        rates = [run.per_s for run in bursts]
        results[str(threads)] = {
            "writes_per_s": round(statistics.median(rates), 1),
            "runs_writes_per_s": [round(rate, 1) for rate in rates],
            "permits_busy_share": [round(run.permits["busy_share"], 3) for run in bursts],
            "worker_cpu_ms_per_write": [
                None
                if run.cpu_s.get("worker") is None
                else round(1000 * (run.cpu_s["worker"] or 0.0) / run.writes, 3)
                for run in bursts
            ],
            "paced_p50_ms": [_ms(p.latencies_ms, 0.5) for p in paced],
            "paced_p99_ms": [_ms(p.latencies_ms, 0.99) for p in paced],
            "paced_pooled_p50_ms": _ms(pooled, 0.5),
            "paced_pooled_p99_ms": _ms(pooled, 0.99),
            "paced_messages": [len(p.latencies_ms) for p in paced],
            "paced_behind_s": [round(p.behind_s, 3) for p in paced],
            "errors": sum(run.errors for run in bursts) + sum(p.errors for p in paced),
            "first_error": next(
                (e for e in [r.first_error for r in bursts] + [p.first_error for p in paced] if e),
                None,
            ),
        }
    return {
        "command": " ".join(["python", "bench/batch.py", *sys.argv[1:]]),
        "machine": bench.machine,
        "setup": {
            "writes": bench.args.writes,
            "runs": bench.args.runs,
            "threads": bench.args.threads,
            "paced_rate": bench.args.paced_rate,
            "paced_seconds": bench.args.paced_seconds,
            "payload_bytes": PAYLOAD_BYTES,
            "permits": lane.permits,
            "max_ops_per_message": lane.max_ops_per_message,
            "max_ops_per_transaction": lane.max_ops_per_transaction,
            "max_transaction_ms": lane.max_transaction_ms,
        },
        "results": results,
    }


def print_threads(console: Console, data: dict[str, Any]) -> None:
    console.print(_env.host_line(data["machine"], f"MariaDB {data['machine']['mariadb']}"))
    s = data["setup"]
    console.print(
        f"[bold]setup[/bold]: {s['writes']} writes of {s['payload_bytes']} B in one submit_many, "
        f"then {s['paced_rate']:.0f} writes/s for {s['paced_seconds']:.0f} s in messages of "
        f"{s['max_ops_per_message']}; {s['runs']} runs; batch lane {s['permits']} permits"
    )
    table = Table(title="batch lane by worker threads")
    for column in (
        "threads",
        "writes/s (median)",
        "runs",
        "permits busy",
        "worker CPU ms/write",
        "paced p50 ms (runs)",
        "paced p99 ms (runs)",
        "errors",
    ):
        table.add_column(column)
    for threads, r in data["results"].items():
        table.add_row(
            threads,
            f"{r['writes_per_s']:.0f}",
            ", ".join(f"{x:.0f}" for x in r["runs_writes_per_s"]),
            ", ".join(f"{x:.0%}" for x in r["permits_busy_share"]),
            ", ".join("-" if x is None else f"{x:.3f}" for x in r["worker_cpu_ms_per_write"]),
            ", ".join(str(x) for x in r["paced_p50_ms"]),
            ", ".join(str(x) for x in r["paced_p99_ms"]),
            str(r["errors"]),
        )
    console.print(table)
    for threads, r in data["results"].items():
        if r["errors"]:
            console.print(
                f"[red]{threads} threads: {r['errors']} failed ({r['first_error']})[/red]"
            )


def report(bench: Bench, runs: dict[str, list[Run]]) -> dict[str, Any]:
    def summary(system_runs: list[Run]) -> dict[str, Any]:
        rates = [run.per_s for run in system_runs]
        writes = sum(run.writes for run in system_runs)
        cpu = {}
        for part in CPU_COMPONENTS:
            values = [run.cpu_s.get(part) for run in system_runs]
            cpu[part] = (
                None
                if any(v is None for v in values)
                else round(1000 * sum(v for v in values if v is not None) / writes, 3)
            )
        return {
            "writes_per_s": round(statistics.median(rates), 1),
            "runs_writes_per_s": [round(rate, 1) for rate in rates],
            "errors": sum(run.errors for run in system_runs),
            "first_error": next((r.first_error for r in system_runs if r.first_error), None),
            "cpu_ms_per_write": cpu,
            "permits": [run.permits for run in system_runs if run.permits],
            "transactions": [run.transactions for run in system_runs if run.transactions],
        }

    results = {system: summary(system_runs) for system, system_runs in runs.items()}
    service = runs[SERVICE]
    ratios = {}
    for baseline in (BARE, ROWS, MANY, SINGLES):
        per_run = [s.per_s / b.per_s for s, b in zip(service, runs[baseline], strict=True)]
        ratios[baseline] = {
            "median": round(statistics.median(per_run), 2),
            "runs": [round(x, 2) for x in per_run],
            "target": TARGETS.get(baseline),
            "meets_target": (
                None if baseline not in TARGETS else min(per_run) >= TARGETS[baseline]
            ),
        }
    lane = bench.config.lanes.batch
    return {
        "command": " ".join(["python", "bench/batch.py", *sys.argv[1:]]),
        "machine": bench.machine,
        "setup": {
            "writes": bench.args.writes,
            "bare_writes": bench.args.bare_writes or bench.args.writes,
            "single_writes": bench.args.single_writes,
            "runs": bench.args.runs,
            "payload_bytes": PAYLOAD_BYTES,
            "permits": lane.permits,
            "concurrency": lane.concurrency,
            "max_ops_per_message": lane.max_ops_per_message,
            "max_ops_per_transaction": lane.max_ops_per_transaction,
            "max_transaction_ms": lane.max_transaction_ms,
            "rows_per_transaction": ROWS_PER_TRANSACTION,
        },
        "results": results,
        "service_over": ratios,
        "permits_busy_target": PERMIT_BUSY_TARGET,
    }


def print_report(console: Console, data: dict[str, Any]) -> None:
    console.print(_env.host_line(data["machine"], f"MariaDB {data['machine']['mariadb']}"))
    s = data["setup"]
    console.print(
        f"[bold]setup[/bold]: {s['writes']} writes of {s['payload_bytes']} B per run "
        f"(stock task {s['bare_writes']}), {s['runs']} runs; batch lane {s['permits']} permits, "
        f"{s['max_ops_per_message']} ops/message, {s['max_ops_per_transaction']} ops/transaction"
    )
    table = Table(title="batch writes")
    for column in ("system", "writes/s (median)", "runs", "errors", *CPU_COMPONENTS):
        table.add_column(column if column not in CPU_COMPONENTS else f"CPU {column}\nms/write")
    for system, r in data["results"].items():
        cpu = r["cpu_ms_per_write"]
        table.add_row(
            system,
            f"{r['writes_per_s']:.0f}",
            ", ".join(f"{x:.0f}" for x in r["runs_writes_per_s"]),
            str(r["errors"]),
            *("-" if cpu[p] is None else f"{cpu[p]:.3f}" for p in CPU_COMPONENTS),
        )
    console.print(table)
    ratios = Table(title="service (submit_many) / baseline")
    for column in ("baseline", "median", "runs", "target"):
        ratios.add_column(column)
    for baseline, r in data["service_over"].items():
        target = "-"
        if r["target"] is not None:
            met = "[green]met[/green]" if r["meets_target"] else "[red]missed[/red]"
            target = f">= {r['target']}x: {met}"
        ratios.add_row(
            baseline, f"{r['median']:.2f}x", ", ".join(f"{x:.2f}" for x in r["runs"]), target
        )
    console.print(ratios)
    for p, t in zip(
        data["results"][SERVICE]["permits"], data["results"][SERVICE]["transactions"], strict=True
    ):
        console.print(
            f"permits: {p['busy_share']:.0%} busy (held seconds; the gauge's "
            f"{p['samples']} samples: {p['busy_share_sampled']:.0%}; target >= "
            f"{data['permits_busy_target']:.0%}), at most {p['max_in_use']:.0f} of "
            f"{p['capacity']} in use; transactions: {t['seen']} seen, the longest open "
            f"{t['longest_seen_ms']}-{t['at_most_ms']} ms (bound {t['bound_ms']} ms)"
        )
    for system, r in data["results"].items():
        if r["errors"]:
            console.print(f"[red]{system}: {r['errors']} failed (first: {r['first_error']})[/red]")


def main(argv: list[str] | None = None) -> int:
    bench = Bench.create(parse_args(argv))
    try:
        bench.setup()
        if bench.args.threads:
            data = report_threads(bench, bench.measure_threads())
        else:
            data = report(bench, bench.measure())
    finally:
        bench.cleanup()
    if bench.args.threads:
        print_threads(bench.console, data)
    else:
        print_report(bench.console, data)
    if bench.args.json:
        bench.args.json.write_text(json.dumps(data, indent=2) + "\n")
        bench.console.print(f"wrote {bench.args.json}")
    failed = any(r["errors"] for r in data["results"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
