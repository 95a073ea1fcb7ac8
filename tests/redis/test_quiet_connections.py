"""The service's Redis connections say what they need on connect and nothing
more (``dataservice.redis.bounded.QUIET``): no ``CLIENT SETINFO`` (callers' Redis
users are refused it) and no ``CLIENT MAINT_NOTIFICATIONS`` (a Redis before 8
refuses it). Each would cost every connection a round trip, and the first an
error built and thrown away, in the burst of reconnects after a stall.

The commands are taken from what redis-py sends, to the real Redis."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
import redis

from dataservice.broker.celery import celery_app
from dataservice.broker.results import ResultStore
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.health import _client as health_client
from dataservice.redis.packing import Packed

# What a connection of the service may send before its first command: RESP3's
# hello (with the credentials), the pool's health check, the database.
HANDSHAKE = {"HELLO", "AUTH", "PING", "SELECT"}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every command redis-py sends from the test's own thread, in
    order (a command that the service's packed connections leave to redis-py,
    twice); a worker another test left in this process may be waiting on
    another thread."""
    names: list[str] = []
    mine = threading.get_ident()
    for owner in (redis.connection.AbstractConnection, Packed):
        send = owner.send_command

        def recording(self: Any, *args: Any, _send: Any = send, **kwargs: Any) -> None:
            if threading.get_ident() == mine:
                names.append(" ".join(str(a) for a in args[:2]).upper())
            _send(self, *args, **kwargs)

        monkeypatch.setattr(owner, "send_command", recording)
    return names


def connect_only(sent: list[str], first_command: str) -> list[str]:
    """What was sent before ``first_command``, the call's own command."""
    assert any(name.startswith(first_command) for name in sent), sent
    before = sent[: next(i for i, name in enumerate(sent) if name.startswith(first_command))]
    assert before, "no new connection was made"
    return before


def assert_quiet(before: list[str]) -> None:
    assert {name.split()[0] for name in before} <= HANDSHAKE, before


@pytest.mark.parametrize("bounded", [True, False], ids=["caller", "worker"])
def test_a_result_store_connects_with_the_handshake_alone(
    settings: Settings, sent: list[str], bounded: bool
) -> None:
    store = ResultStore.from_url(settings.result_backend_url, bounded=bounded)
    try:
        assert store.wait("tests", uuid.uuid4().hex, 0.0) is None
    finally:
        store.close()
    assert_quiet(connect_only(sent, "LPOP"))


@pytest.mark.parametrize("caller", [True, False], ids=["caller", "worker"])
def test_a_broker_channel_connects_with_the_handshake_alone(
    settings: Settings, config: Config, sent: list[str], caller: bool
) -> None:
    # An app of its own: a connection of a shared pool may have been made
    # before this test watched.
    app = celery_app("tests-quiet", settings, config, caller=caller)
    try:
        with app.connection_for_write() as connection:
            connection.default_channel.client.exists("tests:quiet")
    finally:
        app.close()
    assert_quiet(connect_only(sent, "EXISTS"))


def test_a_health_check_connects_with_the_handshake_alone(
    settings: Settings, sent: list[str]
) -> None:
    client = health_client(settings.redis_url, 1.0)
    try:
        client.exists("tests:quiet")
    finally:
        client.close()
    assert_quiet(connect_only(sent, "EXISTS"))
