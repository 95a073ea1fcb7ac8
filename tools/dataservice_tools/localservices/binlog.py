"""A MariaDB with a binlog for ``make services`` when the configured one has none.

The change stream reads the database's binlog. A server that answers on
``DATASERVICE_DATABASE_URL`` but writes none (the machine's shared MariaDB,
say) is left as it is: turning its binlog on means restarting it under its
other users. Instead, when it is on this machine, :func:`ensure_binlog` runs a
private MariaDB with a binlog (port 3307, data under the state directory),
migrates it, gives it the consumer's user and writes ``services.env`` in the
state directory (mode 600: it holds that user's password)::

    DATASERVICE_DATABASE_URL='mysql+mysqldb://root@127.0.0.1:3307/dataservice'
    DATASERVICE_CHANGES_DATABASE_URL='mysql+mysqldb://ds_changes:...@127.0.0.1:3307/dataservice'

``make run`` and ``make demo`` read it; the tests do not (they start their
own servers). When the configured server has a binlog, the file is removed and
nothing else is done. ``down`` stops the private server and keeps its data and
the file, so the next ``up`` finds the same user and password.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import MySQLdb
from sqlalchemy.engine import make_url

from dataservice.changes.user import DEFAULT_USER, changes_url, create_changes_user, new_password
from dataservice.config.model import DatabaseConfig
from dataservice.config.settings import Settings
from dataservice.errors import ServiceSetupError
from dataservice.store.migrate import upgrade
from dataservice_tools.localservices.mariadb import PrivateMariaDB, binlog_mariadb_dir
from dataservice_tools.localservices.probes import free_port, is_local, mysql_reachable

BINLOG_PORT = 3307
SERVICES_ENV = "services.env"
DATABASE_VARIABLE = "DATASERVICE_DATABASE_URL"
CHANGES_VARIABLE = "DATASERVICE_CHANGES_DATABASE_URL"


@dataclass(frozen=True, slots=True)
class PrivateBinlog:
    """The private binlog MariaDB ``make services`` set up, and its URLs."""

    port: int
    database_url: str
    changes_url: str
    env_file: Path
    started: bool  # False: it was running already


def log_bin_on(url: str) -> bool:
    """Whether the server at ``url`` writes a binlog (its user needs no privilege to ask)."""
    target = make_url(url)
    try:
        conn = MySQLdb.connect(
            host=target.host or "127.0.0.1", port=target.port or 3306,
            user=target.username or "root", password=target.password or "", connect_timeout=2,
        )  # fmt: skip
    except MySQLdb.Error as exc:
        raise ServiceSetupError(f"MariaDB at {target.host}:{target.port}: {exc.args[-1]}") from None
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT @@global.log_bin")
        row = cursor.fetchone()
    finally:
        conn.close()
    return bool(row and int(row[0]))


def ensure_binlog(
    settings: Settings, config: DatabaseConfig, state_dir: Path, port: int | None = None
) -> PrivateBinlog | None:
    """Make sure a database with a binlog serves ``make run``; returns the
    private one when it takes the configured one's place, None when not needed
    (the configured server has a binlog) or not possible (it is not on this machine).

    Without ``port`` it listens where it did before (``.state/services.env``),
    else on ``BINLOG_PORT``, else, when something else answers there (another
    checkout's, say), on a free port; a ``port`` asked for that is taken is an error."""
    env_file = state_dir / SERVICES_ENV
    configured = make_url(settings.database_url)
    if not is_local(configured.host) or log_bin_on(settings.database_url):
        env_file.unlink(missing_ok=True)
        return None
    # A fresh checkout has no state directory yet; where the server may live
    # depends on it (mariadb_dir looks at its permissions). Absolute: the
    # server's tools resolve a relative data directory against their own.
    state_dir.mkdir(parents=True, exist_ok=True)
    directory = binlog_mariadb_dir(state_dir.resolve())
    kept = read_env(env_file)
    server = PrivateMariaDB(directory, port or _kept_port(kept) or BINLOG_PORT, binlog=True)
    started = not _running(server)
    if started:
        if mysql_reachable("127.0.0.1", server.port):
            if port is not None:
                raise ServiceSetupError(
                    f"port {port} answers, but not for the binlog MariaDB under "
                    f"{server.directory}: free it or pass another --binlog-port"
                )
            server = PrivateMariaDB(directory, free_port(), binlog=True)
        server.start(detach=True)
    database = configured.database or "dataservice"
    admin_url = server.url(database)
    upgrade(admin_url, config)
    password = _kept_password(kept, server.port) or new_password()
    create_changes_user(admin_url, DEFAULT_USER, password, database)
    consumer_url = changes_url(admin_url, DEFAULT_USER, password)
    _write_env(env_file, {DATABASE_VARIABLE: admin_url, CHANGES_VARIABLE: consumer_url})
    return PrivateBinlog(server.port, admin_url, consumer_url, env_file, started)


def _running(server: PrivateMariaDB) -> bool:
    """Whether the server whose pid file is in ``server.directory`` is alive and answering."""
    try:
        os.kill(int((server.directory / "mariadb.pid").read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return mysql_reachable("127.0.0.1", server.port)


def read_env(path: Path) -> dict[str, str]:
    """The variables of an env file written by :func:`ensure_binlog` ({} if there is none)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    values = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = "".join(shlex.split(value))
    return values


def _kept_port(kept: dict[str, str]) -> int | None:
    """The port of the private server an earlier run wrote down, if any."""
    url = kept.get(DATABASE_VARIABLE)
    return make_url(url).port if url else None


def _kept_password(kept: dict[str, str], port: int) -> str | None:
    """The consumer's password from an earlier run on the same port, so it stays the same."""
    url = kept.get(CHANGES_VARIABLE)
    if not url:
        return None
    previous = make_url(url)
    if previous.port != port or previous.username != DEFAULT_USER or not previous.password:
        return None
    return str(previous.password)


def _write_env(path: Path, values: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created private, before the password is written into it.
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    lines = [
        "# Written by `make services`: the configured MariaDB has no binlog, so `make run`",
        '# and `make demo` use this private one instead (docs/changes.md, "The database").',
        *(f"{name}={shlex.quote(value)}" for name, value in values.items()),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
