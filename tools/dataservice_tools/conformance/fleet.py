"""The runner's service: a configuration and keys of its own, one worker per
lane on the broker under test, and what the cases read of it: the records in
the database, the workers' counters and the lists the answers were pushed to."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tempfile
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, create_engine, select

from dataservice.broker.celery import celery_app
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from dataservice.redis.keys import REPLY_PREFIX
from dataservice.security.callers import KeyRing, write_callers_file
from dataservice.store.migrate import upgrade
from dataservice.store.schema import records
from dataservice_tools.conformance.interface import Hello, Key
from dataservice_tools.localservices.probes import free_port
from dataservice_tools.localservices.rabbitmq import delete_virtual_host, virtual_host
from dataservice_tools.localservices.redisserver import PrivateRedis

CALLER = "conformance"
PACED = "conformance-paced"
SCOPES = "conformance-*"
# Each run's virtual host on the local RabbitMQ is this plus the run's id.
VHOST_PREFIX = "dataservice-conformance-"
# The paced caller's rate: one request a second, none saved up.
PACED_RATE_PER_S = 1.0
WORKERS_READY_S = 60.0


def policies() -> dict[str, dict[str, Any]]:
    """The two callers' entries in the run's ``queues.yml``."""
    every = ["read", "write", "delete", "list"]
    lanes = ["interactive", "batch"]
    return {
        CALLER: {"scopes": [SCOPES], "operations": every, "lanes": lanes,
                 "rate_per_s": 10_000, "burst": 10_000, "max_interactive": 1_000},
        PACED: {"scopes": [SCOPES], "operations": ["read"], "lanes": ["interactive"],
                "rate_per_s": PACED_RATE_PER_S, "burst": 1, "max_interactive": 10},
    }  # fmt: skip


class Fleet:
    """Everything a run needs, made by :meth:`start` and gone after :meth:`stop`
    but the workers' logs in ``log_dir``.

    ``broker`` is ``redis`` or ``rabbitmq``. Redis is a private server of the
    run's own, which holds the answers on RabbitMQ too; RabbitMQ is the local
    server, in a virtual host of the run's own. Nothing of anyone else's is
    touched but the database (``settings``'), in a scope of the run's own."""

    def __init__(self, settings: Settings, base_config: Path, broker: str, log_dir: Path) -> None:
        if broker not in ("redis", "rabbitmq"):
            raise ValueError(f"broker must be redis or rabbitmq, not {broker!r}")
        self.broker = broker
        self._base_settings = settings
        self._base_config = base_config
        self.directory = Path(tempfile.mkdtemp(prefix="dataservice-conformance-"))
        self.log_dir = log_dir
        self._redis: PrivateRedis | None = None
        self._vhost: str | None = None
        self._workers: list[WorkerProcess] = []
        self._metrics_ports: list[int] = []
        self._engine: Engine | None = None
        self.settings = settings
        self.config: Config | None = None

    # Setting up -----------------------------------------------------------------------

    def start(self) -> None:
        results_url = self._private_redis()
        broker_url = results_url if self.broker == "redis" else self._virtual_host()
        config_path = self.directory / "queues.yml"
        callers_file = self.directory / "callers.yml"
        self.config = config = self._write_config(config_path)
        write_callers_file(callers_file, {CALLER: f"{CALLER}-1", PACED: f"{PACED}-1"},
                           redis_passwords=False)  # fmt: skip
        self.settings = dataclasses.replace(
            self._base_settings,
            config_path=config_path,
            callers_file=callers_file,
            broker_url=broker_url,
            result_backend_url=results_url,
            redis_url=results_url,
        )
        upgrade(self.settings.database_url, config.database, "head")
        self._start_workers(config)

    def _private_redis(self) -> str:
        self._redis = PrivateRedis(self.directory)
        self._redis.start()
        return self._redis.url_of(0)

    def _virtual_host(self) -> str:
        self._vhost = VHOST_PREFIX + self.directory.name.rsplit("-", 1)[-1]
        return virtual_host(self._vhost, fresh=True)

    def _write_config(self, path: Path) -> Config:
        document = yaml.safe_load(self._base_config.read_text(encoding="utf-8"))
        document["callers"] = {**document.get("callers", {}), **policies()}
        path.write_text(
            "# Written for one conformance run.\n" + yaml.safe_dump(document, sort_keys=False),
            encoding="utf-8",
        )
        return load_config(path)

    def _start_workers(self, config: Config) -> None:
        for lane in LaneName:
            port = free_port()
            self._metrics_ports.append(port)
            log = self.log_dir / f"worker-{lane.value}.log"
            worker = WorkerProcess.for_lane(self.settings, lane, log, "--metrics-port", str(port))
            self._workers.append(worker.start())
        control = celery_app("conformance-control", self.settings, config)
        try:
            wait_answering(control, self._workers, WORKERS_READY_S)
        finally:
            control.close()

    def stop(self) -> None:
        """Stop the workers and remove what the run made; each step is taken
        whatever the one before it raised."""
        try:
            stop_all(self._workers)
            if self._engine is not None:
                self._engine.dispose()
        finally:
            try:
                if self._vhost is not None:
                    delete_virtual_host(self._vhost)
            finally:
                try:
                    if self._redis is not None:
                        # It keeps nothing: killed, it is gone with its port.
                        self._redis.signal(signal.SIGKILL)
                finally:
                    shutil.rmtree(self.directory, ignore_errors=True)

    # What the caller is told ------------------------------------------------------------

    def key(self, caller: str) -> Key:
        signing = KeyRing.load(self._callers_file).signing_key(caller)
        return Key(caller, signing.key_id, signing.secret.value)

    @property
    def _callers_file(self) -> Path:
        assert self.settings.callers_file is not None
        return self.settings.callers_file

    def hello(self) -> Hello:
        assert self.config is not None
        # Each lane's queue is bound to a direct exchange of its own name.
        lanes: dict[str, dict[str, str | int]] = {
            lane.value: {
                "queue": self.config.lanes[lane].queue,
                "exchange": self.config.lanes[lane].queue,
                "default_deadline_ms": self.config.lanes[lane].default_deadline_ms,
                "max_deadline_ms": self.config.lanes[lane].max_deadline_ms,
            }
            for lane in LaneName
        }
        return Hello(
            self.broker,
            self.settings.broker_url,
            self.settings.result_backend_url,
            lanes,
            str(self.settings.config_path),
        )

    def caller_env(self) -> dict[str, str]:
        """The caller program's environment: this process's, without the
        service's own settings (the hello line says where everything is)."""
        return {k: v for k, v in os.environ.items() if not k.startswith("DATASERVICE_")}

    # What the cases read --------------------------------------------------------------

    def records(self, scope: str) -> dict[str, tuple[int, bytes]]:
        """Every record of ``scope`` in the database: object id -> (revision, payload)."""
        if self._engine is None:
            # One for the run: the cases read the database after nearly every call.
            self._engine = create_engine(self.settings.database_url, pool_size=1)
        with self._engine.connect() as connection:
            rows = connection.execute(
                select(records.c.object_id, records.c.revision, records.c.payload).where(
                    records.c.scope == scope
                )
            ).all()
        return {row.object_id: (row.revision, bytes(row.payload)) for row in rows}

    def rejections(self, reason: str) -> int:
        """How many requests the workers refused (or dropped) for ``reason``,
        from their counters."""
        total = 0.0
        for port in self._metrics_ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                text = answer.read().decode("utf-8")
            for family in text_string_to_metric_families(text):
                if family.name != "dataservice_rejections":
                    continue
                total += sum(
                    sample.value
                    for sample in family.samples
                    if sample.name.endswith("_total") and sample.labels.get("reason") == reason
                )
        return int(total)

    @contextmanager
    def reply_pushes(self, caller: str) -> Iterator[Counter[str]]:
        """While inside: each reply channel of ``caller`` the workers pushed an
        answer to, with how many (Redis's ``MONITOR``, on the answers' Redis)."""
        pushes: Counter[str] = Counter()
        prefix = f"{REPLY_PREFIX}{caller}:"
        stop = threading.Event()
        client = redis.Redis.from_url(self.settings.result_backend_url)
        monitor = client.monitor()  # type: ignore[no-untyped-call]
        monitor.__enter__()

        def watch() -> None:
            while not stop.is_set():
                try:
                    command: dict[str, Any] = monitor.next_command()
                except (redis.RedisError, OSError):
                    return
                words = str(command.get("command", "")).split(" ")
                if len(words) > 1 and words[0].upper() == "RPUSH" and words[1].startswith(prefix):
                    pushes[words[1][len(prefix) :]] += 1

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            yield pushes
        finally:
            stop.set()
            # A command for the watcher to see, so that it looks at ``stop``.
            client.echo("conformance: done")
            watcher.join(5.0)
            monitor.__exit__()
            client.close()
