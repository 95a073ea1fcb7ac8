"""On a Unix socket (``unix://``), every Redis client and pool of the service
works, a bounded call keeps to its bound, and the broker still runs the
service's transport: admission, caller pacing, the deferred record.

The Redis here is private and listens on a Unix socket only (no TCP port):
whatever reaches it came through the socket."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from dataservice_tools.localservices import (
    PrivateRedis,
    down,
    mysql_reachable,
    redis_reachable,
    up,
)
from dataservice_tools.localservices.lifecycle import unix_redis_url
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import Engine

from dataservice import AsyncClient, Client, DeadlineExceeded, ReadMode, Unavailable
from dataservice.broker.celery import celery_app, celery_settings
from dataservice.broker.redis import RedisBroker
from dataservice.client.transport import Transport
from dataservice.compat import kombu as kombu_compat
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ConfigError
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from dataservice.redis import bounded, endpoints, where
from dataservice.redis.bounded import (
    QUIET,
    BoundedConnection,
    BoundedPool,
    BoundedSSLConnection,
    BoundedUnixConnection,
    connection_class,
    within,
)
from dataservice.redis.packing import (
    AsyncPackedConnection,
    AsyncPackedUnixConnection,
    PackedConnection,
    PackedUnixConnection,
    async_packed_connection_class,
    packed_connection_class,
)
from tests.conftest import ROOT_URL, require
from tests.harness.support import bounded_admission, on_redis, publish_concurrently, publish_one

MAX_MESSAGES = 20
# What a bounded call may take past its bound here: the bound's own slack,
# and its thread's scheduling on a loaded machine.
LATE_S = bounded.SLACK_S + 0.2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    """redis-server listening on a Unix socket, mode 700, and no TCP port."""
    require(shutil.which("redis-server") is not None, "redis-server")
    started = PrivateRedis(tmp_path_factory.mktemp("unix-redis"), unix_socket=True)
    started.start()
    try:
        yield started
    finally:
        started.signal(signal.SIGCONT)
        started.signal(signal.SIGKILL)


@pytest.fixture
def url(server: PrivateRedis) -> Iterator[str]:
    """Database 1 of the server, flushed after the test."""
    yield server.url_of(1)
    with redis.Redis.from_url(server.url_of(1)) as client:
        client.flushdb()


def test_the_server_listens_on_its_socket_alone(server: PrivateRedis, url: str) -> None:
    assert server.socket is not None
    with redis.Redis.from_url(url) as client:
        assert client.config_get("port") == {"port": "0"}
        assert client.config_get("unixsocket") == {"unixsocket": str(server.socket)}
        assert client.config_get("unixsocketperm") == {"unixsocketperm": "700"}
    assert where(url) == str(server.socket)


@pytest.mark.parametrize(
    ("given", "made"),
    [
        (None, redis.UnixDomainSocketConnection),
        (redis.Connection, redis.UnixDomainSocketConnection),
        (PackedConnection, PackedUnixConnection),
        (BoundedConnection, BoundedUnixConnection),
        (PackedUnixConnection, PackedUnixConnection),
    ],
)
def test_a_client_takes_its_classs_unix_socket_kind_and_round_trips(
    url: str, given: Any, made: type[Any]
) -> None:
    client = endpoints.client(url, given, **QUIET)
    try:
        assert client.set("ds:unix", "here")
        assert client.get("ds:unix") == b"here"
        connection = client.connection_pool.get_connection()
        client.connection_pool.release(connection)
        assert type(connection) is made
    finally:
        client.close()


def test_kombus_own_unix_socket_form_is_refused() -> None:
    """``redis+socket://`` would take kombu's stock transport, past admission."""
    with pytest.raises(ConfigError, match="DATASERVICE_BROKER_URL must be"):
        Settings.from_env({"DATASERVICE_BROKER_URL": "redis+socket:///run/redis/redis.sock"})


def test_localservices_up_starts_a_redis_on_a_unix_urls_socket(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> None:
    require(shutil.which("redis-server") is not None, "redis-server")
    require(mysql_reachable("127.0.0.1", 3306), "MariaDB at 127.0.0.1:3306")
    state = tmp_path_factory.mktemp("up")
    socket = state / "own.sock"
    url = unix_redis_url(socket, db=3)
    # As root, who needs no password, up finds the database answering and starts none.
    on_socket = dataclasses.replace(on_redis(settings, url), database_url=ROOT_URL + "dataservice")
    try:
        assert up(on_socket, state) == [f"redis on {socket}"]
        assert redis_reachable(url)
    finally:
        down(state)
    assert not redis_reachable(url)


def test_the_url_helpers_give_the_unix_socket_kinds(url: str) -> None:
    assert packed_connection_class(url) is PackedUnixConnection
    assert async_packed_connection_class(url) is AsyncPackedUnixConnection
    assert connection_class(url) is BoundedUnixConnection
    # A TLS class has no Unix-socket kind; a Unix-socket class is for unix:// alone.
    with pytest.raises(TypeError, match="no Unix-socket kind"):
        endpoints.client(url, BoundedSSLConnection)
    with pytest.raises(TypeError, match="is for a Unix socket"):
        endpoints.client("redis://127.0.0.1:6379/0", BoundedUnixConnection)


@pytest.mark.parametrize("given", [None, AsyncPackedConnection, AsyncPackedUnixConnection])
def test_an_asyncio_client_and_pool_round_trip(url: str, given: Any) -> None:
    async def run() -> tuple[bytes | None, type[Any], type[Any]]:
        client = endpoints.async_client(url, given, **QUIET)
        pool = endpoints.async_pool(url, redis.asyncio.BlockingConnectionPool, given, **QUIET)
        pooled = redis.asyncio.Redis(connection_pool=pool)
        try:
            await client.set("ds:unix-async", "here")
            value: bytes | None = await pooled.get("ds:unix-async")
            return value, client.connection_pool.connection_class, pool.connection_class
        finally:
            await client.aclose()
            await pooled.aclose()
            await pool.disconnect()

    value, made, pooled = asyncio.run(run())
    assert value == b"here"
    expected = (
        redis.asyncio.UnixDomainSocketConnection if given is None else AsyncPackedUnixConnection
    )
    assert made is pooled is expected


def test_a_bounded_call_keeps_to_its_bound_on_a_unix_socket(server: PrivateRedis, url: str) -> None:
    """On an open connection (a blocking read that would wait 2 s) and on a
    new one to a stopped server (which takes it, and never answers its
    SELECT): each ends with its bound, not with the pool's 5 s socket timeout."""
    pool = endpoints.pool(url, BoundedPool, BoundedConnection, socket_timeout=5, **QUIET)
    assert pool.connection_class is BoundedUnixConnection
    # Not retried, as the service's bounded clients: each attempt would take its own bound.
    client = redis.Redis(connection_pool=pool, retry=Retry(NoBackoff(), 0))
    try:
        assert client.ping()
        bound = 0.3
        with within(bound):
            started = time.monotonic()
            with pytest.raises(redis.TimeoutError):
                client.blpop(["ds:unix-never"], timeout=2)
        took = time.monotonic() - started
        assert took <= bound + LATE_S, took
        pool.disconnect()
        server.signal(signal.SIGSTOP)
        try:
            with within(bound):
                started = time.monotonic()
                with pytest.raises(redis.TimeoutError):
                    client.ping()
            took = time.monotonic() - started
        finally:
            server.signal(signal.SIGCONT)
        assert took <= bound + LATE_S, took
        assert client.ping()
    finally:
        client.close()


# The broker on the socket: the service's transport, admission first.


@pytest.fixture
def admission(
    settings: Settings, url: str, tmp_path: Path
) -> Iterator[tuple[Settings, Config, redis.Redis]]:
    """Settings on the Unix socket (nothing consumes it) with a small interactive bound."""
    with bounded_admission(
        settings, url, tmp_path, interactive={"max_messages": MAX_MESSAGES, "max_bytes": 1 << 24}
    ) as bounded_settings:
        yield bounded_settings


def test_the_broker_on_a_unix_socket_is_the_services_transport(
    admission: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, _ = admission
    found = celery_settings(settings, config)
    assert found["broker_transport"] == "dataservice.broker.redis:UnixTransport"
    assert found["broker_url"] == settings.broker_url
    app = celery_app("unix-caller", settings, config, caller=True)
    try:
        assert app.conf.broker_transport == "dataservice.broker.redis:CallerUnixTransport"
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            assert channel.pool.connection_class is BoundedUnixConnection
            assert isinstance(channel.qos, kombu_compat.RedisQoS)
    finally:
        app.close()
    assert RedisBroker(settings).unreachable(1.0) == ""


def test_on_a_unix_socket_concurrent_producers_never_overshoot_the_queue_bound(
    admission: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = admission
    producers, each = 8, 10
    outcomes = publish_concurrently(settings, config, producers, each)
    # Nothing consumes this queue, so its length now is the most it ever held.
    assert broker.llen(config.lanes.interactive.queue) == MAX_MESSAGES
    assert outcomes.count("queued") == MAX_MESSAGES
    assert outcomes.count("queue_full") == producers * each - MAX_MESSAGES


def test_on_a_stopped_unix_socket_broker_a_call_ends_by_its_deadline(
    server: PrivateRedis, admission: tuple[Settings, Config, redis.Redis]
) -> None:
    """The caller's publish and its wait for the answer keep to the call's
    timeout, where the broker's 2 s connect timeout or the reply channel's
    read would outlast it."""
    settings, config, _ = admission
    timeout_s = 0.5
    with Client("tests", settings, config) as client:
        server.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises((Unavailable, DeadlineExceeded)):
                client.read("t", "x", mode=ReadMode.PRIMARY, timeout=timeout_s)
            took = time.monotonic() - started
        finally:
            server.signal(signal.SIGCONT)
    assert took <= timeout_s + LATE_S, took


def test_on_a_unix_socket_a_caller_over_its_rate_is_refused_before_the_queue(
    admission: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = admission
    burst = config.callers["tests-limited"].burst
    transport = Transport(settings, config)
    try:
        outcomes = [publish_one(transport, caller="tests-limited") for _ in range(burst + 3)]
    finally:
        transport.close()
    assert outcomes == ["queued"] * burst + ["rate_limited"] * 3
    assert broker.llen(config.lanes.interactive.queue) == burst


def test_on_a_unix_socket_a_lane_messages_record_waits_for_the_consumer(
    admission: tuple[Settings, Config, redis.Redis],
) -> None:
    """The worker's channel defers the record of a lane message's delivery
    (written when the consumer has decided), as over TCP."""
    settings, config, broker = admission
    transport = Transport(settings, config)
    try:
        assert publish_one(transport) == "queued"
    finally:
        transport.close()
    queue = config.lanes.interactive.queue
    seen: dict[str, Any] = {}
    app = celery_app("unix-worker", settings, config)
    try:
        with app.connection_for_read() as connection:
            channel = connection.default_channel
            unacked_key = channel.qos.unacked_key

            def received(body: Any, message: Any) -> None:
                seen["pending"] = kombu_compat.record_pending(message)
                seen["before"] = broker.hlen(unacked_key)
                kombu_compat.write_deferred(message)
                seen["after"] = broker.hlen(unacked_key)
                message.ack()

            with connection.Consumer(
                [app.amqp.queues[queue]], callbacks=[received], accept=None, prefetch_count=1
            ):
                connection.drain_events(timeout=5)
    finally:
        app.close()
    assert seen == {"pending": True, "before": 0, "after": 1}
    assert broker.hlen(unacked_key) == 0
    assert broker.llen(queue) == 0


# The whole service on the socket: worker processes, clients, the cache.


@pytest.fixture
def served(
    settings: Settings, config: Config, database: Engine, url: str, tmp_path: Path
) -> Iterator[Settings]:
    """A worker process per lane, broker, answers and cache all on the socket."""
    on_socket = on_redis(settings, url)
    started = {
        lane: WorkerProcess.for_lane(on_socket, lane, tmp_path / "logs" / f"{lane.value}.log")
        for lane in LaneName
    }
    for worker in started.values():
        worker.start()
    control = celery_app("unix-control", on_socket, config)
    try:
        wait_answering(control, list(started.values()), 60.0)
        yield on_socket
    finally:
        control.close()
        for worker in started.values():
            with contextlib.suppress(OSError):
                os.kill(worker.pid, signal.SIGCONT)
        stop_all(started.values())


@pytest.mark.slow
def test_a_whole_round_trip_on_a_unix_socket(served: Settings, config: Config) -> None:
    scope = f"t-{uuid.uuid4().hex[:12]}"
    with Client("tests", served, config) as client:
        written = client.write(scope, "a", b"over the socket", idempotency_key=f"{scope}-a")
        assert written.revision == 1
        assert client.read(scope, "a", mode=ReadMode.PRIMARY).payload == b"over the socket"
        # Filled on the first, served from the cache on the second.
        assert client.read(scope, "a").payload == b"over the socket"
        assert client.read(scope, "a").payload == b"over the socket"
    with redis.Redis.from_url(served.redis_url) as cache:
        assert list(cache.scan_iter(f"record:*:{scope}:a#*"))

    async def awaited() -> bytes:
        async with AsyncClient("tests", served, config) as async_client:
            record = await async_client.read(scope, "a", mode=ReadMode.PRIMARY)
            return record.payload

    assert asyncio.run(awaited()) == b"over the socket"
