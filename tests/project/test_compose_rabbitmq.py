"""compose/rabbitmq.yml, laid over compose/docker-compose.yml as compose
merges them (``-f`` both): RabbitMQ as the broker. Parsed, never run."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.compose_file import (
    COMPOSE,
    COMPOSE_DIR,
    CONSUMER,
    PROJECT_SERVICES,
    WORKER_LANES,
    environment,
    interpolated,
    load_yaml,
    merged,
    published_ports,
    settings,
)

OVERLAY_FILE = COMPOSE_DIR / "rabbitmq.yml"
OVERLAY = interpolated(load_yaml(OVERLAY_FILE))
# Whatever speaks to the broker: the workers, the consumers' control channel, Flower.
BROKER_USERS = (*WORKER_LANES, CONSUMER, "flower")


MERGED = merged(COMPOSE, OVERLAY)
SERVICES: dict[str, dict[str, Any]] = MERGED["services"]


def test_the_overlay_adds_rabbitmq_and_changes_no_other_service_but_the_brokers_users() -> None:
    added = set(OVERLAY["services"]) - set(COMPOSE["services"])
    assert added == {"rabbitmq"}
    assert set(OVERLAY["services"]) - added == set(BROKER_USERS)


def test_rabbitmq_runs_a_pinned_image_on_loopback_with_its_data_kept() -> None:
    rabbitmq = SERVICES["rabbitmq"]
    image, _, tag = rabbitmq["image"].partition(":")
    assert image == "rabbitmq"
    assert tag
    assert tag != "latest"
    assert all(host == "127.0.0.1" for host, _ in published_ports(rabbitmq))
    assert "rabbitmq-data:/var/lib/rabbitmq" in rabbitmq["volumes"]
    assert "rabbitmq-data" in MERGED["volumes"]
    # The node's name, and so where it keeps its data, must not change on restart.
    assert rabbitmq["hostname"] == "rabbitmq"
    assert rabbitmq["healthcheck"]["test"][0] == "CMD"


@pytest.mark.parametrize("name", BROKER_USERS)
def test_each_broker_user_reaches_rabbitmq_after_it_is_healthy(name: str) -> None:
    service = SERVICES[name]
    env = settings(service)
    assert env.broker_is_amqp
    assert env.broker_url.startswith("amqp://dataservice:")
    assert "@rabbitmq:5672/dataservice" in env.broker_url
    rabbitmq = SERVICES["rabbitmq"]["environment"]
    assert f":{rabbitmq['RABBITMQ_DEFAULT_PASS']}@" in env.broker_url
    assert env.broker_url.endswith("/" + rabbitmq["RABBITMQ_DEFAULT_VHOST"])
    assert service["depends_on"]["rabbitmq"] == {"condition": "service_healthy"}
    # Answers, limits and the cache stay in Redis; everything else as before.
    assert env.result_backend_url.startswith("redis://redis:")
    assert env.redis_url.startswith("redis://redis:")
    before = environment(COMPOSE["services"][name])
    after = environment(service)
    assert {k: v for k, v in after.items() if k != "DATASERVICE_BROKER_URL"} == {
        k: v for k, v in before.items() if k != "DATASERVICE_BROKER_URL"
    }


@pytest.mark.parametrize("name", sorted(set(PROJECT_SERVICES) - set(BROKER_USERS)))
def test_the_jobs_that_only_touch_the_database_are_left_alone(name: str) -> None:
    assert SERVICES[name] == COMPOSE["services"][name]
