"""compose/docker-compose.yml as the tests read it: parsed, never run.

Values are read the way compose substitutes them with no ``.env`` file and no
variables exported: every ``${NAME:-default}`` takes its default, and a
variable the file requires (``${NAME:?message}``, the credentials that have no
default) takes the test value in :data:`REQUIRED_VARIABLES`. Command lines are
resolved against the real ``dataservice`` CLI (its typer/click tree), options
included.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import celery
import click
import pytest
import typer
import typer.main
import yaml
from celery.bin.worker import worker as celery_worker

import dataservice.cli
from dataservice.config.model import Config, load_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.worker.entry import WORKER_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"

# The variables the file requires, with a value to read it by: credentials,
# which must not have a default in a committed file.
REQUIRED_VARIABLES = {
    "FLOWER_AUTH": "ops:compose-test",
    "GRAFANA_ADMIN_PASSWORD": "compose-test",
    "RABBITMQ_PASSWORD": "compose-test",
}

INFRASTRUCTURE = ("redis", "mariadb")
ONE_SHOT = ("migrate", "changes-user")
WORKER_LANES = {"worker-interactive": LaneName.INTERACTIVE, "worker-batch": LaneName.BATCH}
CONSUMER = "changes"
PROJECT_SERVICES = (*ONE_SHOT, *WORKER_LANES, CONSUMER, "flower")
MONITORING = ("prometheus", "grafana")

# A malformed command line, whichever click the installed typer is built on.
_USAGE_ERRORS = (typer.TyperException, click.ClickException)
_REFERENCE = re.compile(r"\$(\$|\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")
_BRACED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?])(.*)\}", re.DOTALL)


def _substitute(match: re.Match[str]) -> str:
    body = match.group(1)
    if body == "$":
        return "$"
    braced = _BRACED.fullmatch(body)
    if braced is None:
        pytest.fail(
            f"${body} in {COMPOSE_FILE.name} has no default: write ${{NAME:-default}} so the "
            "stack starts without a .env file (or ${NAME:?message} for a credential)"
        )
    name, operator, rest = braced.groups()
    if operator.endswith("-"):
        return rest
    if name not in REQUIRED_VARIABLES:
        pytest.fail(f"${{{name}:?...}}: a required variable the tests have no value for")
    return REQUIRED_VARIABLES[name]


def _interpolate(node: Any) -> Any:
    if isinstance(node, str):
        return _REFERENCE.sub(_substitute, node)
    if isinstance(node, list):
        return [_interpolate(item) for item in node]
    if isinstance(node, dict):
        return {key: _interpolate(value) for key, value in node.items()}
    return node


def interpolated(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with every variable substituted as compose would here."""
    result: dict[str, Any] = _interpolate(document)
    return result


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge of one mapping over another, for what these files hold:
    mappings merge key by key, anything else is replaced."""
    result = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def load_yaml(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(document, dict), f"{path} is not a mapping"
    return document


_RAW = load_yaml(COMPOSE_FILE)
COMPOSE: dict[str, Any] = _interpolate(_RAW)
SERVICES: dict[str, dict[str, Any]] = COMPOSE.get("services") or {}
# As written, before substitution: where a value comes from.
RAW_SERVICES: dict[str, dict[str, Any]] = _RAW.get("services") or {}


def argv(value: str | list[Any]) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(item) for item in value]


def command(service: Mapping[str, Any]) -> list[str]:
    entrypoint = argv(service.get("entrypoint") or [])
    return entrypoint + argv(service.get("command") or [])


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    assert "env_file" not in service, "environment must be visible in the compose file itself"
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        pairs = (str(item).partition("=") for item in raw)
        return {name: value for name, _, value in pairs}
    return {name: "" if value is None else str(value) for name, value in raw.items()}


def dataservice_environment(service: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in environment(service).items() if k.startswith("DATASERVICE_")}


def settings(service: Mapping[str, Any]) -> Settings:
    return Settings.from_env(dataservice_environment(service))


def bind_mounts(service: Mapping[str, Any]) -> list[tuple[Path, str, bool]]:
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


def mounted_config(service: Mapping[str, Any]) -> Config:
    """The queues.yml this service runs with, read from the host file mounted there."""
    target = str(settings(service).config_path)
    for source, mount_target, _ in bind_mounts(service):
        if mount_target == target:
            return load_config(source)
    pytest.fail(f"DATASERVICE_CONFIG={target} is not a bind-mounted file")


def server_options(service: Mapping[str, Any]) -> dict[str, str]:
    """A server command's ``--name=value`` options, keyed by ``name_with_underscores``."""
    options = {}
    for token in command(service):
        if token.startswith("--"):
            name, _, value = token[2:].partition("=")
            options[name.replace("-", "_").lower()] = value
    return options


def published_ports(service: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(host address, container port) of each published port, short syntax
    (``[address:]host port:container port``); no address: every interface."""
    found = []
    for entry in service.get("ports") or []:
        host, _, container = str(entry).rpartition(":")
        address = host.rpartition(":")[0] if ":" in host else ""
        found.append((address, container.split("/")[0]))
    return found


def project_image() -> str | None:
    for service in SERVICES.values():
        if "build" in service:
            image = service.get("image")
            return image if isinstance(image, str) else None
    return None


def built_from_project(service: Mapping[str, Any]) -> bool:
    image = project_image()
    return "build" in service or (image is not None and service.get("image") == image)


def replicas(service: Mapping[str, Any]) -> int:
    return int((service.get("deploy") or {}).get("replicas", 1))


# Resolving a command line against the real ``dataservice`` CLI -------------


def resolve(line: list[str]) -> tuple[str, Any, list[str]]:
    """Walk the CLI's groups: the subcommand path, its command object, and its arguments."""
    assert line, "the service has no command"
    assert line[0] == "dataservice", f"{line[0]!r} is not the dataservice console script"
    # The command as installed: the tooling's commands too.
    dataservice.cli.add_plugins([])
    node: Any = typer.main.get_command(dataservice.cli.app)
    path = ["dataservice"]
    rest = line[1:]
    while hasattr(node, "commands"):
        known = sorted(node.commands)
        assert rest, f"`{' '.join(path)}` needs a subcommand: one of {known}"
        name = rest[0]
        assert name in node.commands, f"`{' '.join(path)}` has no subcommand {name!r} ({known})"
        node = node.commands[name]
        path.append(name)
        rest = rest[1:]
    return " ".join(path), node, rest


def check_options(path: str, node: click.Command, rest: list[str]) -> None:
    """Every option in ``rest`` is one ``node`` (the command at ``path``) has."""
    known_options = {opt for param in node.params for opt in param.opts + param.secondary_opts}
    for token in rest:
        if token.startswith("-"):
            option = token.split("=", 1)[0]
            assert option in known_options, (
                f"`{path}` has no option {option}; it has {sorted(known_options)}"
            )


def parse(line: list[str]) -> tuple[str, dict[str, Any]]:
    """The subcommand path and its parsed parameters; fails the test on a bad command line."""
    if line and line[0] == "celery":
        return parse_celery(line)
    path, node, rest = resolve(line)
    check_options(path, node, rest)
    try:
        context = node.make_context(path, list(rest))
    except _USAGE_ERRORS as exc:
        pytest.fail(f"`{' '.join(line)}` is not a valid command line: {exc}")
    return path, dict(context.params)


# The Celery apps of the project's workers/ package, by module.
CELERY_APPS = {f"workers.{lane.value}": lane for lane in LaneName} | {"workers.changes": None}


def parse_celery(line: list[str]) -> tuple[str, dict[str, Any]]:
    """``celery -A workers.<app> worker [options]``: the path (``celery -A
    workers.interactive worker``) and the options as Celery's own worker
    command parses them, with the options the service's apps add."""
    assert line[:2] in (["celery", "-A"], ["celery", "--app"]), f"{line[:2]}: no -A"
    module, rest = line[2], line[3:]
    assert module in CELERY_APPS, f"{module!r} is not one of the apps in workers/"
    assert (ROOT / Path(*module.split("."))).with_suffix(".py").is_file(), module
    assert rest[:1] == ["worker"], f"`celery -A {module}` runs {rest[:1]}, not a worker"
    path = f"celery -A {module} worker"
    node = click.Command("worker", params=[*celery_worker.params, *WORKER_OPTIONS])
    check_options(path, node, rest[1:])
    # Celery's pool option asks its app for the configured pool.
    app = celery.Celery("compose-check", set_as_current=False)
    try:
        context = node.make_context(path, list(rest[1:]), obj=SimpleNamespace(app=app))
    except _USAGE_ERRORS as exc:
        pytest.fail(f"`{' '.join(line)}` is not a valid command line: {exc}")
    finally:
        app.close()
    return path, dict(context.params)


def subcommand(service: Mapping[str, Any]) -> str | None:
    """``dataservice worker``, ``celery -A workers.interactive worker`` and the
    like, or None for a service that runs something else."""
    line = command(service)
    return parse(line)[0] if line and line[0] in ("dataservice", "celery") else None


def worker_lane(service: Mapping[str, Any]) -> LaneName:
    line = command(service)
    path, params = parse(line)
    if path == "dataservice worker":
        return LaneName(params["lane"])
    assert path.startswith("celery -A workers."), path
    lane = CELERY_APPS[line[2]]
    assert lane is not None, f"not a lane's worker: {path}"
    return lane


def is_lane_worker(service: Mapping[str, Any]) -> bool:
    """A pool of a lane: ``dataservice worker`` or a lane's Celery app."""
    path = subcommand(service)
    if path is None:
        return False
    return path == "dataservice worker" or (
        path.startswith("celery -A workers.") and CELERY_APPS.get(command(service)[2]) is not None
    )


def is_change_consumer(service: Mapping[str, Any]) -> bool:
    """The change consumer: ``dataservice changes`` or ``celery -A workers.changes worker``."""
    return subcommand(service) in ("dataservice changes", "celery -A workers.changes worker")


def worker_threads(service: Mapping[str, Any]) -> int:
    """The threads of a lane's pool: its ``--concurrency`` or the lane's in queues.yml."""
    _, params = parse(command(service))
    given = params.get("concurrency")
    return int(given) if given else mounted_config(service).lanes[worker_lane(service)].concurrency


def health_argv(service: Mapping[str, Any]) -> list[str]:
    """The health check's command line, whether exec (CMD) or shell (CMD-SHELL) form."""
    test = (service.get("healthcheck") or {}).get("test")
    assert test, "no health check"
    words = argv(test)
    if words[0] == "CMD-SHELL":
        return shlex.split(" ".join(words[1:]))
    return words[1:] if words[0] == "CMD" else words


def dataservice_command_lines() -> Iterator[tuple[str, list[str]]]:
    """(where, command line) of every ``dataservice`` or ``celery`` run:
    commands and health checks."""
    for name, service in SERVICES.items():
        line = command(service)
        if line and line[0] in ("dataservice", "celery"):
            yield f"{name} command", line
        if (service.get("healthcheck") or {}).get("test"):
            check = health_argv(service)
            if check and check[0] == "dataservice":
                yield f"{name} healthcheck", check
