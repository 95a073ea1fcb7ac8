"""The change-stream consumer's own database user, with exactly what it needs.

``REPLICATION SLAVE`` and the binlog-monitoring privilege (``BINLOG MONITOR``
on MariaDB 10.5+, ``REPLICATION CLIENT`` elsewhere) on ``*.*``, ``SELECT`` on
``records`` and ``SELECT, INSERT, UPDATE`` on ``change_positions``: nothing
else, so a leaked consumer password can neither change a record nor read
another database. ``dataservice db changes-user`` runs :func:`create_changes_user`.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence

from sqlalchemy import Connection, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError

from dataservice.changes.grants import (
    REPLICATION,
    TABLE_PRIVILEGES,
    Grants,
    monitor_privilege,
    quote_name,
)
from dataservice.changes.server import admin_engine, describe, errno, reason, version_tuple
from dataservice.errors import ConfigError, ServiceSetupError

DEFAULT_USER = "ds_changes"
# As the service's own users: a local consumer connects by socket or by TCP.
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
ER_NO_SUCH_TABLE = 1146

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")
_HOST = re.compile(r"[A-Za-z0-9_.:%/-]{1,255}")
# Written into statements: a name with a colon would read as a bind parameter.
_DATABASE = re.compile(r"[A-Za-z0-9_$-]{1,64}")
# Bound, never formatted in: the driver quotes them (and '%' stays a host pattern).
_ACCOUNT = ":user@:host"


def new_password() -> str:
    return secrets.token_urlsafe(24)


def grant_statements(database: str, monitor: str) -> list[str]:
    """The GRANT statements that give ``:user@:host`` what the consumer needs."""
    statements = [f"GRANT {REPLICATION}, {monitor} ON *.* TO {_ACCOUNT}"]
    for table, privileges in TABLE_PRIVILEGES.items():
        target = f"{quote_name(database)}.{quote_name(table)}"
        statements.append(f"GRANT {', '.join(privileges)} ON {target} TO {_ACCOUNT}")
    return statements


def create_changes_user(
    admin_url: str,
    user: str,
    password: str,
    database: str,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
) -> None:
    """Create the consumer's user on each of ``hosts`` (or update it: its
    password, and its grants made exactly the needed ones), connected as
    ``admin_url``'s user, who must be allowed to create users and grant.
    Run after the migrations: a table privilege needs its table."""
    if not _USER.fullmatch(user):
        raise ConfigError(f"{user!r} is not a user name this command creates")
    bad = [host for host in hosts if not _HOST.fullmatch(host)]
    if bad or not hosts:
        raise ConfigError(f"not a host a user may connect from: {', '.join(map(repr, bad))}")
    if not _DATABASE.fullmatch(database):
        raise ConfigError(f"{database!r} is not a database name this command grants on")
    target = make_url(admin_url)
    engine = admin_engine(target)
    try:
        with engine.connect() as conn:
            version = str(conn.exec_driver_sql("SELECT VERSION()").scalar_one())
            monitor = monitor_privilege("mariadb" in version.lower(), version_tuple(version))
            for host in hosts:
                _one_account(conn, {"user": user, "host": host}, password, database, monitor)
    except DBAPIError as exc:
        hint = " (run `dataservice db upgrade` first)" if errno(exc) == ER_NO_SUCH_TABLE else ""
        raise ServiceSetupError(
            f"creating database user {user} at {describe(target)}: {reason(exc)}{hint}"
        ) from None
    finally:
        engine.dispose()


def _one_account(
    conn: Connection, account: dict[str, str], password: str, database: str, monitor: str
) -> None:
    secret = {**account, "pw": password}
    conn.execute(text(f"CREATE USER IF NOT EXISTS {_ACCOUNT} IDENTIFIED BY :pw"), secret)
    conn.execute(text(f"ALTER USER {_ACCOUNT} IDENTIFIED BY :pw"), secret)
    wanted = grant_statements(database, monitor)
    held = [str(row[0]) for row in conn.execute(text(f"SHOW GRANTS FOR {_ACCOUNT}"), account)]
    # Revoked only when different: in between, a running consumer would lack its grants.
    if Grants.parse(held) == Grants.parse(wanted):
        return
    conn.execute(text(f"REVOKE ALL PRIVILEGES, GRANT OPTION FROM {_ACCOUNT}"), account)
    for statement in wanted:
        conn.execute(text(statement), account)


def changes_url(admin_url: str, user: str, password: str) -> str:
    """``admin_url`` with the consumer's user and password in place of the admin's."""
    url: URL = make_url(admin_url).set(username=user, password=password)
    return url.render_as_string(hide_password=False)
