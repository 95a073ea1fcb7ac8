"""Redis URLs of both kinds: a ``sentinel://`` URL read, refused when malformed,
handed to kombu in its own form, and its pools and connections keeping their
own hooks with the Sentinel's behaviour mixed in."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from dataservice_tools.localservices.sentinel import SentinelGroup

from dataservice.broker import broker_for
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import ConfigError
from dataservice.redis import endpoints, where
from dataservice.redis.bounded import BoundedConnection, BoundedPool, within
from dataservice.redis.endpoints import SentinelTarget
from dataservice.redis.packing import AsyncPackedConnection, Packed, PackedConnection


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
        ("sentinel://s1:26379/cell?ssl_cert_reqs=none", "no query"),
    ],
)
def test_a_malformed_sentinel_url_is_a_config_error_naming_the_variable(
    url: str, complaint: str
) -> None:
    with pytest.raises(ConfigError, match=complaint) as raised:
        Settings.from_env({"DATASERVICE_REDIS_URL": url})
    assert "DATASERVICE_REDIS_URL" in str(raised.value)


def test_settings_take_a_sentinel_url_for_each_redis() -> None:
    url = "sentinel://s1:26379/cell/0"
    settings = Settings.from_env(
        {
            "DATASERVICE_BROKER_URL": url,
            "DATASERVICE_RESULT_BACKEND_URL": url,
            "DATASERVICE_REDIS_URL": url,
        }
    )
    assert settings.broker_url == settings.redis_url == url


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


def test_where_names_the_primary_and_its_sentinels_without_credentials() -> None:
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


def test_an_unreachable_sentinel_is_a_connection_error_within_its_timeout(tmp_path: Path) -> None:
    client = endpoints.client("sentinel://127.0.0.1:1/cell/0", socket_connect_timeout=0.5)
    try:
        with pytest.raises(redis.ConnectionError):
            client.ping()
    finally:
        client.close()
