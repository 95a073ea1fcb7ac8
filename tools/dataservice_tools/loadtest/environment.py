"""What a load run sets up: its database and MariaDB user, its Redis db, the
scenario's configuration file, and the worker replica processes.

Each system under test connects as a MariaDB user of its own, so the rows of
``information_schema.PROCESSLIST`` with that user are exactly its connections.
Only the harness's own Redis db numbers are flushed and only its own databases
are dropped.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import redis
import yaml
from celery import Celery
from sqlalchemy import create_engine, func, insert, text
from sqlalchemy.engine import URL, make_url

from dataservice.config.budget import process_share
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ServiceSetupError
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from dataservice.security.callers import write_callers_file

ROOT_URL = "mysql+mysqldb://root@127.0.0.1:3306/"
REDIS_BASE = "redis://127.0.0.1:6379"
SCOPE = "load"
# Where the target's database user connects from, on this machine.
LOCAL_HOSTS = ("localhost", "127.0.0.1")
PAYLOAD_BYTES = 1024
# What the generator writes: PAYLOAD_BYTES of every byte value in turn.
PAYLOAD = bytes(range(256)) * (PAYLOAD_BYTES // 256)
# A process that exited may still show in PROCESSLIST for a moment while the
# server notices the closed socket; its share is counted this much longer.
EXIT_GRACE_S = 0.5
# A replica started mid-run is not expected live until its alive file first
# appears or this long has passed (an orchestrator's start period).
STARTUP_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Target:
    """One system under test: its MariaDB user, database and Redis db."""

    system: str
    user: str
    password: str
    database: str
    redis_db: int
    # The Redis server (a fault run's own, or the shared one).
    redis_base: str = REDIS_BASE

    @property
    def redis_url(self) -> str:
        return f"{self.redis_base}/{self.redis_db}"

    def database_url(self, root_url: str = ROOT_URL) -> str:
        root = make_url(root_url)
        url = URL.create(
            "mysql+mysqldb",
            username=self.user,
            password=self.password,
            host=root.host,
            port=root.port,
            database=self.database,
        )
        return url.render_as_string(hide_password=False)


SERVICE = Target("service", "ds_load", "ds-load-pw", "dataservice_load", 6)
NAIVE = Target("naive", "ds_naive", "ds-naive-pw", "dataservice_naive", 7)
TARGETS = {t.system: t for t in (SERVICE, NAIVE)}


def flush_redis(url: str) -> None:
    """FLUSHDB on exactly the db number in ``url`` (never db 0)."""
    client = redis.Redis.from_url(url)
    try:
        if client.get_connection_kwargs().get("db", 0) == 0:
            raise ServiceSetupError("refusing to flush Redis db 0")
        client.flushdb()
    finally:
        client.close()


def prepare_database(
    target: Target,
    config: Config,
    records: int,
    root_url: str,
    hosts: tuple[str, ...] = LOCAL_HOSTS,
) -> list[str]:
    """Recreate the target's database and its user (connecting from ``hosts``),
    migrate it, seed it; the seeded ids."""
    from dataservice.store.migrate import upgrade

    if not target.database.startswith("dataservice_") or target.database == "dataservice_test":
        raise ServiceSetupError(f"refusing to recreate database {target.database!r}")
    server = create_engine(root_url, isolation_level="AUTOCOMMIT")
    try:
        with server.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{target.database}`"))
            conn.execute(text(f"CREATE DATABASE `{target.database}` CHARACTER SET utf8mb4"))
            for host in hosts:
                conn.execute(text(f"DROP USER IF EXISTS '{target.user}'@'{host}'"))
                conn.execute(
                    text(f"CREATE USER '{target.user}'@'{host}' IDENTIFIED BY :pw"),
                    {"pw": target.password},
                )
                conn.execute(
                    text(f"GRANT ALL ON `{target.database}`.* TO '{target.user}'@'{host}'")
                )
            # Per-user connection totals (USER_STATISTICS) count new connections exactly.
            # (Never flushed: other users' figures belong to others; the sampler takes deltas.)
            conn.execute(text("SET GLOBAL userstat = 1"))
    finally:
        server.dispose()
    upgrade(target.database_url(root_url), config.database)
    return seed_records(direct_url(root_url, target.database), SCOPE, records, PAYLOAD_BYTES)


def direct_url(root_url: str, database: str) -> str:
    """The server's admin on ``database``: writes that go around the service."""
    return make_url(root_url).set(database=database).render_as_string(hide_password=False)


def seed_records(url: str, scope: str, count: int, payload_bytes: int) -> list[str]:
    """Insert ``count`` records with random payloads of ``payload_bytes``; their ids."""
    from dataservice.store.schema import records as records_table

    ids = [f"obj-{n:06d}" for n in range(count)]
    now = func.utc_timestamp(6)
    seeder = create_engine(url)
    try:
        with seeder.begin() as conn:
            for start in range(0, count, 500):
                rows = [
                    {"scope": scope, "object_id": i, "revision": 1,
                     "payload": os.urandom(payload_bytes)}
                    for i in ids[start : start + 500]
                ]  # fmt: skip
                conn.execute(insert(records_table).values(created_at=now, updated_at=now), rows)
    finally:
        seeder.dispose()
    return ids


def scenario_config(
    base: Path,
    out_dir: Path,
    injected_delay_ms: int,
    delay_table: str | None = None,
    coalesce: bool = True,
) -> tuple[Path, Config]:
    """A copy of ``base`` with the scenario's database delay, validated; with
    ``delay_table`` the delay is read from that table instead (and can change);
    ``coalesce`` false: each cache miss reads the database itself."""
    data = yaml.safe_load(base.read_text(encoding="utf-8"))
    data["cache"]["coalesce"] = coalesce
    data["database"]["injected_delay_ms"] = 0 if delay_table else injected_delay_ms
    data["database"]["injected_delay_table"] = delay_table
    # A change consumer of its own: a replica id another consumer on the
    # same server (`make run`'s) holds would make the server drop one of them.
    data.setdefault("changes", {})["server_id"] = random.randrange(1 << 20, 1 << 30)
    path = out_dir / "queues.yml"
    path.write_text(
        "# Written by dataservice loadtest for one run.\n" + yaml.safe_dump(data, sort_keys=False),
        encoding="utf-8",
    )
    return path, load_config(path)


def run_callers_file(out_dir: Path, *callers: str) -> Path:
    """A callers file for one run (mode 600, a fresh key per caller): the replicas
    verify and the generator signs with it. Each caller needs a policy in the
    run's config."""
    path = out_dir / "callers.yml"
    write_callers_file(path, {caller: f"{caller}-1" for caller in callers})
    return path


def service_settings(
    target: Target,
    config_path: Path,
    root_url: str,
    callers_file: Path,
    broker_url: str | None = None,
) -> Settings:
    """The run's settings: everything on the target's Redis db but the broker
    when ``broker_url`` names RabbitMQ."""
    return Settings(
        config_path=config_path,
        broker_url=broker_url or target.redis_url,
        result_backend_url=target.redis_url,
        redis_url=target.redis_url,
        database_url=target.database_url(root_url),
        callers_file=callers_file,
    )


@dataclass
class Replica:
    lane: LaneName
    generation: int
    worker: WorkerProcess
    started_at: float = field(default_factory=time.monotonic)
    stopping: bool = False  # asked to stop: no longer expected live
    ended_at: float | None = None


Spawn = Callable[[LaneName, Path], WorkerProcess]  # (lane, log file) -> a worker to start


def alive_path(alive_dir: Path, log: Path) -> Path:
    """A replica's alive file, named as its log is: ``<alive_dir>/<replica>.alive``."""
    return alive_dir / f"{log.stem}.alive"


@dataclass
class Fleet:
    """Worker replica processes, by lane and generation, and the budget share they hold."""

    spawn: Spawn
    log_dir: Path
    config: Config
    # Each lane's worker threads per process, which size its pool.
    threads: Mapping[LaneName, int]
    # Where the replicas' alive files are (None: they have none).
    alive_dir: Path | None = None
    # Whether each process keeps an administrative connection (the service's
    # do, for custody; the naive baseline's do not, and are held to the rest).
    administrative: bool = True
    replicas: list[Replica] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, per_lane: int, generation: int) -> None:
        for lane in LaneName:
            for n in range(per_lane):
                log = self.log_dir / f"{lane.value}-g{generation}-{n}.log"
                worker = self.spawn(lane, log).start()
                with self._lock:
                    self.replicas.append(Replica(lane, generation, worker))

    def wait_ready(self, control: Celery, timeout: float = 60.0) -> float:
        """Wait until every replica answers a control ping; seconds it took."""
        return wait_answering(control, self._workers(), timeout)

    def terminate(self, generation: int) -> None:
        """SIGTERM: Celery's warm shutdown (in-flight requests finish first)."""
        for replica in self._of(generation):
            replica.stopping = True
            replica.worker.terminate()

    def ready(self, generation: int) -> bool:
        """Whether ``generation`` has replicas and each has said its loop turns
        (its alive file is there; without alive files, each has started)."""
        alive, replicas = self.alive_dir, self._of(generation)
        return bool(replicas) and all(
            alive is None or alive_path(alive, r.worker.log_path).exists() for r in replicas
        )

    def _of(self, generation: int) -> list[Replica]:
        with self._lock:
            return [r for r in self.replicas if r.generation == generation]

    def _workers(self) -> list[WorkerProcess]:
        with self._lock:
            return [r.worker for r in self.replicas]

    def refresh(self) -> None:
        now = time.monotonic()
        with self._lock:
            for replica in self.replicas:
                if replica.ended_at is None and not replica.worker.running:
                    replica.ended_at = now

    def holding(self, now: float) -> list[Replica]:
        """Replicas that may hold database connections at ``now`` (a moment
        ago, too: the sampler's samples are read after they are taken)."""
        self.refresh()
        with self._lock:
            return [
                r
                for r in self.replicas
                if r.started_at <= now and (r.ended_at is None or now - r.ended_at < EXIT_GRACE_S)
            ]

    def share(self, now: float) -> tuple[int, int]:
        """(active statements, connections) the live replicas may hold by the
        budget: each process's permits and pool, and its administrative
        statement and connection, as ``check-config`` counts them (for
        processes that keep one)."""
        shares = [
            process_share(self.config.lanes[r.lane], self.threads[r.lane])
            for r in self.holding(now)
        ]
        if not self.administrative:
            return sum(s.permits for s in shares), sum(s.pool for s in shares)
        return sum(s.active for s in shares), sum(s.connections for s in shares)

    def alive_files(self, now: float) -> list[Path]:
        """The alive files that ought to be fresh at ``now``: every replica not
        asked to stop, once its file has appeared or its start period is over."""
        if self.alive_dir is None:
            return []
        with self._lock:
            replicas = [r for r in self.replicas if not r.stopping]
        paths = [(r, alive_path(self.alive_dir, r.worker.log_path)) for r in replicas]
        return [path for r, path in paths if now - r.started_at >= STARTUP_GRACE_S or path.exists()]

    def stop(self, timeout: float = 15.0) -> None:
        stop_all(self._workers(), timeout)
