"""compose/docker-compose.yml runs the code it names: the services, their
command lines against the real CLI, their environment and mounts.

The file is parsed, never run (tests/harness/compose_file.py): no container engine is
needed. The budget, the health checks, the change consumer and monitoring have
files of their own (tests/project/test_compose_*.py).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ConfigError
from tests.harness.compose_file import (
    COMPOSE_DIR,
    CONSUMER,
    INFRASTRUCTURE,
    MONITORING,
    ONE_SHOT,
    PROJECT_SERVICES,
    ROOT,
    SERVICES,
    WORKER_LANES,
    bind_mounts,
    built_from_project,
    command,
    dataservice_command_lines,
    dataservice_environment,
    is_lane_worker,
    mounted_config,
    parse,
    published_ports,
    settings,
    subcommand,
    worker_lane,
)

# Which subcommand each project service runs.
SUBCOMMANDS = {
    "migrate": "dataservice db upgrade",
    "changes-user": "dataservice db changes-user",
    "worker-interactive": "celery -A workers.interactive worker",
    "worker-batch": "celery -A workers.batch worker",
    CONSUMER: "celery -A workers.changes worker",
    "flower": "dataservice flower",
}
# The URL each project service's work needs, set in its own environment.
DATABASE_URLS = {
    "migrate": ("DATASERVICE_DATABASE_URL",),
    "changes-user": ("DATASERVICE_DATABASE_URL", "DATASERVICE_CHANGES_DATABASE_URL"),
    "worker-interactive": ("DATASERVICE_DATABASE_URL",),
    "worker-batch": ("DATASERVICE_DATABASE_URL",),
    CONSUMER: ("DATASERVICE_CHANGES_DATABASE_URL",),
    "flower": (),
}
MONITORING_IMAGES = {"prometheus": "prom/prometheus", "grafana": "grafana/grafana"}
# Every `dataservice ...` the file runs: the services' commands and their health checks.
COMMAND_LINES = list(dataservice_command_lines())


def test_the_stack_has_its_services() -> None:
    expected = {*INFRASTRUCTURE, *PROJECT_SERVICES, *MONITORING}
    missing = expected - set(SERVICES)
    assert not missing, f"missing services: {sorted(missing)}"
    assert str(SERVICES["redis"]["image"]).startswith("redis:7")
    assert str(SERVICES["mariadb"]["image"]).startswith("mariadb:10.11")
    for name in PROJECT_SERVICES:
        assert built_from_project(SERVICES[name]), f"{name} does not run the project image"


@pytest.mark.parametrize(("name", "repository"), MONITORING_IMAGES.items())
def test_monitoring_runs_the_official_images_at_a_pinned_version(
    name: str, repository: str
) -> None:
    image = str(SERVICES[name]["image"])
    found, _, tag = image.partition(":")
    assert found == repository
    assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: pin a released version, not {tag!r}"


def test_the_project_image_is_built_from_the_repository_root_with_the_compose_dockerfile() -> None:
    builds = [service["build"] for service in SERVICES.values() if "build" in service]
    assert builds, "no service builds the project image"
    for build in builds:
        context = (COMPOSE_DIR / build["context"]).resolve()
        assert context == ROOT, f"build context {context} is not the repository root"
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile == COMPOSE_DIR / "Dockerfile"
    dockerfile_text = (COMPOSE_DIR / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", dockerfile_text, re.MULTILINE)
    for package in ("pkg-config", "gcc"):
        assert package in dockerfile_text, f"the image build does not install {package}"
    assert re.search(r"\b(default-libmysqlclient-dev|libmariadb-dev)\b", dockerfile_text)
    assert "HEALTHCHECK" not in dockerfile_text, "the image must not carry a health check"


@pytest.mark.parametrize(
    ("where", "line"), COMMAND_LINES, ids=[where for where, _ in COMMAND_LINES]
)
def test_every_dataservice_command_line_is_a_real_subcommand_with_real_options(
    where: str, line: list[str]
) -> None:
    parse(line)


@pytest.mark.parametrize(("name", "path"), SUBCOMMANDS.items())
def test_each_project_service_runs_its_subcommand(name: str, path: str) -> None:
    assert subcommand(SERVICES[name]) == path


def test_migrate_runs_db_upgrade_once_after_mariadb_is_healthy() -> None:
    migrate = SERVICES["migrate"]
    assert migrate["depends_on"]["mariadb"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", ONE_SHOT)
def test_one_shot_jobs_are_never_restarted(name: str) -> None:
    assert str(SERVICES[name].get("restart", "no")) in {"no", "False", "false"}


@pytest.mark.parametrize(("name", "lane"), WORKER_LANES.items())
def test_each_worker_pool_consumes_its_own_lane(name: str, lane: LaneName) -> None:
    assert worker_lane(SERVICES[name]) is lane


def test_every_lane_has_a_worker_pool() -> None:
    lanes = {
        worker_lane(service)
        for service in SERVICES.values()
        if built_from_project(service) and is_lane_worker(service)
    }
    assert lanes == set(LaneName)


@pytest.mark.parametrize("name", WORKER_LANES)
def test_workers_start_only_after_redis_mariadb_and_the_migration(name: str) -> None:
    depends_on = SERVICES[name]["depends_on"]
    assert depends_on["redis"]["condition"] == "service_healthy"
    assert depends_on["mariadb"]["condition"] == "service_healthy"
    assert depends_on["migrate"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", [*WORKER_LANES, CONSUMER])
def test_long_running_pools_pin_their_replica_count(name: str) -> None:
    count = (SERVICES[name].get("deploy") or {}).get("replicas")
    assert isinstance(count, int), f"{name}: deploy.replicas must be set to a number"
    assert count >= 1


@pytest.mark.parametrize("name", list(SERVICES))
def test_every_published_port_is_on_loopback_only(name: str) -> None:
    for address, port in published_ports(SERVICES[name]):
        assert address == "127.0.0.1", f"{name}: port {port} is published on {address or 'all'}"


# Environment and configuration ---------------------------------------------


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_project_service_environment_is_accepted_by_settings(name: str) -> None:
    env = dataservice_environment(SERVICES[name])
    assert env, f"{name} sets no DATASERVICE_* variable"
    try:
        Settings.from_env(env)
    except ConfigError as exc:
        pytest.fail(f"{name}: {exc}")


@pytest.mark.parametrize("name", list(SERVICES))
def test_no_service_sets_a_dataservice_variable_settings_rejects(name: str) -> None:
    try:
        Settings.from_env(dataservice_environment(SERVICES[name]))
    except ConfigError as exc:
        pytest.fail(f"{name}: {exc}")


@pytest.mark.parametrize(("name", "needed"), DATABASE_URLS.items())
def test_project_services_reach_redis_and_mariadb_by_service_name_not_localhost(
    name: str, needed: tuple[str, ...]
) -> None:
    env = dataservice_environment(SERVICES[name])
    # Only what the service's work needs: the consumer never connects as the
    # service, and Flower never connects to the database at all.
    wanted = {"DATASERVICE_BROKER_URL", "DATASERVICE_RESULT_BACKEND_URL", "DATASERVICE_REDIS_URL"}
    urls = {key for key in env if key.endswith("_URL")}
    assert urls == wanted | set(needed), f"{name}: sets {sorted(urls)}"
    for key in urls:
        host = urlsplit(env[key]).hostname
        assert host in SERVICES, f"{name}: {key} points at {host!r}, not a service"


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_project_services_read_queues_yml_from_a_read_only_mount(name: str) -> None:
    service = SERVICES[name]
    target = str(settings(service).config_path)
    mounts = {mount_target: (source, ro) for source, mount_target, ro in bind_mounts(service)}
    assert target in mounts, f"{name}: DATASERVICE_CONFIG={target} is not mounted"
    source, read_only = mounts[target]
    assert source == ROOT / "queues.yml"
    assert read_only, f"{name}: queues.yml must be mounted read-only"
    mounted_config(service)  # and it is a valid configuration


@pytest.mark.parametrize("name", WORKER_LANES)
def test_workers_read_the_callers_file_from_a_read_only_mount(name: str) -> None:
    service = SERVICES[name]
    target = str(settings(service).callers_file)
    mounts = {mount_target: (source, ro) for source, mount_target, ro in bind_mounts(service)}
    assert target in mounts, f"{name}: DATASERVICE_CALLERS_FILE={target} is not mounted"
    source, read_only = mounts[target]
    # Kept beside the compose file, never in the image or in queues.yml.
    assert source == ROOT / "compose" / "callers.yml"
    assert read_only


@pytest.mark.parametrize("name", [n for n in PROJECT_SERVICES if n not in WORKER_LANES])
def test_only_the_workers_can_read_the_callers_keys(name: str) -> None:
    service = SERVICES[name]
    assert settings(service).callers_file is None
    callers = ROOT / "compose" / "callers.yml"
    assert all(source != callers for source, _, _ in bind_mounts(service)), name


def test_every_project_service_is_listed_here() -> None:
    # A new service built from the project joins the checks above.
    project = {name for name, service in SERVICES.items() if built_from_project(service)}
    assert project == set(PROJECT_SERVICES)
    runs_the_project = (["dataservice"], ["celery"])
    assert {name for name in SERVICES if command(SERVICES[name])[:1] in runs_the_project} == project
