"""No health check in compose/docker-compose.yml touches the database.

A health check that ran ``SELECT 1`` once failed on every server at the
moment the database struggled, and the load balancer took the whole fleet out
(docs/operations.md, "Health"). Only MariaDB's own check may ask MariaDB; the
project's processes check liveness (their alive file and the broker), and
Flower, Prometheus and Grafana ask their own web servers.
"""

from __future__ import annotations

import re

import pytest

from tests.harness.compose_file import (
    CONSUMER,
    ONE_SHOT,
    SERVICES,
    WORKER_LANES,
    command,
    health_argv,
    parse,
    published_ports,
)

# Any database client, by name: mariadb, mariadb-admin, mysql, mysqladmin, ...
DATABASE_CLIENT = re.compile(r"\b(mariadb|mysql)[\w-]*", re.IGNORECASE)
# Each web service's check, and the page of its own that answers without asking anything else.
OWN_PAGES = {
    "flower": "/healthcheck",
    "prometheus": "/-/healthy",
    # Not /api/health, which also asks Grafana's own database.
    "grafana": "/healthz",
}


def _checked() -> list[str]:
    return [name for name, service in SERVICES.items() if service.get("healthcheck")]


@pytest.mark.parametrize("name", [name for name in _checked() if name != "mariadb"])
def test_no_health_check_touches_the_database(name: str) -> None:
    check = health_argv(SERVICES[name])
    words = " ".join(check)
    assert "--deep" not in words, f"{name}: --deep adds the database"
    assert not DATABASE_CLIENT.search(words), f"{name}: the check runs a database client"
    assert ":3306" not in words, f"{name}: the check connects to the database's port"
    if check[0] == "dataservice":
        path, params = parse(check)
        assert path == "dataservice health"
        assert not params["deep"], f"{name}: --deep touches the database"


def test_redis_and_mariadb_health_checks_ping_the_server_itself() -> None:
    assert health_argv(SERVICES["redis"])[:2] == ["redis-cli", "ping"]
    assert health_argv(SERVICES["mariadb"])[:2] == ["mariadb-admin", "ping"]


@pytest.mark.parametrize("name", ONE_SHOT)
def test_one_shot_jobs_have_no_health_check(name: str) -> None:
    check = SERVICES[name].get("healthcheck")
    assert check is None or check.get("disable") is True


@pytest.mark.parametrize("name", [n for n in SERVICES if n not in ONE_SHOT])
def test_every_long_running_service_has_a_health_check(name: str) -> None:
    assert (SERVICES[name].get("healthcheck") or {}).get("test"), name


@pytest.mark.parametrize("name", [*WORKER_LANES, CONSUMER])
def test_pool_health_checks_ask_liveness_only_of_the_file_the_process_touches(name: str) -> None:
    service = SERVICES[name]
    assert service["healthcheck"]["test"][0] == "CMD", "the check runs without a shell"
    path, params = parse(health_argv(service))
    assert path == "dataservice health"
    assert not params["deep"]
    _, process = parse(command(service))
    assert process["alive_file"] is not None, f"{name} touches no alive file"
    assert [str(path) for path in params["alive_file"]] == [str(process["alive_file"])]


@pytest.mark.parametrize(("name", "page"), OWN_PAGES.items())
def test_web_services_check_a_page_of_their_own_on_their_own_port(name: str, page: str) -> None:
    service = SERVICES[name]
    words = " ".join(health_argv(service))
    urls = re.findall(r"http://[^\s'\"]+", words)
    assert len(urls) == 1, f"{name}: one URL expected in {words!r}"
    match = re.fullmatch(r"http://(127\.0\.0\.1|localhost):(\d+)(/\S*)", urls[0])
    assert match, f"{name}: {urls[0]} is not on the container's own loopback"
    assert match.group(3) == page
    # The port it serves on is the one compose publishes.
    listening = {port for _, port in published_ports(service)}
    assert {match.group(2)} == listening, f"{name}: checks port {match.group(2)}"
