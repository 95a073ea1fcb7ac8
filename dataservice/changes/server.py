"""Can this database server feed the change stream? :func:`check_server`.

The consumer asks at start, connected as itself. Every problem is collected
first; one :class:`~dataservice.errors.BinlogSetupError` then names them all,
each with the server setting or the grant that fixes it (``docs/changes.md``,
"The database"). A message names the host, port and user, never more of the URL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from dataservice.changes.grants import Grants, missing_grants, monitor_privilege
from dataservice.errors import BinlogSetupError, ServiceSetupError

Flavor = Literal["mariadb", "mysql"]

ER_DBACCESS_DENIED = 1044
ER_PARSE_ERROR = 1064
ER_SPECIFIC_ACCESS_DENIED = 1227
CONNECT_TIMEOUT_S = 5

# (variable, the value the stream needs, what to set when it differs)
_REQUIRED = (
    ("log_bin", "ON", "start the server with log_bin (my.cnf [mysqld]: log_bin = binlog)"),
    ("binlog_format", "ROW", "set binlog_format = ROW"),
    ("binlog_row_image", "FULL", "set binlog_row_image = FULL"),
    # Without it a row event carries no column names (mysql-replication reads them from it).
    ("binlog_row_metadata", "FULL", "set binlog_row_metadata = FULL"),
)
_VARIABLES = (*(name for name, _, _ in _REQUIRED), "server_id", "gtid_mode")


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """A server that can feed the change stream, and where its binlog ends now."""

    flavor: Flavor
    version: str  # as the server reports it, e.g. "10.11.19-MariaDB-0+deb12u1-log"
    server_id: int
    # MySQL: gtid_mode is ON. MariaDB writes a GTID for every transaction: always True.
    gtid_mode: bool
    # The GTIDs written so far: MariaDB's gtid_binlog_pos, MySQL's gtid_executed.
    gtid_position: str
    log_file: str
    log_pos: int

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return version_tuple(self.version)


def version_tuple(version: str) -> tuple[int, ...]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(part) for part in match.groups()) if match else (0, 0, 0)


def check_server(url: str, *, replica_server_id: int | None = None) -> ServerInfo:
    """Connect as ``url``'s user and check the binlog settings and the user's
    grants; ``replica_server_id`` (``changes.server_id``) must differ from the
    server's own id. Raises :class:`BinlogSetupError` naming every problem, or
    :class:`ServiceSetupError` when the server does not answer."""
    target = make_url(url)
    try:
        try:
            return _check_at(target, target, replica_server_id)
        except DBAPIError as exc:
            if errno(exc) != ER_DBACCESS_DENIED:
                raise
        # A user with no grant on the database may not even name it: ask without,
        # so that the refusal lists every missing grant.
        return _check_at(target._replace(database=None), target, replica_server_id)
    except DBAPIError as exc:
        raise ServiceSetupError(f"database at {describe(target)}: {reason(exc)}") from None


def admin_engine(url: str | URL) -> Engine:
    """An engine for a few statements of administration: a connection per use,
    autocommit, and no statement parameters (a password, say) in its errors."""
    return create_engine(
        url,
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
        hide_parameters=True,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )


def _check_at(connect_to: URL, target: URL, replica_server_id: int | None) -> ServerInfo:
    engine = admin_engine(connect_to)
    try:
        with engine.connect() as conn:
            return _check(conn, target, replica_server_id)
    finally:
        engine.dispose()


def describe(target: URL) -> str:
    """Host, port and user: what a message may say about a URL."""
    return f"{target.host or 'localhost'}:{target.port or 3306} (user {target.username})"


def reason(exc: DBAPIError) -> str:
    """The server's own words, without the statement or its parameters."""
    args: tuple[object, ...] = getattr(exc.orig, "args", ())
    if len(args) >= 2:
        return f"{args[1]} (error {args[0]})"
    return type(exc.orig).__name__


def errno(exc: DBAPIError) -> int | None:
    """The server's error number (1064, 1227, ...), if it gave one."""
    args: tuple[object, ...] = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _check(conn: Connection, target: URL, replica_server_id: int | None) -> ServerInfo:
    version = str(conn.exec_driver_sql("SELECT VERSION()").scalar_one())
    flavor: Flavor = "mariadb" if "mariadb" in version.lower() else "mysql"
    names = ", ".join(f"'{name}'" for name in _VARIABLES)
    variables = {
        str(name).lower(): str(value)
        for name, value in conn.exec_driver_sql(
            f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})"
        )
    }
    problems = _setting_problems(variables, flavor, version)
    server_id = int(variables.get("server_id") or 0)
    if server_id == 0:
        problems.append("server_id is 0: set server_id to an id unique among the servers")
    elif server_id == replica_server_id:
        problems.append(
            f"server_id is {server_id}, the consumer's own replication id (changes.server_id "
            "in queues.yml): give one of them another"
        )
    position, monitor_held = _binlog_status(conn, flavor)
    lines = [str(row[0]) for row in conn.exec_driver_sql("SHOW GRANTS")]
    monitor = monitor_privilege(flavor == "mariadb", version_tuple(version))
    if target.database is None:
        problems.append("the URL names no database: add /<database> (the service's)")
    else:
        missing = missing_grants(Grants.parse(lines), target.database, monitor, monitor_held)
        problems += [f"missing grant: {grant}" for grant in missing]
    if problems:
        raise _refusal(flavor, version, target, problems)
    log_file, log_pos = position or ("", 0)
    gtid = "@@global.gtid_binlog_pos" if flavor == "mariadb" else "@@global.gtid_executed"
    return ServerInfo(
        flavor=flavor,
        version=version,
        server_id=server_id,
        gtid_mode=flavor == "mariadb" or variables.get("gtid_mode", "").upper() == "ON",
        gtid_position=str(conn.exec_driver_sql(f"SELECT {gtid}").scalar() or ""),
        log_file=log_file,
        log_pos=log_pos,
    )


def _setting_problems(variables: dict[str, str], flavor: Flavor, version: str) -> list[str]:
    problems = []
    for name, wanted, fix in _REQUIRED:
        value = variables.get(name)
        if value is None:
            server = "MariaDB" if flavor == "mariadb" else "MySQL"
            problems.append(
                f"{name}: {server} {version} has no such setting; the change stream needs "
                f"{name} = {wanted} (MariaDB 10.5+ or MySQL 8.0.14+)"
            )
        elif value.upper() != wanted:
            problems.append(f"{name} is {value}: {fix}")
    return problems


def _binlog_status(conn: Connection, flavor: Flavor) -> tuple[tuple[str, int] | None, bool]:
    """Where the binlog ends (None with no binlog), and whether the user may ask.

    Asking decides the monitoring privilege better than ``SHOW GRANTS`` can:
    MySQL 8 does not list a role's privileges there."""
    # MySQL 8.4 knows only the new spelling, before 8.2 only the old; MariaDB the old.
    statements = ["SHOW MASTER STATUS"]
    if flavor == "mysql":
        statements.insert(0, "SHOW BINARY LOG STATUS")
    for statement in statements:
        try:
            row = conn.exec_driver_sql(statement).first()
        except DBAPIError as exc:
            if errno(exc) == ER_PARSE_ERROR and statement != statements[-1]:
                continue
            if errno(exc) == ER_SPECIFIC_ACCESS_DENIED:
                return None, False
            raise
        return (None if row is None else (str(row[0]), int(row[1]))), True
    return None, False


def _refusal(flavor: Flavor, version: str, target: URL, problems: list[str]) -> BinlogSetupError:
    server = "MariaDB" if flavor == "mariadb" else "MySQL"
    lines = [f"{server} {version} at {describe(target)} cannot feed the change stream:"]
    lines += [f"  - {problem}" for problem in problems]
    if any(problem.startswith("missing grant") for problem in problems):
        lines.append("`dataservice db changes-user` creates a user with exactly these grants")
    lines.append('see docs/changes.md, "The database"')
    return BinlogSetupError("\n".join(lines), tuple(problems))
