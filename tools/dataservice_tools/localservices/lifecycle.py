"""``up`` and ``down``: private Redis, MariaDB and RabbitMQ where the ones the
project uses do not answer."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from urllib.parse import quote

from sqlalchemy.engine import make_url

from dataservice.config.settings import Settings
from dataservice.errors import ServiceSetupError
from dataservice.redis import where
from dataservice.redis.packing import uses_unix_socket
from dataservice_tools.localservices.certificates import Certificates
from dataservice_tools.localservices.mariadb import PrivateMariaDB, binlog_mariadb_dir, mariadb_dir
from dataservice_tools.localservices.probes import (
    binary,
    is_local,
    mysql_reachable,
    redis_reachable,
    wait_until,
)
from dataservice_tools.localservices.rabbitmqserver import (
    ensure_management,
    ensure_rabbitmq,
    rabbitmq_dir,
)

# Relative: the working directory's, as ``dataservice run`` keeps its logs in .state/logs.
DEFAULT_STATE_DIR = Path(".state")
# sun_path holds 108 bytes, its last a NUL.
_SUN_PATH_MAX = 107


def start_redis(
    state_dir: Path,
    port: int,
    also_bind: Sequence[str] = (),
    extra: Sequence[str] = (),
    certificates: Certificates | None = None,
    unix_socket: Path | None = None,
) -> None:
    """Start a private redis-server (daemonized, nothing persisted) on
    127.0.0.1 and ``also_bind`` (a private address: clients from there are let
    in without a password, which protected mode would refuse), with ``extra``
    options (``--replicaof``, ...). Given ``certificates``, ``port`` is its
    TLS port and it has no plain one (:func:`tls_redis_options`). Given
    ``unix_socket``, it listens on that socket alone, for its owner alone
    (:func:`unix_redis_options`), and ``port`` is not used."""
    directory = state_dir / "redis"
    directory.mkdir(parents=True, exist_ok=True)
    protected = ["--protected-mode", "no"] if also_bind else []
    if unix_socket is not None:
        ports = unix_redis_options(unix_socket)
    elif certificates is not None:
        ports = tls_redis_options(port, certificates)
    else:
        ports = ("--port", str(port))
    subprocess.run(
        [
            binary("redis-server"), "--daemonize", "yes", "--bind", "127.0.0.1", *also_bind,
            *protected, *ports, "--save", "", "--appendonly", "no",
            "--dir", str(directory), "--pidfile", str(directory / "redis.pid"),
            "--logfile", str(directory / "redis.log"), *extra,
        ],
        check=True,
    )  # fmt: skip
    url = unix_redis_url(unix_socket) if unix_socket else local_redis_url(port, certificates)
    wait_until(lambda: redis_reachable(url), "redis", directory / "redis.log")


def tls_redis_options(port: int, certificates: Certificates) -> tuple[str, ...]:
    """redis-server's options for TLS on ``port`` alone: no plain port, so
    whatever reaches it went over TLS, and replication over TLS too. Clients
    need no certificate of their own."""
    return (
        "--port", "0", "--tls-port", str(port),
        "--tls-cert-file", str(certificates.server_cert),
        "--tls-key-file", str(certificates.server_key),
        "--tls-ca-cert-file", str(certificates.ca),
        "--tls-auth-clients", "no", "--tls-replication", "yes",
    )  # fmt: skip


def unix_redis_options(path: Path) -> tuple[str, ...]:
    """redis-server's options for ``path`` alone: no TCP port, so whatever
    reaches it came through the socket."""
    # The kernel's limit (sun_path) is checked here: redis-server would only
    # say so in its log, after the wait for it to answer.
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        raise ServiceSetupError(f"{path}: too long for a Unix socket's path")
    return ("--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700")


def unix_redis_url(path: Path, db: int = 0) -> str:
    """The ``unix://`` URL of a redis-server listening on ``path``."""
    return f"unix://{quote(str(path), safe='/')}?db={db}"


def local_redis_url(port: int, certificates: Certificates | None = None, db: int = 0) -> str:
    """The URL of a local redis-server on ``port``: ``rediss://`` trusting
    ``certificates``' CA when given."""
    if certificates is None:
        return f"redis://127.0.0.1:{port}/{db}"
    return f"rediss://127.0.0.1:{port}/{db}?ssl_ca_certs={quote(str(certificates.ca), safe='/')}"


def up(settings: Settings, state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Make the configured Redis and MariaDB reachable, and RabbitMQ when it
    is the broker (with its management API, for Flower). Returns what was
    started."""
    # Absolute: redis-server changes into its --dir before it opens its pid and log files.
    state_dir = state_dir.resolve()
    started = []
    redis_broker = () if settings.broker_is_amqp else (settings.broker_url,)
    for url in dict.fromkeys((*redis_broker, settings.result_backend_url, settings.redis_url)):
        if redis_reachable(url):
            continue
        if uses_unix_socket(url):
            # A socket is always this machine's: read as a TCP URL, it would
            # start a Redis on 6379 that the URL never reaches.
            socket = Path(where(url))
            start_redis(state_dir, 0, unix_socket=socket)
            started.append(f"redis on {socket}")
            continue
        parsed = make_url(url.replace("redis://", "mysql://", 1))  # same URL grammar
        if not is_local(parsed.host):
            raise ServiceSetupError(f"Redis at {parsed.host}:{parsed.port} is unreachable")
        start_redis(state_dir, parsed.port or 6379)
        started.append(f"redis on port {parsed.port or 6379}")
    db = make_url(settings.database_url)
    if not mysql_reachable(
        db.host or "127.0.0.1", db.port or 3306, db.username or "root", db.password or ""
    ):
        if not is_local(db.host):
            raise ServiceSetupError(f"MariaDB at {db.host}:{db.port} is unreachable")
        # With a binlog: the change stream reads it, so no second server is needed.
        PrivateMariaDB(mariadb_dir(state_dir), db.port or 3306, binlog=True).start(detach=True)
        started.append(f"mariadb on port {db.port or 3306}")
    if settings.broker_is_amqp:
        started += ensure_amqp(settings.broker_url, state_dir)
    return started


def ensure_amqp(url: str, state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Make the RabbitMQ at ``url`` answer, with its management API; what was
    started or turned on. (Where the broker is Redis, ``up``'s caller asks
    this of the local RabbitMQ that the tests, benchmarks and ``dataservice
    loadtest`` use.)"""
    port = ensure_rabbitmq(url, state_dir.resolve())
    if port is not None:
        # Ours: with the management plugin on the default port, where Flower looks.
        return [f"rabbitmq on port {port}"]
    return ["rabbitmq's management plugin"] if ensure_management(url) else []


def down(state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Stop the private instances that ``up`` (and ``ensure_binlog``) started."""
    stopped = []
    pidfiles = {
        "redis": state_dir / "redis" / "redis.pid",
        "mariadb": mariadb_dir(state_dir) / "mariadb.pid",
        "binlog mariadb": binlog_mariadb_dir(state_dir) / "mariadb.pid",
        "rabbitmq": rabbitmq_dir(state_dir) / "rabbitmq.pid",
    }
    for name, pidfile in pidfiles.items():
        try:
            pid = int(pidfile.read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue
        wait_until(partial(_gone, pid), f"{name} (pid {pid}) to stop")
        stopped.append(name)
    return stopped


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
