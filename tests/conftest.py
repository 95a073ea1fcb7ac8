"""Shared fixtures: the real Redis and MariaDB, Celery's own worker fixtures
(``celery.contrib.pytest``, enabled in pyproject.toml) and subprocess pools.

Tests use Redis databases 14 and 15 and the MariaDB database
``dataservice_test``, so a service running on the defaults (database 0,
``dataservice``) is untouched. The in-process worker serves database 15; the
worker processes serve database 14, so a test against them is answered by them
alone. The cache's multi-replica tests use database 9 and a MariaDB of their
own (``counting_database``), which counts the replicas' reads itself.
The change stream's tests use a MariaDB with a binlog (``binlog_database``),
never the one ``make services`` may start: a test reads no ``.state/`` file.
A test that needs a service that is down fails when ``CI`` is set, and is
skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from dataservice_tools.localservices import (
    PrivateRedis,
    TemporaryBinlogMariaDB,
    mysql_reachable,
    redis_reachable,
)
from dataservice_tools.testkit.counting_database import CountingDatabase
from sqlalchemy import Engine, create_engine, text

from dataservice import Client
from dataservice.broker.celery import celery_settings
from dataservice.changes.user import changes_url, create_changes_user
from dataservice.client import throttle
from dataservice.client.pacer import PACER
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ServiceSetupError
from dataservice.ops.supervisor import Supervisor
from dataservice.security.callers import write_callers_file
from dataservice.store.migrate import upgrade
from dataservice.worker.app import LaneRuntime, register_task
from tests.harness.binlog import BinlogDatabase
from tests.harness.clients import KINDS, AnyClient, ClientKind, make_client
from tests.harness.support import TEST_CALLERS, RawPublisher, on_redis, with_test_callers


@pytest.fixture(autouse=True)
def fresh_throttles() -> None:
    """A caller's throttle is shared by its clients in the process: one test's
    overload must not hold back the next test's first requests (nor its
    pace: the pacer is the process's too)."""
    throttle._shared.clear()
    PACER.clear()


TEST_REDIS_URL = "redis://127.0.0.1:6379/15"
PROCESS_REDIS_URL = "redis://127.0.0.1:6379/14"
# The cache's multi-replica tests: broker, results and (unless a test says otherwise) cache.
REPLICAS_REDIS_URL = "redis://127.0.0.1:6379/9"
TEST_DATABASE = "dataservice_test"
# The service connects as a user of its own, so the server's per-user
# statistics count exactly the statements the service ran.
SERVICE_USER = "ds_test"
TEST_DATABASE_URL = f"mysql+mysqldb://{SERVICE_USER}:ds-test-pw@127.0.0.1:3306/{TEST_DATABASE}"
ROOT_URL = "mysql+mysqldb://root@127.0.0.1:3306/"
CHANGES_USER = "ds_changes"
CHANGES_PASSWORD = "ds-changes-pw"
SHIPPED_CONFIG = Path(__file__).resolve().parents[1] / "queues.yml"


def require(available: bool, what: str) -> None:
    if available:
        return
    message = f"{what} is not reachable"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def started_binlog_mariadb() -> TemporaryBinlogMariaDB:
    """A private MariaDB with a ROW binlog, started (or the test fails under
    CI, and is skipped otherwise)."""
    server = TemporaryBinlogMariaDB()
    try:
        server.start()
    except ServiceSetupError as exc:
        server.stop()
        require(False, f"a private MariaDB with a binlog ({exc})")
    return server


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The shipped configuration with the test callers, and fresh keys for them."""
    directory = tmp_path_factory.mktemp("settings")
    config_path = directory / "queues.yml"
    document = with_test_callers(SHIPPED_CONFIG)
    config_path.write_text(yaml.safe_dump(document, sort_keys=False))
    callers_file = directory / "callers.yml"
    # Every configured caller has a key, and so does one that is configured nowhere.
    callers = dict.fromkeys([*document["callers"], *TEST_CALLERS])
    write_callers_file(callers_file, {name: f"{name}-1" for name in callers})
    return Settings(
        config_path=config_path,
        broker_url=TEST_REDIS_URL,
        result_backend_url=TEST_REDIS_URL,
        redis_url=TEST_REDIS_URL,
        database_url=TEST_DATABASE_URL,
        callers_file=callers_file,
    )


@pytest.fixture(scope="session")
def config(settings: Settings) -> Config:
    return settings.load()


@pytest.fixture(scope="session")
def redis_client(settings: Settings) -> Iterator[redis.Redis]:
    require(redis_reachable(settings.broker_url), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(settings.broker_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="session")
def database(settings: Settings, config: Config) -> Iterator[Engine]:
    """A freshly migrated test database, and a root engine for the tests' own checks."""
    require(mysql_reachable("127.0.0.1", 3306), "MariaDB at 127.0.0.1:3306")
    engine = create_engine(ROOT_URL + TEST_DATABASE, isolation_level="AUTOCOMMIT")
    server = create_engine(ROOT_URL, isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {TEST_DATABASE}"))
        conn.execute(text(f"CREATE DATABASE {TEST_DATABASE}"))
        for host in ("localhost", "127.0.0.1"):
            conn.execute(text(f"DROP USER IF EXISTS '{SERVICE_USER}'@'{host}'"))
            conn.execute(text(f"CREATE USER '{SERVICE_USER}'@'{host}' IDENTIFIED BY 'ds-test-pw'"))
            conn.execute(text(f"GRANT ALL ON {TEST_DATABASE}.* TO '{SERVICE_USER}'@'{host}'"))
        conn.execute(text("SET GLOBAL userstat = 1"))
    server.dispose()
    upgrade(settings.database_url, config.database)
    yield engine
    engine.dispose()


@pytest.fixture
def scope() -> str:
    """A scope of the test's own, so tests never see each other's records."""
    return f"t-{uuid.uuid4().hex[:12]}"


# Celery's own fixtures, pointed at the real Redis and serving the interactive lane.


@pytest.fixture(scope="session")
def celery_config(settings: Settings, config: Config) -> dict[str, Any]:
    return celery_settings(settings, config)


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    return "threads"


@pytest.fixture(scope="session")
def celery_worker_parameters(config: Config) -> dict[str, Any]:
    lane = config.lanes.interactive
    return {
        "queues": [lane.queue],
        "concurrency": lane.concurrency,
        "prefetch_multiplier": 1,
        "perform_ping_check": False,
        "hostname": f"interactive-{os.getpid()}@tests",
    }


@pytest.fixture(scope="session")
def interactive_worker(
    request: pytest.FixtureRequest,
    celery_session_app: Any,
    settings: Settings,
    config: Config,
    database: Engine,
    redis_client: redis.Redis,
) -> Iterator[Any]:
    """An in-process worker serving the interactive lane with the real handler."""
    runtime = LaneRuntime(settings, config, LaneName.INTERACTIVE)
    register_task(celery_session_app, runtime)
    yield request.getfixturevalue("celery_session_worker")
    runtime.close()


@pytest.fixture
def client(settings: Settings, config: Config) -> Iterator[Client]:
    with Client("tests", settings, config) as c:
        yield c


@pytest.fixture
def process_client(process_settings: Settings, config: Config) -> Iterator[Client]:
    """A client whose requests only the worker processes serve."""
    with Client("tests", process_settings, config) as c:
        yield c


@pytest.fixture(params=KINDS)
def client_kind(request: pytest.FixtureRequest) -> ClientKind:
    """Each client in turn: a test that takes it runs once with each."""
    kind: ClientKind = request.param
    return kind


@pytest.fixture
def any_client(client_kind: ClientKind, settings: Settings, config: Config) -> Iterator[AnyClient]:
    """The sync client, then the asyncio one (tests/harness/clients.py)."""
    with make_client(client_kind, "tests", settings, config) as c:
        yield c


@pytest.fixture
def any_process_client(
    client_kind: ClientKind, process_settings: Settings, config: Config
) -> Iterator[AnyClient]:
    """As ``process_client``, with each client in turn."""
    with make_client(client_kind, "tests", process_settings, config) as c:
        yield c


@pytest.fixture
def transport(settings: Settings, config: Config) -> Iterator[Transport]:
    """The client's wire, for tests that publish hand-made (or broken) envelopes."""
    t = Transport(settings, config)
    yield t
    t.close()


@pytest.fixture(scope="session")
def process_settings(settings: Settings) -> Settings:
    return on_redis(settings, PROCESS_REDIS_URL)


@pytest.fixture(scope="module")
def worker_processes(
    process_settings: Settings,
    config: Config,
    database: Engine,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Supervisor]:
    """Both lanes served by real worker processes (``dataservice worker``)."""
    require(redis_reachable(PROCESS_REDIS_URL), "Redis at 127.0.0.1:6379")
    with supervised(process_settings, config, tmp_path_factory.mktemp("worker-logs")) as started:
        yield started


@contextmanager
def supervised(settings: Settings, config: Config, log_dir: Path) -> Iterator[Supervisor]:
    """Both lanes' worker processes on ``settings``, answering, with the
    result backend's Redis flushed first; stopped afterwards."""
    redis.Redis.from_url(settings.result_backend_url).flushdb()
    supervisor = Supervisor(settings, config, log_dir)
    supervisor.start()
    try:
        supervisor.wait_ready()
        yield supervisor
    finally:
        supervisor.stop()


@pytest.fixture(scope="session")
def counting_database(config: Config) -> Iterator[CountingDatabase]:
    """A MariaDB of the tests' own, started once, whose general log counts
    every statement the worker replicas send
    (:mod:`dataservice_tools.testkit.counting_database`)."""
    database = CountingDatabase(config.database)
    try:
        database.start()
    except ServiceSetupError as exc:
        database.stop()
        require(False, f"a private MariaDB ({exc})")
    try:
        yield database
    finally:
        database.stop()


@pytest.fixture
def replica_settings(settings: Settings, counting_database: CountingDatabase) -> Iterator[Settings]:
    """Settings for worker replicas: broker, results and cache on Redis db 9
    (flushed before and after), records in the counting database."""
    require(redis_reachable(REPLICAS_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(REPLICAS_REDIS_URL)
    client.flushdb()
    counting_database.forget()
    try:
        yield counting_database.on(on_redis(settings, REPLICAS_REDIS_URL))
    finally:
        client.flushdb()
        client.close()


@pytest.fixture(scope="session")
def binlog_database(config: Config) -> Iterator[BinlogDatabase]:
    """A private MariaDB with a ROW binlog, started once, migrated as ``dataservice
    db upgrade`` does, with the consumer's user as ``dataservice db changes-user``
    creates it. A test that stops it starts it again."""
    server = started_binlog_mariadb()
    try:
        admin_url = server.url(TEST_DATABASE)
        upgrade(admin_url, config.database)
        create_changes_user(admin_url, CHANGES_USER, CHANGES_PASSWORD, TEST_DATABASE)
        consumer_url = changes_url(admin_url, CHANGES_USER, CHANGES_PASSWORD)
        yield BinlogDatabase(server, TEST_DATABASE, admin_url, consumer_url)
    finally:
        server.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of the test's own, on a free port; gone after the test."""
    require(shutil.which("redis-server") is not None, "redis-server")
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.signal(signal.SIGCONT)
        server.signal(signal.SIGKILL)


@pytest.fixture(scope="module")
def raw(settings: Settings, config: Config) -> Iterator[RawPublisher]:
    """Task messages published with kombu alone, as a caller in another language would."""
    publisher = RawPublisher(settings, config)
    yield publisher
    publisher.close()
