"""The service on RabbitMQ: worker processes consuming the lanes' quorum
queues, callers publishing with confirms, answers and admission on Redis."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine

from dataservice import Client
from dataservice.config import Config
from dataservice.settings import Settings
from dataservice.supervisor import Supervisor
from tests.rabbit import AMQP_REDIS_URL, fresh_vhost


@pytest.fixture(scope="module")
def amqp_settings(settings: Settings) -> Settings:
    return dataclasses.replace(
        settings,
        broker_url=fresh_vhost("dataservice-tests"),
        result_backend_url=AMQP_REDIS_URL,
        redis_url=AMQP_REDIS_URL,
    )


@pytest.fixture(scope="module")
def amqp_workers(
    amqp_settings: Settings,
    config: Config,
    database: Engine,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Supervisor]:
    redis.Redis.from_url(AMQP_REDIS_URL).flushdb()
    log_dir: Path = tmp_path_factory.mktemp("amqp-worker-logs")
    supervisor = Supervisor(amqp_settings, config, log_dir)
    supervisor.start()
    try:
        supervisor.wait_ready()
        yield supervisor
    finally:
        supervisor.stop()


def test_a_write_and_a_cached_read_travel_through_rabbitmq(
    amqp_workers: Supervisor, amqp_settings: Settings, config: Config, scope: str
) -> None:
    with Client("tests", amqp_settings, config) as client:
        client.write(scope, "a", b"hello", timeout=5)
        assert client.read(scope, "a", timeout=5).payload == b"hello"
        for _ in range(20):
            assert client.read(scope, "a", timeout=5).payload == b"hello"
