"""RabbitMQ for the tests: virtual hosts of their own, and the broker as a
test parameter (``BROKERS``)."""

from __future__ import annotations

import dataclasses
import functools

import redis
from dataservice_tools.localservices.rabbitmq import virtual_host
from kombu import Connection

from dataservice.broker import queue_depths
from dataservice.broker.rabbitmq import delete_lane_queues
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from tests.conftest import PROCESS_REDIS_URL
from tests.harness.support import on_redis as settings_on

# The broker-facing tests run once on each.
BROKERS = ("redis", "amqp")
# The Redis of the answers, the limits and admission's books when RabbitMQ is the broker.
AMQP_REDIS_URL = "redis://127.0.0.1:6379/13"


def fresh_vhost(name: str) -> str:
    """An empty virtual host ``name`` (deleted first, with its queues); its URL."""
    _vhost.cache_clear()
    return virtual_host(name, fresh=True)


@functools.cache
def _vhost(name: str) -> str:
    """Virtual host ``name``, made once per test process (unless made afresh)."""
    return virtual_host(name)


def on_rabbitmq(settings: Settings, config: Config, vhost: str) -> Settings:
    """``settings`` with RabbitMQ as the broker, in ``vhost``, whose lane queues
    are gone (the first publish or worker declares them afresh)."""
    url = _vhost(vhost)
    delete_lane_queues(url, config)
    return dataclasses.replace(settings, broker_url=url)


def depth(settings: Settings, queue: str) -> int:
    """Messages waiting in ``queue`` on the settings' broker."""
    depths = queue_depths(settings)
    try:
        return depths.depth(queue)
    finally:
        depths.close()


def purge(settings: Settings, queue: str) -> None:
    """Drop whatever waits in ``queue`` on the settings' broker."""
    if not settings.broker_is_amqp:
        redis.Redis.from_url(settings.broker_url).delete(queue)
        return
    with Connection(settings.broker_url) as connection:
        connection.default_channel.queue_purge(queue)


def processes_on(broker: str, settings: Settings, config: Config) -> Settings:
    """The worker processes' settings (``worker_processes``) on ``broker``
    (one of :data:`BROKERS`): for a module whose tests run on each."""
    on_redis = settings_on(settings, PROCESS_REDIS_URL)
    if broker == "amqp":
        return on_rabbitmq(on_redis, config, "dataservice-processes")
    return on_redis
