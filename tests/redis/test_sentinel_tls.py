"""Over TLS (``sentinels://``): a Sentinel-managed Redis whose servers and
Sentinels listen on TLS ports alone (``SentinelGroup`` with certificates: the
plain port is 0), so whatever reaches them went over TLS.

The service's clients (the workers, the supervisor, the client, ``acl
apply``) find the primary and verify its certificate and the Sentinels', the
broker publishes and consumes, and after a failover the clients reach the
promoted replica, over TLS throughout."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.sentinel
from dataservice_tools.localservices.certificates import Certificates, make_certificates
from dataservice_tools.localservices.sentinel import SentinelGroup
from dataservice_tools.testkit.waits import eventually
from kombu import Consumer, Queue
from sqlalchemy import Engine

from dataservice import Client, Record
from dataservice.broker.celery import celery_app
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.supervisor import Supervisor
from dataservice.redis import endpoints
from dataservice.redis.bounded import BoundedConnection, BoundedPool, BoundedSSLConnection, within
from dataservice.redis.packing import (
    AsyncPackedConnection,
    AsyncPackedSSLConnection,
    PackedSSLConnection,
    packed_connection_class,
)
from dataservice.security.acl import admin_servers
from tests.harness.support import on_redis, publish_one
from tests.harness.tls import require_tls_tools

pytestmark = pytest.mark.slow

KEY = "ds:sentinel-tls-test"


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    require_tls_tools()
    return make_certificates(tmp_path_factory.mktemp("sentinel-tls-ca"))


@pytest.fixture(scope="module")
def group(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
) -> Iterator[SentinelGroup]:
    with SentinelGroup(
        tmp_path_factory.mktemp("sentinel-tls"), certificates=certificates
    ) as started:
        yield started


def test_clients_of_every_kind_reach_the_primary_over_tls(group: SentinelGroup) -> None:
    url = group.url(db=3)
    assert url.startswith("sentinels://")
    client = endpoints.client(url, connection_class=packed_connection_class(url), socket_timeout=2)
    try:
        client.set(KEY, "over tls")
        # No plain port: this went over TLS, to the primary the Sentinel names.
        assert client.config_get("port") == {"port": "0"}
        assert client.config_get("tls-port") == {"tls-port": str(group.primary_port())}
        pool = client.connection_pool
        assert issubclass(pool.connection_class, PackedSSLConnection)
        assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
        asked = pool.sentinel_manager.sentinels[0].connection_pool.connection_class
        assert issubclass(asked, redis.SSLConnection)
    finally:
        client.close()

    # Given the plain class of its kind, a pool takes the TLS one.
    bounded = redis.Redis(
        connection_pool=endpoints.pool(url, BoundedPool, BoundedConnection, max_connections=2)
    )
    try:
        assert issubclass(bounded.connection_pool.connection_class, BoundedSSLConnection)
        with within(1.0):
            assert bounded.get(KEY) == b"over tls"
    finally:
        bounded.close()

    async def awaited() -> tuple[bytes | None, type[Any]]:
        client = endpoints.async_client(url, connection_class=AsyncPackedConnection)
        try:
            value: bytes | None = await client.get(KEY)
            return value, client.connection_pool.connection_class
        finally:
            await client.aclose()

    value, connection_class = asyncio.run(awaited())
    assert value == b"over tls"
    assert issubclass(connection_class, AsyncPackedSSLConnection)


def test_the_sentinels_speak_tls_alone(group: SentinelGroup) -> None:
    plain = redis.Redis(port=group.sentinel_port, socket_connect_timeout=1, socket_timeout=1)
    try:
        with pytest.raises(redis.ConnectionError):
            plain.ping()
    finally:
        plain.close()


def test_acl_apply_reaches_the_primary_and_the_replica_over_tls(group: SentinelGroup) -> None:
    # ACL users are not replicated: each server of the group is asked itself.
    servers = admin_servers(group.url())
    try:
        ports = sorted(int(s.client.config_get("tls-port")["tls-port"]) for s in servers)
    finally:
        for server in servers:
            server.client.close()
    assert ports == sorted(server.port for server in group.servers)


@pytest.mark.parametrize("trusted", ["another CA", "the system CAs"])
def test_a_certificate_the_client_does_not_trust_fails_verification(
    group: SentinelGroup, tmp_path: Path, trusted: str
) -> None:
    query = f"?ssl_ca_certs={make_certificates(tmp_path).ca}" if trusted == "another CA" else ""
    url = f"sentinels://127.0.0.1:{group.sentinel_port}/{group.name}/0{query}"
    client = endpoints.client(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        # The Sentinel is asked first: its certificate is the one refused.
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            client.ping()
    finally:
        client.close()


def test_the_broker_publishes_and_consumes_over_tls(
    settings: Settings, config: Config, group: SentinelGroup
) -> None:
    url = group.url(db=1)
    on_group = on_redis(settings, url)
    queue = config.lanes.interactive.queue
    primary = endpoints.client(url, socket_timeout=2)
    primary.flushdb()
    try:
        # The caller's channel: admission's script, through the Sentinel.
        transport = Transport(on_group, config)
        try:
            assert publish_one(transport) == "queued"
        finally:
            transport.close()
        assert primary.llen(queue) == 1

        # A worker's channel takes it.
        app = celery_app("tests-sentinel-tls", on_group, config)
        got: list[Any] = []
        try:
            with app.connection_for_read() as connection:
                channel = connection.default_channel
                with Consumer(channel, queues=[Queue(queue)], on_message=got.append):
                    connection.drain_events(timeout=5)
                assert issubclass(channel.pool.connection_class, PackedSSLConnection)
                assert len(got) == 1
                got[0].ack()
        finally:
            app.close()
        assert primary.llen(queue) == 0
    finally:
        primary.flushdb()
        primary.close()


def test_the_workers_supervisor_and_client_work_over_tls(
    settings: Settings, config: Config, database: Engine, group: SentinelGroup, tmp_path: Path
) -> None:
    """Worker processes (their broker consumer, limits client and answers),
    the supervisor and the client (its reply channel), all on ``sentinels://``."""
    url = group.url(db=4)
    on_group = on_redis(settings, url)
    supervisor = Supervisor(on_group, config, tmp_path / "logs")
    supervisor.start()
    try:
        supervisor.wait_ready()
        scope = f"t-{uuid.uuid4().hex[:12]}"
        with Client("tests", on_group, config) as client:
            client.write(scope, "k", b"over tls")
            record = client.read(scope, "k")
        assert isinstance(record, Record)
        assert record.payload == b"over tls"
        assert all(stats.depth == 0 for stats in supervisor.snapshot().lanes.values())
    finally:
        supervisor.stop()


@pytest.mark.fault
def test_after_a_failover_the_clients_reach_the_promoted_replica_over_tls(
    certificates: Certificates, tmp_path: Path
) -> None:
    # A group of its own: the module's keeps its primary.
    with SentinelGroup(tmp_path / "group", certificates=certificates) as group:
        url = group.url(db=2)
        client = endpoints.client(
            url, connection_class=packed_connection_class(url), socket_timeout=2
        )
        try:
            value = uuid.uuid4().hex
            client.set(KEY, value)
            group.wait_replicated()
            old_port = group.primary_port()
            assert old_port is not None
            group.kill_primary()
            new_port = group.wait_promoted(old_port)

            def on_promoted() -> bool:
                # A command on the dead primary's connection may fail; the
                # next asks the Sentinel again.
                try:
                    return client.config_get("tls-port") == {"tls-port": str(new_port)}
                except redis.ConnectionError:
                    return False

            eventually(on_promoted, timeout=10, interval=0.05,
                       message="the client to reach the promoted replica")  # fmt: skip
            assert client.get(KEY) == value.encode()
            assert client.config_get("port") == {"port": "0"}
        finally:
            client.close()
