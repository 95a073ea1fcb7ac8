"""Helpers for tests: checks on the database itself rather than the service's
word, and variations of the test configuration."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import yaml
from celery import Celery
from dataservice_tools.localservices import free_port
from dataservice_tools.testkit.sockets import own_local_ports
from dataservice_tools.testkit.waits import eventually
from kombu import Connection, Exchange
from sqlalchemy import Engine, text

from dataservice.broker.celery import CONTENT_TYPE, TASK_NAME, celery_app, celery_settings
from dataservice.client.transport import Transport
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.handler import Database, RequestHandler, build_handler
from dataservice.limits.admission import DEADLINE_HEADER, AdmissionRefused
from dataservice.limits.gate import Gate
from dataservice.limits.permits import LanePermits
from dataservice.observe.metrics import REGISTRY
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from dataservice.proto import pb
from dataservice.security.auth import Authenticator, sign
from dataservice.security.callers import CallerKey, load_keyring
from dataservice.store import RecordStore
from dataservice.store.custody import custody_of


def row_count(engine: Engine, scope: str | None = None) -> int:
    query = "SELECT COUNT(*) FROM records" + (" WHERE scope = :scope" if scope else "")
    with engine.connect() as conn:
        return int(conn.execute(text(query), {"scope": scope}).scalar_one())


def statements_by(engine: Engine, user: str) -> int:
    """Statements the server has run for ``user`` (its user statistics; userstat is on)."""
    query = text(
        "SELECT SELECT_COMMANDS + UPDATE_COMMANDS + OTHER_COMMANDS"
        " FROM information_schema.USER_STATISTICS WHERE USER = :user"
    )
    with engine.connect() as conn:
        return int(conn.execute(query, {"user": user}).scalar() or 0)


def table_checksum(engine: Engine) -> int:
    """A checksum of every row of ``records``: equal before and after means no row changed."""
    with engine.connect() as conn:
        row = conn.execute(text("CHECKSUM TABLE records")).one()
    return int(row[1] or 0)


def running_statements(engine: Engine, user: str) -> set[tuple[int, int]]:
    """(connection id, query id) of every statement ``user`` has running now."""
    query = text(
        "SELECT ID, QUERY_ID FROM information_schema.PROCESSLIST"
        " WHERE USER = :user AND COMMAND = 'Query'"
    )
    with engine.connect() as conn:
        return {(int(r[0]), int(r[1])) for r in conn.execute(query, {"user": user})}


def connection_ids(engine: Engine, user: str) -> set[int]:
    """Every connection ``user`` has open now, busy or idle."""
    query = text("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = :user")
    with engine.connect() as conn:
        return {int(r[0]) for r in conn.execute(query, {"user": user})}


def admin_connection_id(store_engine: Engine, timeout_s: float = 5.0) -> int:
    """The administrative connection of a store engine's process (opened in
    the background after its first pooled connection)."""
    custody = custody_of(store_engine)
    assert custody is not None, "not a store engine"
    # A connection id is never 0: the value is the id once there is one.
    return eventually(lambda: custody.snapshot().admin_connection_id, timeout=timeout_s,
                      message="the administrative connection to open")  # fmt: skip


# The callers the tests sign as. "tests" may do anything; the others exist to
# be refused (a narrow allowlist) or limited (a low rate and in-flight cap).
TEST_CALLERS: dict[str, dict[str, Any]] = {
    "tests": {
        "scopes": ["*"],
        "operations": ["read", "write", "delete", "list"],
        "lanes": ["interactive", "batch"],
        "rate_per_s": 100_000,
        "burst": 10_000,
        "max_interactive": 10_000,
    },
    "tests-narrow": {
        "scopes": ["narrow-*"],
        "operations": ["read", "list"],
        "lanes": ["interactive"],
        "rate_per_s": 100_000,
        "burst": 10_000,
        "max_interactive": 10_000,
    },
    "tests-limited": {
        "scopes": ["*"],
        "operations": ["read", "write", "delete", "list"],
        "lanes": ["interactive", "batch"],
        "rate_per_s": 20,
        "burst": 5,
        "max_interactive": 2,
    },
    "tests-batch-only": {
        "scopes": ["*"],
        "operations": ["read", "write", "delete", "list"],
        "lanes": ["batch"],
        "rate_per_s": 100_000,
        "burst": 10_000,
        "max_interactive": 10_000,
    },
    # Has keys but no policy: authenticated, allowed nothing.
    "tests-stranger": None,
}


def with_test_callers(shipped: Path) -> dict[str, Any]:
    """The shipped queues.yml with the test callers beside the shipped ones,
    and the cache read without a change consumer: most tests run none (the
    change stream's own tests turn the guard on)."""
    data: dict[str, Any] = yaml.safe_load(shipped.read_text(encoding="utf-8"))
    data["callers"].update({name: policy for name, policy in TEST_CALLERS.items() if policy})
    data["changes"]["guard"] = False
    return data


def with_retry(config: Config, **retry: int) -> Config:
    """``config`` with the client's retry policy changed (e.g. ``max_attempts=1``)."""
    policy = config.client.retry.model_copy(update=retry)
    return config.model_copy(update={"client": config.client.model_copy(update={"retry": policy})})


def changed(data: dict[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    """A deep copy of a configuration document with one nested key set."""
    result = copy.deepcopy(data)
    node = result
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return result


def with_changes(
    settings: Settings, path: Path, changes: dict[tuple[str, ...], object]
) -> Settings:
    """``settings`` whose queues.yml, written to ``path``, has each key of
    ``changes`` (a path such as ``("cache", "coalesce")``) set to its value."""
    data: dict[str, Any] = yaml.safe_load(settings.config_path.read_text())
    for key, value in changes.items():
        data = changed(data, key, value)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return dataclasses.replace(settings, config_path=path)


def on_redis(settings: Settings, redis_url: str, config_path: Path | None = None) -> Settings:
    """The same settings with broker, results and cache on another Redis database."""
    return dataclasses.replace(
        settings,
        broker_url=redis_url,
        result_backend_url=redis_url,
        redis_url=redis_url,
        config_path=config_path or settings.config_path,
    )


def caller_key(settings: Settings, caller: str = "tests") -> CallerKey:
    """``caller``'s signing key from the test callers file."""
    return load_keyring(settings.callers_file).signing_key(caller)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def signed(envelope: pb.RequestEnvelope, key: CallerKey) -> bytes:
    """The message body a caller would publish: ``envelope`` (its issue time
    filled in if missing) signed with ``key``."""
    if not envelope.issued_at_unix_ms:
        envelope.issued_at_unix_ms = now_ms()
    return sign(envelope.SerializeToString(), key)


def counter(name: str, **labels: str) -> float:
    """A counter of this process's workers (``dataservice.observe.metrics``), 0 if never touched."""
    return REGISTRY.get_sample_value(f"{name}_total", labels) or 0.0


def handler_for(
    settings: Settings, config: Config, lane: LaneName, store: RecordStore
) -> tuple[RequestHandler, Database, redis.Redis]:
    """A request handler with the real authenticator and gate (on ``settings.redis_url``),
    its way to the database (permits and recent durations), and the gate's client."""
    client = redis.Redis.from_url(settings.redis_url)
    authenticator = Authenticator(load_keyring(settings.callers_file), config, lane)
    lane_config = config.lanes[lane]
    database = Database(LanePermits(lane_config), lane_config.permit_wait_ms)
    gate = Gate(client, config)
    handler = build_handler(config, lane, store, database, authenticator, gate)
    return handler, database, client


class RedisWatch:
    """Every command the Redis server runs (MONITOR) while the watch is open."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client = redis.Redis.from_url(url)
        # MONITOR shows every database; only this one's commands count.
        self._db = int(self._client.get_connection_kwargs().get("db", 0))
        self.commands: list[bytes] = []
        # When the server ran each command (Unix s), in step with ``commands``.
        self.times: list[float] = []
        # The last command the loop waits for: MONITOR reports in order, so
        # everything the server ran before it has been seen.
        self._marker = f"watch-end-{uuid.uuid4().hex}".encode()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(5)

    def _run(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            for command in monitor.listen():
                text = command["command"]
                if int(command.get("db", -1)) == self._db:
                    self.commands.append(text.encode() if isinstance(text, str) else text)
                    self.times.append(float(command["time"]))
                if self._marker in (text.encode() if isinstance(text, str) else text):
                    return

    def close(self) -> list[bytes]:
        with redis.Redis.from_url(self._url) as client:
            client.echo(self._marker)
        self._thread.join(5)
        self._client.close()
        return self.commands


@contextmanager
def worker_process(
    settings: Settings, config: Config, lane: LaneName, log: Path, *extra: str
) -> Iterator[tuple[WorkerProcess, int]]:
    """A ``dataservice worker`` process for ``lane``, ready to serve, and the
    port its counters are served on."""
    port = free_port()
    worker = WorkerProcess.for_lane(settings, lane, log, "--metrics-port", str(port), *extra)
    control = celery_app("test-control", settings, config)
    try:
        wait_answering(control, [worker.start()])
        yield worker, port
    finally:
        control.close()
        worker.stop(15)


@contextmanager
def lane_workers(
    settings: Settings, config: Config, lane: LaneName, log_dir: Path, count: int = 2
) -> Iterator[list[WorkerProcess]]:
    """``count`` worker processes for ``lane``, answering; stopped afterwards,
    with any the test adds to the list meanwhile."""
    workers = [
        WorkerProcess.for_lane(settings, lane, log_dir / f"{lane.value}-{n}.log").start()
        for n in range(count)
    ]
    control = celery_app("test-control", settings, config)
    try:
        wait_answering(control, workers)
        yield workers
    finally:
        control.close()
        stop_all(workers, 15)


def scraped(port: int, name: str, **labels: str) -> float:
    """A counter as a worker process serves it (0 when never touched)."""
    return scraped_sample(port, f"{name}_total", **labels)


def scraped_sample(port: int, sample: str, **labels: str) -> float:
    """One sample (a gauge, a counter's ``_total``) a worker process serves; 0 if absent."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
        text = page.read().decode()
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{sample}{{"):
            metric, value = line.rsplit(" ", 1)
            found = ",".join(sorted(metric[metric.index("{") + 1 : -1].split(",")))
            if found == wanted:
                return float(value)
    return 0.0


def publish_one(transport: Transport, caller: str = "") -> str:
    """Publish one 100-byte message to the interactive lane (deadline in 30 s):
    "queued", or the refusal's reason."""
    try:
        transport.publish(b"x" * 100, request_id=uuid.uuid4().hex, lane=LaneName.INTERACTIVE,
                          deadline_ms=now_ms() + 30_000, caller=caller)  # fmt: skip
    except AdmissionRefused as refusal:
        return str(refusal.reason)
    return "queued"


def publish_concurrently(
    settings: Settings, config: Config, producers: int, each: int
) -> list[str]:
    """``producers`` threads, each with a transport of its own, released together,
    publish ``each`` messages: every outcome (see :func:`publish_one`)."""
    outcomes: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(producers)

    def produce() -> None:
        transport = Transport(settings, config)
        try:
            start.wait()
            for _ in range(each):
                outcome = publish_one(transport)
                with lock:
                    outcomes.append(outcome)
        finally:
            transport.close()

    threads = [threading.Thread(target=produce) for _ in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@contextmanager
def bounded_admission(
    settings: Settings, redis_url: str, directory: Path, **bounds: dict[str, int]
) -> Iterator[tuple[Settings, Config, redis.Redis]]:
    """Settings on ``redis_url`` (flushed before and after) whose named lanes
    have the given admission bounds, the configuration, and a client of that Redis."""
    data: dict[str, Any] = yaml.safe_load(settings.config_path.read_text())
    for lane, admission in bounds.items():
        data["lanes"][lane]["admission"] = admission
        # A message never carries more operations than its queue may hold.
        most = data["lanes"][lane].get("max_ops_per_message", 1)
        data["lanes"][lane]["max_ops_per_message"] = min(most, admission["max_messages"])
    path = directory / "queues.yml"
    path.write_text(yaml.safe_dump(data))
    broker = redis.Redis.from_url(redis_url)
    broker.flushdb()
    try:
        yield on_redis(settings, redis_url, path), load_config(path), broker
    finally:
        broker.flushdb()
        broker.close()


class TaskEvents:
    """Celery events heard on the broker, from a receiver on a thread of its own."""

    def __init__(self, app: Celery) -> None:
        self.seen: list[dict[str, Any]] = []
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self.seen.append})
        self._thread = threading.Thread(
            target=self._receiver.capture, kwargs={"wakeup": False}, daemon=True
        )
        self._thread.start()

    def of(self, task_id: str) -> list[str]:
        return [e["type"] for e in list(self.seen) if e.get("uuid") == task_id]

    def close(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(5)
        self._connection.close()


def connections_of_this_process(client: redis.Redis, opened_since: Collection[int] = ()) -> int:
    """How many connections Redis (``CLIENT LIST``) has from this process's
    sockets, leaving out the ports in ``opened_since`` (and ``client``'s own)."""
    ports = own_local_ports() - set(opened_since)
    return sum(
        1 for entry in client.client_list() if int(str(entry["addr"]).rsplit(":", 1)[1]) in ports
    )


def blocked_clients_of_this_process(
    client: redis.Redis,
    command: str,
    opened_since: Collection[int] = (),
) -> int:
    """How many of this process's connections Redis sees in ``command``
    (leaving out the ports in ``opened_since``: connections that were already
    open, such as other tests' leftovers)."""
    ports = own_local_ports() - set(opened_since)
    return sum(
        1
        for entry in client.client_list()
        if entry.get("cmd") == command and int(str(entry["addr"]).rsplit(":", 1)[1]) in ports
    )


class RawPublisher:
    """Publishes task messages with kombu alone: no client, no signing, no checks."""

    def __init__(self, settings: Settings, config: Config) -> None:
        options = celery_settings(settings, config)
        self._connection = Connection(
            settings.broker_url,
            transport=options["broker_transport"],
            transport_options=options["broker_transport_options"],
        )
        self._queue = config.lanes.interactive.queue
        self._producer = self._connection.Producer()

    def publish(self, body: bytes, request_id: str, deadline_ms: int) -> None:
        self._producer.publish(
            body,
            exchange=Exchange(self._queue, type="direct"),
            routing_key=self._queue,
            content_type=CONTENT_TYPE,
            content_encoding="binary",
            headers={
                "lang": "py",
                "task": TASK_NAME,
                "id": request_id,
                "root_id": request_id,
                "parent_id": None,
                "group": None,
                "retries": 0,
                "eta": None,
                "expires": None,
                DEADLINE_HEADER: deadline_ms,
            },
        )

    def close(self) -> None:
        self._connection.release()


class StallingProxy:
    """A TCP forwarder to ``127.0.0.1:<port>`` that can stop forwarding, both
    ways, without closing anything: to its clients, a server that stalled."""

    def __init__(self, port: int) -> None:
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                self._flowing.wait()
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@contextmanager
def with_publish_interface(url: str, config: Config) -> Iterator[redis.Redis]:
    """A client of the Redis database at ``url``, emptied, with the publish
    interface and ``config``'s lanes installed as a worker installs them;
    emptied again on exit."""
    from dataservice_tools.localservices import redis_reachable

    from dataservice.broker import library
    from tests.conftest import require

    require(redis_reachable(url), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(url)
    client.flushdb()
    library.install(client, config)
    try:
        yield client
    finally:
        client.flushdb()
        client.close()
