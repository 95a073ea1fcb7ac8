"""Where things are: ``DATASERVICE_*`` environment variables, typed and checked.

Secrets never live in ``queues.yml``; the URLs (which may carry Redis
passwords) and the callers file come from the environment.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dataservice.config.model import Config, load_config
from dataservice.errors import ConfigError
from dataservice.redis.endpoints import SentinelTarget, is_sentinel
from dataservice.redis.tls import redis_tls

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
AMQP_SCHEMES = ("amqp://", "amqps://")
DEFAULT_DATABASE_URL = "mysql+mysqldb://root@127.0.0.1:3306/dataservice"
# Relative: the working directory's queues.yml, as with other tools' config files.
DEFAULT_CONFIG_PATH = Path("queues.yml")

_ENV_PREFIX = "DATASERVICE_"
_ENV_FIELDS = {
    "DATASERVICE_CONFIG": "config_path",
    "DATASERVICE_BROKER_URL": "broker_url",
    "DATASERVICE_RESULT_BACKEND_URL": "result_backend_url",
    "DATASERVICE_REDIS_URL": "redis_url",
    "DATASERVICE_DATABASE_URL": "database_url",
    "DATASERVICE_CALLERS_FILE": "callers_file",
    "DATASERVICE_CHANGES_DATABASE_URL": "changes_database_url",
    "DATASERVICE_FLOWER_AUTH": "flower_auth",
    "DATASERVICE_CELLS_FILE": "cells_file",
    "DATASERVICE_CELL": "cell",
}


_PATH_FIELDS = frozenset({"config_path", "callers_file", "cells_file"})
_REDIS_URL_FIELDS = {
    "DATASERVICE_BROKER_URL": "broker_url",
    "DATASERVICE_RESULT_BACKEND_URL": "result_backend_url",
    "DATASERVICE_REDIS_URL": "redis_url",
}
# A cell's entry in the cells file: its Redis, and optionally a broker and a
# result backend of their own (each the cell's Redis when not given).
_CELL_KEYS = frozenset({"redis_url", "broker_url", "result_backend_url"})


@dataclass(frozen=True, slots=True)
class Settings:
    """Where things are: the configuration file and the services' URLs."""

    config_path: Path = DEFAULT_CONFIG_PATH
    broker_url: str = DEFAULT_REDIS_URL
    result_backend_url: str = DEFAULT_REDIS_URL
    redis_url: str = DEFAULT_REDIS_URL
    database_url: str = DEFAULT_DATABASE_URL
    # Caller keys (and Redis passwords); see dataservice.security.callers. None: not configured.
    callers_file: Path | None = None
    # The change-stream consumer's own, least-privilege user (docs/changes.md).
    # None: it connects as the service does.
    changes_database_url: str | None = None
    # Flower's basic authentication, "user:password" (several: comma-separated).
    # None: `dataservice flower` refuses to start unless told --no-auth on loopback.
    flower_auth: str | None = dataclasses.field(default=None, repr=False)
    # Each cell's URLs (dataservice.config.cells); None: no cells file.
    cells_file: Path | None = None
    # The cell this process serves (a worker's, the change consumer's); None: not said.
    cell: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        unknown = sorted(k for k in env if k.startswith(_ENV_PREFIX) and k not in _ENV_FIELDS)
        if unknown:
            raise ConfigError(f"unknown environment variable(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name, field in _ENV_FIELDS.items():
            value = env.get(name)
            if value is None:
                continue
            if not value.strip():
                raise ConfigError(f"{name} is set but empty")
            values[field] = Path(value) if field in _PATH_FIELDS else value
        for name in _REDIS_URL_FIELDS:
            if name in env:
                _check_redis_url(env[name], name, broker="BROKER" in name)
        for name in ("DATASERVICE_DATABASE_URL", "DATASERVICE_CHANGES_DATABASE_URL"):
            if name in env and not env[name].startswith("mysql"):
                raise ConfigError(f"{name} must be a mysql+mysqldb:// URL")
        return cls(**values)

    @property
    def broker_is_amqp(self) -> bool:
        """The broker is RabbitMQ (``amqp://``, ``amqps://``), not Redis."""
        return self.broker_url.startswith(AMQP_SCHEMES)

    @property
    def admission_url(self) -> str:
        """The Redis that keeps admission's books (the lanes' held requests,
        bytes, drain rates and service times): the broker's when it is Redis,
        where the admission script pushes the message in the same step; else
        the result backend's, where every answer gives its request's bytes back."""
        return self.result_backend_url if self.broker_is_amqp else self.broker_url

    @property
    def changes_url(self) -> str:
        """Where the change-stream consumer connects: its own user, else the service's."""
        return self.changes_database_url or self.database_url

    def to_env(self) -> dict[str, str]:
        """The ``DATASERVICE_*`` variables that reproduce these settings in another process."""
        return {
            name: str(getattr(self, field))
            for name, field in _ENV_FIELDS.items()
            if getattr(self, field) is not None
        }

    def load(self) -> Config:
        return load_config(self.config_path)

    def for_cell(self, cell: str) -> Settings:
        """These settings with ``cell``'s URLs from the cells file."""
        if self.cells_file is None:
            raise ConfigError(
                f"cell {cell!r}: cells are named in the configuration but "
                "DATASERVICE_CELLS_FILE, which holds their URLs, is not set"
            )
        entry = _cells(self.cells_file).get(cell)
        if entry is None:
            raise ConfigError(f"{self.cells_file}: no cell {cell!r}")
        redis_url = entry["redis_url"]
        return dataclasses.replace(
            self,
            redis_url=redis_url,
            broker_url=entry.get("broker_url", redis_url),
            result_backend_url=entry.get("result_backend_url", redis_url),
            cell=cell,
        )

    def for_caller(self, caller: str, config: Config) -> Settings:
        """The settings of the cell ``caller`` belongs to (these, without cells)."""
        cell = config.cell_of(caller)
        if cell is None:
            return self
        if self.cell is not None and self.cell != cell:
            raise ConfigError(
                f"caller {caller!r} belongs to cell {cell!r}, not to DATASERVICE_CELL "
                f"({self.cell!r}): pin it in cells.callers to move it"
            )
        return self.for_cell(cell)

    def for_worker(self, config: Config) -> Settings:
        """The settings of the cell this worker serves (these, without cells)."""
        if not config.cells.names:
            return self
        if self.cell is None:
            raise ConfigError(
                f"cells {', '.join(config.cells.names)} are configured: DATASERVICE_CELL "
                "(or --cell) must name the one this process serves"
            )
        if self.cell not in config.cells.names:
            raise ConfigError(
                f"DATASERVICE_CELL: {self.cell!r} is not one of the cells configured "
                f"({', '.join(config.cells.names)})"
            )
        return self.for_cell(self.cell)


def _check_redis_url(url: str, name: str, *, broker: bool) -> None:
    if broker and url.startswith(AMQP_SCHEMES):
        return
    if is_sentinel(url):
        SentinelTarget.parse(url, name)
        return
    if not url.startswith(("redis://", "rediss://", "unix://")):
        also = " (the broker: or amqp://, amqps://)" if broker else ""
        raise ConfigError(
            f"{name} must be a redis://, rediss://, unix://, sentinel:// or sentinels:// URL{also}"
        )
    redis_tls(url, name)


def _cells(path: Path) -> dict[str, dict[str, str]]:
    """The cells file: each cell's URLs, checked as the environment's are."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError:
        raise ConfigError(f"{path}: not valid YAML") from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, dict) or set(data) != {"cells"}:
        raise ConfigError(f"{path}: expected a mapping with one key, cells")
    checked: dict[str, dict[str, str]] = {}
    for cell, entry in cells.items():
        where = f"{path}: cells.{cell}"
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
            raise ConfigError(f"{where}: expected a mapping of URLs")
        unknown = sorted(set(entry) - _CELL_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s): {', '.join(unknown)}")
        if "redis_url" not in entry:
            raise ConfigError(f"{where}: redis_url is required")
        for key, url in entry.items():
            _check_redis_url(url, f"{where}.{key}", broker=key == "broker_url")
        checked[str(cell)] = dict(entry)
    return checked
