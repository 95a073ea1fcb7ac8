"""What a database user may do, read from ``SHOW GRANTS``, and what the
change-stream consumer needs.

``SHOW GRANTS`` prints one statement per line, in MariaDB's or MySQL 8's
spelling::

    GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `u`@`%` IDENTIFIED BY PASSWORD '*...'
    GRANT SELECT, INSERT ON `data\\_svc`.* TO `u`@`%`
    GRANT SELECT, SELECT (`a`) ON `data_svc`.`records` TO `u`@`%`
    GRANT APPLICATION_PASSWORD_ADMIN,BACKUP_ADMIN ON *.* TO `root`@`localhost`
    REVOKE INSERT ON `mysql`.* FROM `u`@`%`          (MySQL 8, partial_revokes)

Only privilege grants count: role grants (``GRANT `r` TO ...``) carry no
``ON``; MariaDB prints an enabled role's own grants as further lines, which
count as the user's. MySQL 8 does not, so privileges held only through a role
are not seen. Column privileges (``SELECT (`a`)``) are not table privileges.
A line is never echoed: it may carry a password hash.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

RECORDS_TABLE = "records"
POSITIONS_TABLE = "change_positions"
# What the consumer reads and writes, table by table (granted by
# dataservice.changes.user, checked by dataservice.changes.server).
TABLE_PRIVILEGES: Mapping[str, tuple[str, ...]] = {
    RECORDS_TABLE: ("SELECT",),
    POSITIONS_TABLE: ("SELECT", "INSERT", "UPDATE"),
}
REPLICATION = "REPLICATION SLAVE"
# SHOW MASTER STATUS and SHOW BINARY LOGS: MariaDB 10.5 renamed REPLICATION
# CLIENT to BINLOG MONITOR (the old name an alias); SUPER still allows them.
MONITOR = ("BINLOG MONITOR", "REPLICATION CLIENT", "SUPER")
ALL = "ALL PRIVILEGES"
_ALIASES = {"ALL": ALL, "REPLICATION REPLICA": REPLICATION}

_STATEMENT = re.compile(r"(GRANT|REVOKE) (.+?) ON (.+?) (?:TO|FROM) ", re.IGNORECASE)
_ROUTINE = re.compile(r"(PROCEDURE|FUNCTION|PACKAGE|PACKAGE BODY) ", re.IGNORECASE)


def _mask(line: str) -> str:
    """``line`` with quoted names, strings and parentheses blanked out (same
    length), so that keywords, commas and dots are found only where they are syntax."""
    out = []
    quote = ""
    depth = 0
    n = 0
    while n < len(line):
        char = line[n]
        if quote:
            if char == "\\" and quote != "`" and n + 1 < len(line):
                out.append("x")
                n += 1
            elif char == quote:
                if line[n + 1 : n + 2] == quote:
                    out.append("x")
                    n += 1
                else:
                    quote = ""
        elif char in "`'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif not depth:
            out.append(char)
            n += 1
            continue
        out.append("x")
        n += 1
    return "".join(out)


def _split(text: str, masked: str, separator: str) -> list[str]:
    parts, start = [], 0
    for n, char in enumerate(masked):
        if char == separator:
            parts.append(text[start:n])
            start = n + 1
    parts.append(text[start:])
    return parts


def _privileges(text: str) -> frozenset[str]:
    found = set()
    for item in _split(text, _mask(text), ","):
        if "(" in item:
            continue  # a column privilege
        name = " ".join(item.split()).upper()
        found.add(_ALIASES.get(name, name))
    return frozenset(found - {"USAGE"})


def _name(part: str) -> str:
    part = part.strip()
    if part.startswith("`") and part.endswith("`") and len(part) >= 2:
        return part[1:-1].replace("``", "`")
    return part


def _like(pattern: str) -> re.Pattern[str]:
    """A database name in a grant: ``_`` and ``%`` are wildcards unless escaped."""
    out = []
    chars = iter(pattern)
    for char in chars:
        if char == "\\":
            out.append(re.escape(next(chars, "\\")))
        else:
            out.append({"%": ".*", "_": "."}.get(char) or re.escape(char))
    return re.compile("".join(out))


@dataclass(frozen=True, slots=True)
class Grants:
    """A user's privileges, level by level."""

    global_privileges: frozenset[str] = frozenset()
    # (pattern, privileges) per database grant; a pattern may match several.
    databases: tuple[tuple[re.Pattern[str], frozenset[str]], ...] = ()
    tables: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    # MySQL 8's partial revokes: global privileges taken back on one database.
    revoked: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, lines: Iterable[str]) -> Grants:
        global_privileges: set[str] = set()
        databases: list[tuple[re.Pattern[str], frozenset[str]]] = []
        tables: dict[tuple[str, str], frozenset[str]] = {}
        revoked: dict[str, frozenset[str]] = {}
        for line in lines:
            masked = _mask(line.strip())
            match = _STATEMENT.match(masked)
            if match is None:
                continue  # a role grant, SET DEFAULT ROLE, ...
            text = line.strip()
            target = text[match.start(3) : match.end(3)]
            if _ROUTINE.match(target):
                continue
            privileges = _privileges(text[match.start(2) : match.end(2)])
            parts = [_name(p) for p in _split(target, match.group(3), ".")]
            if len(parts) != 2:
                continue
            database, table = parts
            if match.group(1).upper() == "REVOKE":
                revoked[database] = revoked.get(database, frozenset()) | privileges
            elif database == "*":
                global_privileges |= privileges
            elif table == "*":
                databases.append((_like(database), privileges))
            else:
                tables[(database, table)] = tables.get((database, table), frozenset()) | privileges
        return cls(frozenset(global_privileges), tuple(databases), tables, revoked)

    def allows(self, privilege: str, database: str | None = None, table: str | None = None) -> bool:
        """Whether ``privilege`` is held on ``*.*`` (no ``database``), or reaches
        ``database`` (its every table), or ``database.table``."""

        def has(held: frozenset[str]) -> bool:
            return privilege in held or ALL in held

        taken = self.revoked.get(database, frozenset()) if database else frozenset()
        if has(self.global_privileges) and not has(taken):
            return True
        if database is None:
            return False
        if any(has(held) for pattern, held in self.databases if pattern.fullmatch(database)):
            return True
        return table is not None and has(self.tables.get((database, table), frozenset()))


def missing_grants(
    grants: Grants, database: str, monitor: str, monitor_held: bool | None = None
) -> list[str]:
    """Every grant the consumer lacks, each as the GRANT clause that gives it.

    ``monitor`` is the server's name for the binlog-monitoring privilege;
    ``monitor_held``, when known (the server answered or refused SHOW MASTER
    STATUS), overrules what ``grants`` says about it."""
    missing = []
    if not grants.allows(REPLICATION):
        missing.append(f"{REPLICATION} ON *.*")
    if monitor_held is None:
        monitor_held = any(grants.allows(name) for name in MONITOR)
    if not monitor_held:
        missing.append(f"{monitor} ON *.*")
    for table, privileges in TABLE_PRIVILEGES.items():
        lacking = [p for p in privileges if not grants.allows(p, database, table)]
        if lacking:
            missing.append(f"{', '.join(lacking)} ON {quote_name(database)}.{quote_name(table)}")
    return missing


def monitor_privilege(mariadb: bool, version: tuple[int, ...] = (10, 5, 2)) -> str:
    """The name the server gives the binlog-monitoring privilege."""
    return "BINLOG MONITOR" if mariadb and version >= (10, 5, 2) else "REPLICATION CLIENT"


def quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
