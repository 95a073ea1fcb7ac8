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
}


_PATH_FIELDS = frozenset({"config_path", "callers_file"})


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
        for name in (
            "DATASERVICE_BROKER_URL",
            "DATASERVICE_RESULT_BACKEND_URL",
            "DATASERVICE_REDIS_URL",
        ):
            if name not in env:
                continue
            if name == "DATASERVICE_BROKER_URL" and env[name].startswith(AMQP_SCHEMES):
                continue
            if is_sentinel(env[name]):
                SentinelTarget.parse(env[name], name)
                continue
            if not env[name].startswith(("redis://", "rediss://", "unix://")):
                also = " (the broker: or amqp://, amqps://)" if "BROKER" in name else ""
                raise ConfigError(
                    f"{name} must be a redis://, rediss://, unix:// or sentinel:// URL{also}"
                )
            redis_tls(env[name], name)
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
