"""Over TLS (``rediss://``), the broker still runs admission and caller pacing,
the connection really is TLS, and the server's certificate is verified.

The Redis here is private and listens on a TLS port only (``tests/harness/tls.py``):
whatever reaches it went over TLS."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine

from dataservice import Client, Record, Unavailable
from dataservice.broker.celery import celery_settings
from dataservice.broker.results import ResultStore
from dataservice.client.transport import Transport
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ConfigError
from dataservice.ops.supervisor import Supervisor
from tests.harness.support import bounded_admission, on_redis, publish_concurrently, publish_one
from tests.harness.tls import TLSRedis, tls_redis

MAX_MESSAGES = 20


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSRedis]:
    with tls_redis(tmp_path_factory.mktemp("tls-redis")) as server:
        yield server


@pytest.fixture
def bounded(
    settings: Settings, tls_server: TLSRedis, tmp_path: Path
) -> Iterator[tuple[Settings, Config, redis.Redis]]:
    """Settings on the TLS Redis (nothing consumes it) with a small interactive bound."""
    with bounded_admission(
        settings,
        tls_server.url(db=1),
        tmp_path,
        interactive={"max_messages": MAX_MESSAGES, "max_bytes": 1 << 24},
    ) as bounded:
        yield bounded


def _deadline(seconds: float) -> int:
    return int((time.time() + seconds) * 1000)


def test_over_tls_concurrent_producers_never_overshoot_the_queue_bound(
    bounded: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = bounded
    producers, each = 8, 10
    outcomes = publish_concurrently(settings, config, producers, each)
    # Nothing consumes this queue, so its length now is the most it ever held.
    assert broker.llen(config.lanes.interactive.queue) == MAX_MESSAGES
    assert outcomes.count("queued") == MAX_MESSAGES
    assert outcomes.count("queue_full") == producers * each - MAX_MESSAGES


def test_over_tls_a_caller_over_its_rate_is_refused_before_the_queue(
    bounded: tuple[Settings, Config, redis.Redis],
) -> None:
    settings, config, broker = bounded
    burst = config.callers["tests-limited"].burst
    transport = Transport(settings, config)
    try:
        outcomes = [publish_one(transport, caller="tests-limited") for _ in range(burst + 3)]
    finally:
        transport.close()
    assert outcomes == ["queued"] * burst + ["rate_limited"] * 3
    assert broker.llen(config.lanes.interactive.queue) == burst


@pytest.mark.slow
def test_the_broker_connection_is_tls_and_verifies_the_server_by_default(
    bounded: tuple[Settings, Config, redis.Redis], tls_server: TLSRedis
) -> None:
    settings, config, broker = bounded
    # The server has no plain port, and its TLS port does not speak plain Redis.
    assert broker.config_get("port") == {"port": "0"}
    assert broker.config_get("tls-port") == {"tls-port": str(tls_server.port)}
    plain = redis.Redis(port=tls_server.port, socket_connect_timeout=1, socket_timeout=1)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()

    # With no certificate options the server must verify against the system
    # CAs, which do not hold the test CA: the broker is unreachable, not
    # silently unverified.
    unverified = on_redis(settings, f"rediss://127.0.0.1:{tls_server.port}/1")
    transport = Transport(unverified, config)
    try:
        with pytest.raises(Unavailable):
            transport.publish(b"x", request_id=uuid.uuid4().hex, lane=LaneName.INTERACTIVE,
                              deadline_ms=_deadline(30))  # fmt: skip
    finally:
        transport.close()
    assert broker.llen(config.lanes.interactive.queue) == 0

    transport = Transport(settings, config)
    try:
        assert publish_one(transport) == "queued"
    finally:
        transport.close()
    assert broker.llen(config.lanes.interactive.queue) == 1


@pytest.mark.parametrize(
    ("query", "complaint"),
    [
        ("ssl_cert_reqs=maybe", "ssl_cert_reqs must be required, optional or none"),
        ("ssl_cert_reqs=CERT_NONE", "ssl_cert_reqs must be required, optional or none"),
        ("ssl_check_hostname=perhaps", "ssl_check_hostname must be true or false"),
        ("ssl_ca_certs=/nonexistent/ca.pem", "is not a readable file"),
        ("ssl_ciphers=ALL", "unknown TLS option 'ssl_ciphers'"),
        ("ssl_cert_reqs=none&ssl_cert_reqs=required", "given twice"),
    ],
)
def test_bad_tls_options_are_a_config_error_naming_the_option(
    settings: Settings, config: Config, query: str, complaint: str
) -> None:
    url = f"rediss://127.0.0.1:6380/0?{query}"
    with pytest.raises(ConfigError, match=complaint):
        Settings.from_env({"DATASERVICE_BROKER_URL": url})
    with pytest.raises(ConfigError, match=complaint):
        celery_settings(on_redis(settings, url), config)


def test_tls_options_on_a_plain_url_are_a_config_error() -> None:
    complaint = r"DATASERVICE_REDIS_URL: TLS options \(ssl_cert_reqs\) need a rediss://"
    with pytest.raises(ConfigError, match=complaint):
        Settings.from_env({"DATASERVICE_REDIS_URL": "redis://127.0.0.1:6379/0?ssl_cert_reqs=none"})


@pytest.mark.slow
def test_the_other_redis_clients_work_over_tls(
    settings: Settings, config: Config, database: Engine, tls_server: TLSRedis, tmp_path: Path
) -> None:
    """Worker processes (their broker consumer, limits client and answers),
    the supervisor, the result store and the client (its reply channel), all on the TLS Redis."""
    url = tls_server.url(db=2)
    tls_settings = on_redis(settings, url)
    redis.Redis.from_url(url).flushdb()
    results = ResultStore.from_url(url)
    assert results.wait("tests", uuid.uuid4().hex, 0.01) is None
    results.close()
    supervisor = Supervisor(tls_settings, config, tmp_path / "logs")
    supervisor.start()
    try:
        supervisor.wait_ready()
        scope = f"t-{uuid.uuid4().hex[:12]}"
        with Client("tests", tls_settings, config) as client:
            client.write(scope, "k", b"over tls")
            record = client.read(scope, "k")
        assert isinstance(record, Record)
        assert record.payload == b"over tls"
        # Queue depths come from the supervisor's own redis-py client.
        assert all(stats.depth == 0 for stats in supervisor.snapshot().lanes.values())
    finally:
        supervisor.stop()
