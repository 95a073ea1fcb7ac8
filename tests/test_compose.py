"""compose/docker-compose.yml agrees with the code it runs.

The compose file is parsed, never run: no container engine is needed. Values
are read the way compose would substitute them with no ``.env`` file and no
variables exported, so every ``${NAME:-default}`` takes its default.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import typer
import typer.main
import yaml

import dataservice.cli
from dataservice.config import Config, load_config
from dataservice.enums import LaneName
from dataservice.errors import ConfigError
from dataservice.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"

# Database connections kept free for everything that is not a worker thread:
# the migration job, health checks, operators' sessions, other clients.
# compose/README.md explains the arithmetic with the same number.
RESERVED_CONNECTIONS = 20

INFRASTRUCTURE = ("redis", "mariadb")
PROJECT_SERVICES = ("migrate", "worker-interactive", "worker-batch")
WORKER_LANES = {"worker-interactive": LaneName.INTERACTIVE, "worker-batch": LaneName.BATCH}

# A malformed command line, whichever click the installed typer is built on.
_USAGE_ERRORS = (typer.TyperException, click.ClickException)
_REFERENCE = re.compile(r"\$(\$|\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")
_BRACED_WITH_DEFAULT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*):?-(.*)\}", re.DOTALL)


# Reading the compose file --------------------------------------------------


def _substitute(match: re.Match[str]) -> str:
    body = match.group(1)
    if body == "$":
        return "$"
    braced = _BRACED_WITH_DEFAULT.fullmatch(body)
    if braced is None:
        pytest.fail(
            f"${body} in {COMPOSE_FILE.name} has no default: write ${{NAME:-default}} so the "
            "stack starts without a .env file"
        )
    return braced.group(2)


def _interpolate(node: Any) -> Any:
    if isinstance(node, str):
        return _REFERENCE.sub(_substitute, node)
    if isinstance(node, list):
        return [_interpolate(item) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate(value) for key, value in node.items()}
    return node


def _load_compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(document, dict), f"{COMPOSE_FILE} is not a mapping"
    interpolated: dict[str, Any] = _interpolate(document)
    return interpolated


COMPOSE = _load_compose()
SERVICES: dict[str, dict[str, Any]] = COMPOSE.get("services") or {}


def _argv(value: str | list[Any]) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(item) for item in value]


def _command(service: Mapping[str, Any]) -> list[str]:
    entrypoint = _argv(service.get("entrypoint") or [])
    return entrypoint + _argv(service.get("command") or [])


def _environment(service: Mapping[str, Any]) -> dict[str, str]:
    assert "env_file" not in service, "environment must be visible in the compose file itself"
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = (str(item).partition("=") for item in raw)
        return {name: value for name, _, value in pairs}
    return {name: "" if value is None else str(value) for name, value in raw.items()}


def _dataservice_environment(service: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in _environment(service).items() if k.startswith("DATASERVICE_")}


def _settings(service: Mapping[str, Any]) -> Settings:
    return Settings.from_env(_dataservice_environment(service))


def _bind_mounts(service: Mapping[str, Any]) -> list[tuple[Path, str, bool]]:
    """(host source, container target, read only) for each bind mount."""
    mounts = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            read_only = bool(mode) and "ro" in mode[0].split(",")
        else:
            if volume.get("type") != "bind":
                continue
            source, target = volume["source"], volume["target"]
            read_only = bool(volume.get("read_only"))
        if source.startswith((".", "/", "~")):
            mounts.append(((COMPOSE_DIR / source).resolve(), target, read_only))
    return mounts


def _mounted_config(service: Mapping[str, Any]) -> Config:
    """The queues.yml this service runs with, read from the host file mounted there."""
    target = str(_settings(service).config_path)
    for source, mount_target, _ in _bind_mounts(service):
        if mount_target == target:
            return load_config(source)
    pytest.fail(f"DATASERVICE_CONFIG={target} is not a bind-mounted file")


def _server_options(service: Mapping[str, Any]) -> dict[str, str]:
    """A server command's ``--name=value`` options, keyed by ``name_with_underscores``."""
    options = {}
    for token in _command(service):
        if token.startswith("--"):
            name, _, value = token[2:].partition("=")
            options[name.replace("-", "_").lower()] = value
    return options


def _project_image() -> str | None:
    for service in SERVICES.values():
        if "build" in service:
            image = service.get("image")
            return image if isinstance(image, str) else None
    return None


def _built_from_project(service: Mapping[str, Any]) -> bool:
    image = _project_image()
    return "build" in service or (image is not None and service.get("image") == image)


# Resolving a command line against the real ``dataservice`` CLI -------------


def _resolve(argv: list[str]) -> tuple[str, Any, list[str]]:
    """Walk the CLI's groups: the subcommand path, its command object, and its arguments."""
    assert argv, "the service has no command"
    assert argv[0] == "dataservice", f"{argv[0]!r} is not the dataservice console script"
    command: Any = typer.main.get_command(dataservice.cli.app)
    path = ["dataservice"]
    rest = argv[1:]
    while hasattr(command, "commands"):
        known = sorted(command.commands)
        assert rest, f"`{' '.join(path)}` needs a subcommand: one of {known}"
        name = rest[0]
        assert name in command.commands, f"`{' '.join(path)}` has no subcommand {name!r} ({known})"
        command = command.commands[name]
        path.append(name)
        rest = rest[1:]
    return " ".join(path), command, rest


def _parse(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """The subcommand path and its parsed parameters; fails the test on a bad command line."""
    path, command, rest = _resolve(argv)
    known_options = {opt for param in command.params for opt in param.opts + param.secondary_opts}
    for token in rest:
        if token.startswith("-"):
            option = token.split("=", 1)[0]
            assert option in known_options, (
                f"`{path}` has no option {option}; it has {sorted(known_options)}"
            )
    try:
        context = command.make_context(path, list(rest))
    except _USAGE_ERRORS as exc:
        pytest.fail(f"`{' '.join(argv)}` is not a valid command line: {exc}")
    return path, dict(context.params)


def _worker_lane(service: Mapping[str, Any]) -> LaneName:
    path, params = _parse(_command(service))
    assert path == "dataservice worker", f"not a worker command: {path}"
    return LaneName(params["lane"])


# The services ----------------------------------------------------------------


def test_the_stack_has_redis_mariadb_a_migration_job_and_a_worker_pool_per_lane() -> None:
    missing = set(INFRASTRUCTURE + PROJECT_SERVICES) - set(SERVICES)
    assert not missing, f"missing services: {sorted(missing)}"
    assert str(SERVICES["redis"]["image"]).startswith("redis:7")
    assert str(SERVICES["mariadb"]["image"]).startswith("mariadb:10.11")
    for name in PROJECT_SERVICES:
        assert _built_from_project(SERVICES[name]), f"{name} does not run the project image"


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


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_project_service_command_is_a_real_dataservice_subcommand(name: str) -> None:
    _parse(_command(SERVICES[name]))


def test_migrate_runs_db_upgrade_once_after_mariadb_is_healthy() -> None:
    migrate = SERVICES["migrate"]
    path, _ = _parse(_command(migrate))
    assert path == "dataservice db upgrade"
    assert migrate["depends_on"]["mariadb"]["condition"] == "service_healthy"
    assert str(migrate.get("restart", "no")) in {"no", "False", "false"}


@pytest.mark.parametrize(("name", "lane"), WORKER_LANES.items())
def test_each_worker_pool_consumes_its_own_lane(name: str, lane: LaneName) -> None:
    assert _worker_lane(SERVICES[name]) is lane


def test_every_lane_has_a_worker_pool() -> None:
    lanes = {
        _worker_lane(service)
        for service in SERVICES.values()
        if _built_from_project(service) and _parse(_command(service))[0] == "dataservice worker"
    }
    assert lanes == set(LaneName)


@pytest.mark.parametrize("name", WORKER_LANES)
def test_workers_start_only_after_redis_mariadb_and_the_migration(name: str) -> None:
    depends_on = SERVICES[name]["depends_on"]
    assert depends_on["redis"]["condition"] == "service_healthy"
    assert depends_on["mariadb"]["condition"] == "service_healthy"
    assert depends_on["migrate"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", WORKER_LANES)
def test_worker_pools_pin_their_replica_count(name: str) -> None:
    replicas = (SERVICES[name].get("deploy") or {}).get("replicas")
    assert isinstance(replicas, int), f"{name}: deploy.replicas must be set to a number"
    assert replicas >= 1


# Environment and configuration ---------------------------------------------


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_project_service_environment_is_accepted_by_settings(name: str) -> None:
    environment = _dataservice_environment(SERVICES[name])
    assert environment, f"{name} sets no DATASERVICE_* variable"
    try:
        Settings.from_env(environment)
    except ConfigError as exc:
        pytest.fail(f"{name}: {exc}")


@pytest.mark.parametrize("name", list(SERVICES))
def test_no_service_sets_a_dataservice_variable_settings_rejects(name: str) -> None:
    environment = _dataservice_environment(SERVICES[name])
    try:
        Settings.from_env(environment)
    except ConfigError as exc:
        pytest.fail(f"{name}: {exc}")


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_project_services_reach_redis_and_mariadb_by_service_name_not_localhost(
    name: str,
) -> None:
    settings = _settings(SERVICES[name])
    urls = {
        "broker": settings.broker_url,
        "result backend": settings.result_backend_url,
        "redis": settings.redis_url,
        "database": settings.database_url,
    }
    for what, url in urls.items():
        host = urlsplit(url).hostname
        assert host in SERVICES, f"{name}: the {what} URL points at {host!r}, not a service"


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_project_services_read_queues_yml_from_a_read_only_mount(name: str) -> None:
    service = SERVICES[name]
    target = str(_settings(service).config_path)
    mounts = {mount_target: (source, ro) for source, mount_target, ro in _bind_mounts(service)}
    assert target in mounts, f"{name}: DATASERVICE_CONFIG={target} is not mounted"
    source, read_only = mounts[target]
    assert source == ROOT / "queues.yml"
    assert read_only, f"{name}: queues.yml must be mounted read-only"
    _mounted_config(service)  # and it is a valid configuration


# MariaDB -------------------------------------------------------------------


def test_worker_connections_plus_the_reserve_fit_within_mariadb_max_connections() -> None:
    options = _server_options(SERVICES["mariadb"])
    assert "max_connections" in options, "mariadb must set --max-connections explicitly"
    max_connections = int(options["max_connections"])
    used = 0
    breakdown = []
    for name, service in SERVICES.items():
        if not _built_from_project(service) or _parse(_command(service))[0] != "dataservice worker":
            continue
        lane = _worker_lane(service)
        # One database connection per worker thread: the pool is sized to the
        # lane's concurrency and never overflows.
        concurrency = _mounted_config(service).lanes[lane].concurrency
        replicas = int((service.get("deploy") or {}).get("replicas", 1))
        used += replicas * concurrency
        breakdown.append(f"{name}: {replicas} x {concurrency}")
    assert used, "no worker service found"
    total = used + RESERVED_CONNECTIONS
    assert total <= max_connections, (
        f"{' + '.join(breakdown)} + reserve {RESERVED_CONNECTIONS} = {total} "
        f"exceeds max_connections {max_connections}"
    )


def test_mariadb_holds_the_whole_service_connection_budget_plus_the_reserve() -> None:
    max_connections = int(_server_options(SERVICES["mariadb"])["max_connections"])
    for name, service in SERVICES.items():
        if not _built_from_project(service) or _parse(_command(service))[0] != "dataservice worker":
            continue
        budget = _mounted_config(service).budget
        assert budget.max_connections + RESERVED_CONNECTIONS <= max_connections, name
        replicas = int((service.get("deploy") or {}).get("replicas", 1))
        assert replicas <= budget.max_replicas, f"{name}: {replicas} > budget.max_replicas"


def test_mariadb_writes_a_row_based_binlog_with_full_images_and_metadata() -> None:
    options = _server_options(SERVICES["mariadb"])
    assert "log_bin" in options, "the binary log is not enabled (--log-bin)"
    assert options.get("binlog_format", "").upper() == "ROW"
    assert options.get("binlog_row_image", "").upper() == "FULL"
    assert options.get("binlog_row_metadata", "").upper() == "FULL"
    assert int(options.get("server_id") or 0) > 0, "--server-id must be set"


# Health checks -------------------------------------------------------------


def _health_test(service: Mapping[str, Any]) -> str:
    check = service.get("healthcheck") or {}
    test = check.get("test")
    assert test, "no health check"
    return " ".join(_argv(test))


def test_redis_and_mariadb_health_checks_ping_the_server_itself() -> None:
    assert "redis-cli ping" in _health_test(SERVICES["redis"])
    assert "mariadb-admin ping" in _health_test(SERVICES["mariadb"])


def test_the_migration_job_has_no_health_check() -> None:
    check = SERVICES["migrate"].get("healthcheck")
    assert check is None or check.get("disable") is True


@pytest.mark.parametrize("name", list(WORKER_LANES))
def test_worker_health_checks_ask_liveness_only_of_the_file_the_worker_touches(name: str) -> None:
    # A worker health check that tested the database once took a whole fleet
    # down: every replica failed it at the same moment. Liveness never asks it.
    service = SERVICES[name]
    test = _argv(service["healthcheck"]["test"])
    assert test[0] == "CMD", "the check runs the command itself, not through a shell"
    path, params = _parse(test[1:])
    assert path == "dataservice health"
    assert not params["deep"], "--deep touches the database"
    _, worker = _parse(_command(service))
    assert worker["alive_file"] is not None, "the worker touches no alive file"
    assert params["alive_file"] == [worker["alive_file"]]


@pytest.mark.parametrize("name", PROJECT_SERVICES)
def test_project_services_read_the_callers_file_from_a_read_only_mount(name: str) -> None:
    service = SERVICES[name]
    target = str(_settings(service).callers_file)
    mounts = {mount_target: (source, ro) for source, mount_target, ro in _bind_mounts(service)}
    assert target in mounts, f"{name}: DATASERVICE_CALLERS_FILE={target} is not mounted"
    source, read_only = mounts[target]
    # Kept beside the compose file, never in the image or in queues.yml.
    assert source == ROOT / "compose" / "callers.yml"
    assert read_only
