"""Redis URLs of both kinds: a ``sentinel://`` (or, over TLS, ``sentinels://``)
URL read, refused when malformed, handed to kombu in its own form, and its
pools and connections keeping their own hooks with the Sentinel's behaviour
mixed in. ``tests/redis/test_sentinel_tls.py`` runs a group over TLS."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from dataservice_tools.localservices.sentinel import SentinelGroup

from dataservice.broker import broker_for
from dataservice.broker import redis as broker_redis
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import ConfigError
from dataservice.redis import bounded, endpoints, where
from dataservice.redis.bounded import BoundedConnection, BoundedPool, BoundedSSLConnection, within
from dataservice.redis.endpoints import SentinelTarget
from dataservice.redis.packing import (
    AsyncPackedConnection,
    AsyncPackedSSLConnection,
    Packed,
    PackedConnection,
    PackedSSLConnection,
    async_packed_connection_class,
    packed_connection_class,
)
from dataservice.redis.tls import RedisTLS


def test_a_sentinel_url_names_the_sentinels_the_primary_and_the_database() -> None:
    target = SentinelTarget.parse("sentinel://ds-worker:p%40ss@s1:26379,s2,[::1]:26380/cell-a/3")
    assert target.sentinels == (("s1", 26379), ("s2", 26379), ("::1", 26380))
    assert (target.primary, target.db) == ("cell-a", 3)
    assert (target.username, target.password) == ("ds-worker", "p@ss")
    assert "p@ss" not in repr(target)
    assert SentinelTarget.parse("sentinel://s1:1/cell").db == 0


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("sentinel://s1:26379", "ends in /<primary name>"),
        ("sentinel://s1:26379/", "ends in /<primary name>"),
        ("sentinel://s1:26379/cell/0/extra", "ends in /<primary name>"),
        ("sentinel://s1:26379/cell/zero", "database number"),
        ("sentinel://s1:port/cell", "Sentinel 1 is not a host:port"),
        ("sentinel://s1:70000/cell", "Sentinel 1 is not a host:port"),
        ("sentinel://s1:26379,/cell", "Sentinel 2 is not a host:port"),
        ("sentinel://s1:1/cell/²", "database number"),
        ("sentinel://s1:26379/cell?ssl_cert_reqs=none", "no query; for TLS write sentinels://"),
        ("sentinel://s1:26379/cell?", "no query; for TLS write sentinels://"),
        ("sentinel://s1:26379/cell#x", "no fragment"),
        ("sentinels://s1:26379/cell#x", "no fragment"),
        ("sentinels://s1:26379/cell?ssl_cert_reqs=maybe", "ssl_cert_reqs must be required"),
        ("sentinels://s1:26379/cell?ssl_check_hostname=perhaps", "must be true or false"),
        ("sentinels://s1:26379/cell?ssl_ca_certs=/nonexistent/ca.pem", "not a readable file"),
        ("sentinels://s1:26379/cell?ssl_ciphers=ALL", "unknown TLS option 'ssl_ciphers'"),
        ("sentinels://s1:26379/cell?ssl_cert_reqs=none&ssl_cert_reqs=none", "given twice"),
        ("sentinels://s1:26379/cell?socket_timeout=1", r"takes TLS options \(ssl_\*\) only"),
        ("sentinels://s1:26379", "ends in /<primary name>"),
        ("redis+sentinel://s1:26379/cell", "redis://, rediss://, unix://, sentinel://"),
    ],
)
def test_a_malformed_sentinel_url_is_a_config_error_naming_the_variable(
    url: str, complaint: str
) -> None:
    with pytest.raises(ConfigError, match=complaint) as raised:
        Settings.from_env({"DATASERVICE_REDIS_URL": url})
    assert "DATASERVICE_REDIS_URL" in str(raised.value)


@pytest.mark.parametrize(
    "url", ["sentinel://s1:26379/cell/0", "sentinels://s1:26379/cell/0?ssl_cert_reqs=none"]
)
def test_settings_take_a_sentinel_url_for_each_redis(url: str) -> None:
    settings = Settings.from_env(
        {
            "DATASERVICE_BROKER_URL": url,
            "DATASERVICE_RESULT_BACKEND_URL": url,
            "DATASERVICE_REDIS_URL": url,
        }
    )
    assert settings.broker_url == settings.redis_url == url


def test_a_sentinels_url_is_tls_with_the_options_and_defaults_of_rediss(tmp_path: Path) -> None:
    # The defaults: verified against the system CAs, the host name checked.
    assert SentinelTarget.parse("sentinels://s1/cell").tls == RedisTLS()
    assert SentinelTarget.parse("sentinel://s1/cell").tls is None
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "client.pem", "client.key"))
    for path in (ca, cert, key):
        path.write_text("")
    target = SentinelTarget.parse(
        f"sentinels://u:p%3Fw@s1:1,s2:2/cell/4?ssl_ca_certs={ca}&ssl_certfile={cert}"
        f"&ssl_keyfile={key}&ssl_check_hostname=false"
    )
    assert (target.sentinels, target.primary, target.db) == ((("s1", 1), ("s2", 2)), "cell", 4)
    assert target.password == "p?w"
    assert target.tls == RedisTLS(
        ssl.CERT_REQUIRED, False, ca_certs=str(ca), certfile=str(cert), keyfile=str(key)
    )
    # kombu's URL stays sentinel://: TLS reaches it as options.
    assert target.kombu_url() == "sentinel://u:p%3Fw@s1:1/4"
    assert target.where() == "primary 'cell' of the Sentinels at s1:1,s2:2, db 4 over TLS"
    none = SentinelTarget.parse("sentinels://s1/cell?ssl_cert_reqs=none").tls
    assert none is not None
    # As with rediss://: no hostname check on a certificate that is not verified.
    assert (none.cert_reqs, none.check_hostname) == (ssl.CERT_NONE, False)


def test_a_password_with_a_stray_question_mark_is_never_shown() -> None:
    with pytest.raises(ConfigError) as raised:
        SentinelTarget.parse("sentinels://u:se?cret@s1:1/cell")
    # Read as the host "u" on port "se": refused, and nothing of it said.
    assert str(raised.value) == "the Redis URL: Sentinel 1 is not a host:port"


def test_the_connection_classes_of_a_sentinels_url_are_the_tls_kinds() -> None:
    url = "sentinels://s1:1/cell"
    assert packed_connection_class(url) is PackedSSLConnection
    assert async_packed_connection_class(url) is AsyncPackedSSLConnection
    assert bounded.connection_class(url) is BoundedSSLConnection
    assert packed_connection_class("sentinel://s1:1/cell") is PackedConnection
    pool = endpoints.pool(f"{url}/0?ssl_cert_reqs=none", BoundedPool, BoundedConnection)
    try:
        assert issubclass(pool.connection_class, BoundedSSLConnection)
        assert issubclass(pool.connection_class, redis.sentinel.SentinelManagedConnection)
        assert pool.connection_kwargs["ssl_cert_reqs"] == ssl.CERT_NONE
        assert "ssl" not in pool.connection_kwargs
        sentinel = pool.sentinel_manager.sentinels[0].connection_pool  # type: ignore[attr-defined]
        # A bounded pool asks its Sentinels within the caller's bound, over TLS too.
        assert sentinel.connection_class is BoundedSSLConnection
        assert sentinel.connection_kwargs["ssl_cert_reqs"] == ssl.CERT_NONE
    finally:
        pool.disconnect()
    # A TLS URL of one server takes the TLS kind too.
    plain = endpoints.pool("rediss://127.0.0.1:1/0", BoundedPool, BoundedConnection)
    assert plain.connection_class is BoundedSSLConnection

    async def async_pool() -> type[redis.asyncio.Connection]:
        made = endpoints.async_pool(url, redis.asyncio.ConnectionPool, AsyncPackedConnection)
        try:
            return made.connection_class
        finally:
            await made.disconnect()

    made = asyncio.run(async_pool())
    assert issubclass(made, AsyncPackedSSLConnection)
    assert issubclass(made, redis.asyncio.sentinel.SentinelManagedConnection)


def test_kombu_gets_one_url_the_first_sentinel_with_the_credentials_and_db() -> None:
    target = SentinelTarget.parse("sentinel://u:p%3Aw@s1:26379,s2:26380/cell/2")
    # One URL: kombu would take ";"-joined ones for fallbacks, with its stock transport.
    assert target.kombu_url() == "sentinel://u:p%3Aw@s1:26379/2"
    assert SentinelTarget.parse("sentinel://s1/cell").kombu_url() == "sentinel://s1:26379/0"
    assert SentinelTarget.parse("sentinel://[::1]:5/cell").kombu_url() == "sentinel://[::1]:5/0"


def test_a_password_with_a_slash_or_a_comma_is_read_whole_and_never_shown() -> None:
    target = SentinelTarget.parse("sentinel://u:pa/s,s@s1:1/cell")
    assert (target.password, target.sentinels) == ("pa/s,s", (("s1", 1),))
    with pytest.raises(ConfigError) as raised:
        SentinelTarget.parse("sentinel://u:pa/ss@s1:x/cell")
    assert "pa" not in str(raised.value).replace("sentinel://", "")


def test_the_broker_hands_kombu_every_sentinel_in_its_transport_options(config: Config) -> None:
    url = "sentinel://u:pw@s1:26379,s2:26380/cell/2"
    found = broker_for(dataclasses.replace(Settings(), broker_url=url)).celery_settings(config)
    assert found["broker_url"] == "sentinel://u:pw@s1:26379/2"
    options = found["broker_transport_options"]
    assert options["master_name"] == "cell"
    assert options["dataservice_sentinels"] == [["s1", 26379], ["s2", 26380]]
    assert found["broker_transport"].endswith(":SentinelTransport")
    assert found["broker_use_ssl"] is False
    assert "ssl" not in options["sentinel_kwargs"]


def test_over_tls_the_broker_asks_the_sentinels_and_the_primary_with_the_options(
    config: Config,
) -> None:
    url = "sentinels://u:pw@s1:26379,s2:26380/cell/2?ssl_cert_reqs=optional"
    found = broker_for(dataclasses.replace(Settings(), broker_url=url)).celery_settings(config)
    assert found["broker_url"] == "sentinel://u:pw@s1:26379/2"
    tls = {"ssl_cert_reqs": ssl.CERT_OPTIONAL, "ssl_check_hostname": True}
    assert found["broker_use_ssl"] == tls
    options = found["broker_transport_options"]
    assert options["dataservice_tls"] == tls
    assert options["sentinel_kwargs"] == {
        "socket_timeout": 1.0,
        "socket_connect_timeout": 1.0,
        "ssl": True,
        **tls,
    }
    # kombu's channels: the service's TLS connection classes, finding the primary.
    for transport in ("SentinelTransport", "CallerSentinelTransport"):
        channel = getattr(broker_redis, transport).Channel
        assert issubclass(channel.connection_class_ssl, redis.sentinel.SentinelManagedConnection)
    assert issubclass(
        broker_redis.SentinelTransport.Channel.connection_class_ssl, PackedSSLConnection
    )
    caller = broker_redis.CallerSentinelTransport.Channel
    assert issubclass(caller.connection_class_ssl, BoundedSSLConnection)


def test_where_names_the_primary_and_its_sentinels_without_credentials() -> None:
    assert "secret" not in where("sentinels://u:secret@s1:26379/cell/2")
    described = where("sentinel://u:secret@s1:26379,s2:26380/cell/2")
    assert described == "primary 'cell' of the Sentinels at s1:26379,s2:26380, db 2"
    assert where("redis://u:secret@h:6380/4") == "h:6380/4"


def test_the_sentinel_classes_keep_the_hooks_of_the_classes_they_are_made_from() -> None:
    connection = endpoints.sentinel_connection_class(BoundedConnection)
    assert issubclass(connection, redis.sentinel.SentinelManagedConnection)
    assert issubclass(connection, BoundedConnection)
    assert issubclass(connection, Packed)
    # The same class each time: pools and kombu compare classes.
    assert endpoints.sentinel_connection_class(BoundedConnection) is connection
    assert endpoints.sentinel_connection_class(connection) is connection
    pool = endpoints.pool("sentinel://127.0.0.1:1/cell", BoundedPool, BoundedConnection)
    assert isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert isinstance(pool, BoundedPool)
    assert pool.connection_class is connection
    pool.disconnect()
    # A server's URL is untouched.
    plain = endpoints.pool("redis://127.0.0.1:1/0", BoundedPool, BoundedConnection)
    assert type(plain) is BoundedPool
    assert plain.connection_class is BoundedConnection


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> object:
    with SentinelGroup(tmp_path_factory.mktemp("sentinel")) as started:
        yield started


@pytest.mark.fault
def test_clients_of_both_kinds_reach_the_primary_through_the_sentinel(
    group: SentinelGroup,
) -> None:
    url = group.url(db=5)
    client = endpoints.client(url, connection_class=PackedConnection, socket_timeout=2)
    try:
        client.set("ds:endpoints-test", "here")
        assert client.info("server")["tcp_port"] == group.primary_port()
        assert client.connection_pool.connection_kwargs["db"] == 5
    finally:
        client.close()
    # Bounded pools keep their bound through the Sentinel's lookup.
    bounded = redis.Redis(
        connection_pool=endpoints.pool(url, BoundedPool, BoundedConnection, max_connections=2)
    )
    try:
        with within(1.0):
            assert bounded.get("ds:endpoints-test") == b"here"
    finally:
        bounded.close()

    async def awaited() -> bytes | None:
        async_client = endpoints.async_client(url, connection_class=AsyncPackedConnection)
        try:
            value: bytes | None = await async_client.get("ds:endpoints-test")
            return value
        finally:
            await async_client.aclose()

    assert asyncio.run(awaited()) == b"here"


@pytest.mark.fault
def test_a_bounded_pool_asks_the_sentinels_within_its_bound(group: SentinelGroup) -> None:
    """With the Sentinel taking questions and answering none, a bounded call
    ends with its bound, not after the Sentinel timeout."""
    bounded = redis.Redis(
        connection_pool=endpoints.pool(group.url(), BoundedPool, BoundedConnection)
    )
    try:
        with group.sentinels_stopped(), within(0.2):
            started = time.monotonic()
            with pytest.raises(redis.ConnectionError):
                bounded.ping()
            took = time.monotonic() - started
    finally:
        bounded.close()
    assert took < endpoints.SENTINEL_TIMEOUT_S, took


def test_an_unreachable_sentinel_is_a_connection_error_within_its_timeout(tmp_path: Path) -> None:
    client = endpoints.client("sentinel://127.0.0.1:1/cell/0", socket_connect_timeout=0.5)
    try:
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        client.close()
