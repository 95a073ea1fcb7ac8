"""The machine, the interpreter and the versions a measurement ran on: what goes
next to its figures."""

from __future__ import annotations

import contextlib
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def version(dist: str) -> str:
    """The installed version of the distribution ``dist``, ``-`` if absent."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def database_version(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SELECT VERSION()")).scalar())
    finally:
        engine.dispose()


def host() -> dict[str, Any]:
    """The machine and interpreter a run is on, and its load as it starts."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": load,
    }


def machine_info(redis_server_url: str, database_url: str) -> dict[str, Any]:
    """:func:`host`, the client libraries' versions and the servers'."""
    from google.protobuf.internal import api_implementation

    client = redis.Redis.from_url(redis_server_url)
    try:
        redis_version = str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()
    return {
        **host(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "redis_py": version("redis"),
        "hiredis": version("hiredis"),
        "sqlalchemy": version("sqlalchemy"),
        "mysqlclient": version("mysqlclient"),
        "protobuf": f"{version('protobuf')} ({api_implementation.Type()})",
        "redis_server": redis_version,
        "mariadb": database_version(database_url),
    }
