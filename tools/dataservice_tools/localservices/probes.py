"""Is a service answering, where is its binary, and waiting until it does."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import MySQLdb
import redis

from dataservice.errors import ServiceSetupError
from dataservice.redis import endpoints
from dataservice_tools.testkit.waits import eventually

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
START_TIMEOUT_S = 30.0


# Ports handed out below the kernel's ephemeral range: one from inside it could
# be taken, between this check and its server's bind, by any outgoing
# connection of the machine (a client's to Redis or RabbitMQ, say).
_FIRST_PORT = 20000
_TRIES = 200


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on the loopback address that nothing listens on now, chosen
    below the ephemeral range where the machine allows."""
    last = _ephemeral_start() - 1
    for _ in range(_TRIES if last > _FIRST_PORT else 0):
        port = random.randint(_FIRST_PORT, last)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def redis_reachable(url: str) -> bool:
    """Whether the Redis at ``url`` answers (on ``sentinel://`` and ``sentinels://``:
    its primary)."""
    client = endpoints.client(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def mysql_reachable(host: str, port: int, user: str = "root", password: str = "") -> bool:
    try:
        conn = MySQLdb.connect(
            host=host, port=port, user=user, password=password, connect_timeout=1
        )
    except MySQLdb.Error:
        return False
    conn.close()
    return True


def binary(name: str) -> str:
    for candidate in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ServiceSetupError(
        f"{name} is not installed (Debian: apt-get install redis-server mariadb-server)"
    )


def traversable_by_others(path: Path) -> bool:
    """Whether a user other than the owner (mariadbd's ``mysql``) can reach ``path``."""
    for directory in (path.resolve(), *path.resolve().parents):
        if not directory.stat().st_mode & stat.S_IXOTH:
            return False
    return True


def server_dir(state_dir: Path, name: str) -> Path:
    """Where ``up`` keeps the data of server ``name``, which runs as a user of
    its own when started by root: in the state directory if that user can
    reach it, else in /var/tmp."""
    if os.geteuid() != 0 or traversable_by_others(state_dir):
        return state_dir / name
    tag = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    fallback = Path("/var/tmp") / f"dataservice-{tag}"
    fallback.mkdir(mode=0o755, exist_ok=True)
    return fallback / name


def wait_until(check: Callable[[], bool], what: str, log: Path | None = None) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` (and its log) after a while,
    as the set-up's own error (an operator reads it, not a test report)."""
    try:
        eventually(check, timeout=START_TIMEOUT_S, interval=0.1, message=what)
    except AssertionError:
        hint = f"; see {log}" if log else ""
        raise ServiceSetupError(
            f"{what} did not become ready within {START_TIMEOUT_S:.0f} s{hint}"
        ) from None


def is_local(host: str | None) -> bool:
    return host is None or host in LOCAL_HOSTS
