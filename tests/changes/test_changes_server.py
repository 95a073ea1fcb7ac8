"""The database side of the change stream: a server that cannot feed it is
refused naming every missing setting and grant; the consumer's user has
exactly its grants; ``make services`` brings a binlog where the configured
server has none. Against the shared MariaDB (no binlog) and private ones."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import MySQLdb
import pytest
from dataservice_tools.localservices import down, free_port, mariadb_dir, mysql_reachable
from dataservice_tools.localservices.binlog import (
    CHANGES_VARIABLE,
    DATABASE_VARIABLE,
    ensure_binlog,
    read_env,
)
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from dataservice.changes.grants import Grants, missing_grants
from dataservice.changes.server import check_server
from dataservice.changes.user import DEFAULT_HOSTS, changes_url, create_changes_user
from dataservice.cli import app
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.errors import BinlogSetupError, ServiceSetupError
from tests.conftest import ROOT_URL, TEST_DATABASE, require
from tests.harness.binlog import BinlogDatabase

CONSUMER = [
    "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `ds_changes`@`%` "
    "IDENTIFIED BY PASSWORD '*0C908AD93F67C171AD1942A253AEE176ABB70AC2'",
    "GRANT SELECT, INSERT, UPDATE ON `dataservice`.`change_positions` TO `ds_changes`@`%`",
    "GRANT SELECT ON `dataservice`.`records` TO `ds_changes`@`%`",
]
MYSQL_CONSUMER = [
    "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `ds_changes`@`%`",
    "GRANT SELECT ON `dataservice`.`records` TO `ds_changes`@`%`",
    "GRANT SELECT, INSERT, UPDATE ON `dataservice`.`change_positions` TO `ds_changes`@`%`",
]
MYSQL_ROOT = [
    "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, RELOAD, SHUTDOWN, PROCESS, FILE, "
    "REFERENCES, INDEX, ALTER, SHOW DATABASES, SUPER, CREATE TEMPORARY TABLES, LOCK TABLES, "
    "EXECUTE, REPLICATION SLAVE, REPLICATION CLIENT, CREATE VIEW, SHOW VIEW, CREATE ROUTINE, "
    "ALTER ROUTINE, CREATE USER, EVENT, TRIGGER, CREATE TABLESPACE, CREATE ROLE, DROP ROLE ON "
    "*.* TO `root`@`localhost` WITH GRANT OPTION",
    "GRANT APPLICATION_PASSWORD_ADMIN,AUDIT_ABORT_EXEMPT,BACKUP_ADMIN,BINLOG_ADMIN,"
    "REPLICATION_SLAVE_ADMIN,XA_RECOVER_ADMIN ON *.* TO `root`@`localhost` WITH GRANT OPTION",
    "GRANT PROXY ON ``@`` TO `root`@`localhost` WITH GRANT OPTION",
]
EVERYTHING_MISSING = [
    "REPLICATION SLAVE ON *.*",
    "BINLOG MONITOR ON *.*",
    "SELECT ON `{db}`.`records`",
    "SELECT, INSERT, UPDATE ON `{db}`.`change_positions`",
]


def _missing(lines: list[str], monitor: str = "BINLOG MONITOR") -> list[str]:
    return missing_grants(Grants.parse(lines), "dataservice", monitor)


# SHOW GRANTS, as strings ---------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "monitor"),
    [
        (CONSUMER, "BINLOG MONITOR"),
        (MYSQL_CONSUMER, "REPLICATION CLIENT"),
        (MYSQL_ROOT, "REPLICATION CLIENT"),
        (["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION",
          "GRANT PROXY ON ''@'%' TO 'root'@'localhost' WITH GRANT OPTION"], "BINLOG MONITOR"),
        (["GRANT REPLICATION REPLICA, SUPER ON *.* TO `u`@`%`",
          "GRANT ALL PRIVILEGES ON `dataservice`.* TO `u`@`%`"], "BINLOG MONITOR"),
        (["GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `u`@`%`",
          "GRANT SELECT, INSERT, UPDATE ON `data%`.* TO `u`@`%`"], "REPLICATION CLIENT"),
        (["GRANT `r1` TO `u`@`%`", "SET DEFAULT ROLE `r1` FOR `u`@`%`",
          *CONSUMER], "BINLOG MONITOR"),
    ],
    ids=["mariadb-consumer", "mysql8-consumer", "mysql8-root", "all-privileges", "database-all",
         "database-pattern", "roles"],
)  # fmt: skip
def test_grants_that_cover_the_consumer_leave_nothing_missing(
    lines: list[str], monitor: str
) -> None:
    assert _missing(lines, monitor) == []


def test_no_grants_miss_each_grant_the_consumer_needs() -> None:
    usage = ["GRANT USAGE ON *.* TO `u`@`%` IDENTIFIED BY PASSWORD '*ABC'"]
    everything = [grant.format(db="dataservice") for grant in EVERYTHING_MISSING]
    assert _missing(usage) == everything
    assert _missing([]) == everything
    assert _missing(usage, "REPLICATION CLIENT")[1] == "REPLICATION CLIENT ON *.*"


def test_column_privileges_are_not_table_privileges() -> None:
    lines = [
        "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `u`@`%`",
        "GRANT SELECT (`scope`, `object_id`), INSERT (`scope`) ON `dataservice`.`records` "
        "TO `u`@`%`",
        "GRANT SELECT, INSERT (`stream`), UPDATE ON `dataservice`.`change_positions` TO `u`@`%`",
    ]
    assert _missing(lines) == [
        "SELECT ON `dataservice`.`records`",
        "INSERT ON `dataservice`.`change_positions`",
    ]


def test_a_partial_revoke_takes_a_global_privilege_back_on_its_database() -> None:
    lines = [
        "GRANT SELECT, INSERT, UPDATE, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `u`@`%`",
        "REVOKE INSERT, UPDATE ON `dataservice`.* FROM `u`@`%`",
    ]
    assert _missing(lines, "REPLICATION CLIENT") == [
        "INSERT, UPDATE ON `dataservice`.`change_positions`"
    ]


def test_database_patterns_match_as_the_server_does() -> None:
    grants = Grants.parse(
        [
            r"GRANT SELECT ON `data\_svc`.* TO `u`@`%`",
            "GRANT INSERT ON `data_svc`.* TO `u`@`%`",
            "GRANT UPDATE ON `we``ird.db`.`records` TO `u`@`%`",
        ]
    )
    assert grants.allows("SELECT", "data_svc")
    assert not grants.allows("SELECT", "dataXsvc")
    assert grants.allows("INSERT", "dataXsvc")
    assert grants.allows("UPDATE", "we`ird.db", "records")
    assert not grants.allows("UPDATE", "we`ird.db", "change_positions")
    assert not grants.allows("SELECT")


# Against servers ------------------------------------------------------------


def _variables(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(text("SHOW GLOBAL VARIABLES LIKE 'binlog%'")).all()
        rows += conn.execute(text("SHOW GLOBAL VARIABLES LIKE 'log_bin'")).all()
    return {str(name): str(value) for name, value in rows}


def test_the_shared_mariadb_without_a_binlog_is_refused_naming_every_missing_setting(
    database: Engine,
) -> None:
    variables = _variables(database)
    assert variables["log_bin"] == "OFF", "the shared MariaDB was expected to have no binlog"
    with pytest.raises(BinlogSetupError) as refused:
        check_server(ROOT_URL + TEST_DATABASE)
    message = str(refused.value)
    wanted = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
              "binlog_row_metadata": "FULL"}  # fmt: skip
    for name, value in wanted.items():
        named = any(problem.startswith(f"{name} ") for problem in refused.value.problems)
        assert named == (variables.get(name) != value), f"{name} = {variables.get(name)}"
        if named:
            assert f"{name} = {value}" in message or name == "log_bin"
    assert "log_bin = binlog" in message
    assert not [p for p in refused.value.problems if "grant" in p], "root holds every grant"


def test_the_binlog_mariadb_passes_for_the_consumers_user(
    binlog_database: BinlogDatabase, config: Config
) -> None:
    info = check_server(binlog_database.changes_url, replica_server_id=config.changes.server_id)
    assert (info.flavor, info.server_id, info.gtid_mode) == ("mariadb", 1, True)
    assert info.version_tuple >= (10, 5, 0)
    assert info.log_file.startswith("binlog.")
    assert info.log_pos > 0
    engine = create_engine(binlog_database.admin_url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO change_positions VALUES ('t', 'f', 4, 0, NOW(6))"))
        conn.execute(text("DELETE FROM change_positions WHERE stream = 't'"))
    engine.dispose()
    later = check_server(binlog_database.changes_url)
    assert (later.log_file, later.log_pos) > (info.log_file, info.log_pos)
    assert later.gtid_position != info.gtid_position


def test_a_replication_id_equal_to_the_servers_own_is_refused(
    binlog_database: BinlogDatabase,
) -> None:
    with pytest.raises(BinlogSetupError, match=r"server_id is 1, the consumer's own") as refused:
        check_server(binlog_database.changes_url, replica_server_id=1)
    assert len(refused.value.problems) == 1


@pytest.mark.parametrize(
    ("grants", "missing"),
    [
        ([], EVERYTHING_MISSING),
        (
            ["REPLICATION SLAVE ON *.*", "SELECT ON {db}.records",
             "SELECT, UPDATE ON {db}.change_positions"],
            ["BINLOG MONITOR ON *.*", "INSERT ON `{db}`.`change_positions`"],
        ),
        (["BINLOG MONITOR ON *.*", "ALL ON {db}.*"], ["REPLICATION SLAVE ON *.*"]),
    ],
    ids=["none", "some", "database-wide"],
)  # fmt: skip
def test_a_user_without_the_grants_is_refused_naming_each_missing_grant(
    binlog_database: BinlogDatabase, grants: list[str], missing: list[str]
) -> None:
    db = binlog_database.database
    admin = create_engine(binlog_database.admin_url, isolation_level="AUTOCOMMIT")
    password = "not-to-be-shown-7f3a"
    with admin.connect() as conn:
        conn.execute(text("DROP USER IF EXISTS 'ds_partial'@'127.0.0.1'"))
        conn.execute(text(f"CREATE USER 'ds_partial'@'127.0.0.1' IDENTIFIED BY '{password}'"))
        for grant in grants:
            conn.execute(text(f"GRANT {grant.format(db=db)} TO 'ds_partial'@'127.0.0.1'"))
    admin.dispose()
    url = changes_url(binlog_database.admin_url, "ds_partial", password)
    with pytest.raises(BinlogSetupError) as refused:
        check_server(url)
    assert list(refused.value.problems) == [f"missing grant: {m.format(db=db)}" for m in missing]
    assert password not in str(refused.value)
    assert "dataservice db changes-user" in str(refused.value)


def _grants_of(admin_url: str, user: str) -> dict[str, set[str]]:
    engine = create_engine(admin_url)
    with engine.connect() as conn:
        found = {
            host: {str(row[0]).split(" IDENTIFIED BY")[0] for row in conn.execute(
                text("SHOW GRANTS FOR :user@:host"), {"user": user, "host": host})}
            for host in DEFAULT_HOSTS
        }  # fmt: skip
    engine.dispose()
    return found


def test_create_changes_user_is_idempotent_and_grants_exactly_what_the_consumer_needs(
    binlog_database: BinlogDatabase,
) -> None:
    admin_url, db = binlog_database.admin_url, binlog_database.database
    create_changes_user(admin_url, "ds_idem", "first-password", db)
    granted = _grants_of(admin_url, "ds_idem")
    assert granted["127.0.0.1"] == {
        "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `ds_idem`@`127.0.0.1`",
        f"GRANT SELECT ON `{db}`.`records` TO `ds_idem`@`127.0.0.1`",
        f"GRANT SELECT, INSERT, UPDATE ON `{db}`.`change_positions` TO `ds_idem`@`127.0.0.1`",
    }
    create_changes_user(admin_url, "ds_idem", "first-password", db)
    assert _grants_of(admin_url, "ds_idem") == granted
    engine = create_engine(admin_url)
    with engine.begin() as conn:
        conn.execute(text(f"GRANT DELETE ON `{db}`.records TO 'ds_idem'@'127.0.0.1'"))
    engine.dispose()
    create_changes_user(admin_url, "ds_idem", "second-password", db)
    assert _grants_of(admin_url, "ds_idem") == granted, "an extra grant is taken back"
    port = binlog_database.server.port
    with pytest.raises(MySQLdb.OperationalError):
        MySQLdb.connect(host="127.0.0.1", port=port, user="ds_idem", password="first-password")
    MySQLdb.connect(host="127.0.0.1", port=port, user="ds_idem", password="second-password").close()


def test_changes_user_command_prints_a_url_that_passes_and_keeps_its_password(
    binlog_database: BinlogDatabase, settings: Settings
) -> None:
    name = "DATASERVICE_CHANGES_DATABASE_URL"
    env: dict[str, str | None] = {**binlog_database.on(settings).to_env(), name: None}
    args = ["db", "changes-user", "--user", "ds_cli"]
    first = CliRunner().invoke(app, args, env=env)
    assert first.exit_code == 0, first.output
    printed, _, url = first.stdout.strip().partition("=")
    assert printed == name
    assert make_url(url).username == "ds_cli"
    check_server(url)
    again = CliRunner().invoke(app, args, env={**env, name: url})
    assert again.exit_code == 0, again.output
    assert again.stdout.strip() == first.stdout.strip()


# make services ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_services_start_a_binlog_mariadb_when_the_configured_one_has_none(
    tmp_path: Path, config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    require(mysql_reachable("127.0.0.1", 3306), "MariaDB at 127.0.0.1:3306")
    shared = Settings(database_url=ROOT_URL + "dataservice")
    # Relative and not there yet, as `make services` in a fresh checkout has it.
    monkeypatch.chdir(tmp_path)
    state = Path("state")
    port = free_port()
    try:
        private = ensure_binlog(shared, config.database, state, port)
        assert private is not None
        assert private.started
        assert stat.S_IMODE(private.env_file.stat().st_mode) == 0o600
        assert read_env(private.env_file) == {
            DATABASE_VARIABLE: f"mysql+mysqldb://root@127.0.0.1:{port}/dataservice",
            CHANGES_VARIABLE: private.changes_url,
        }
        Settings.from_env(read_env(private.env_file))
        check_server(private.changes_url)
        again = ensure_binlog(shared, config.database, state, port)
        assert again is not None
        assert not again.started
        assert again.changes_url == private.changes_url, "the consumer's password is kept"
    finally:
        stopped = down(state)
        shutil.rmtree(mariadb_dir(state).parent, ignore_errors=True)
    assert stopped == ["binlog mariadb"]
    assert not mysql_reachable("127.0.0.1", port)


@pytest.mark.timeout(120)
def test_services_move_the_binlog_mariadb_off_a_port_something_else_answers_on(
    tmp_path: Path, config: Config
) -> None:
    """Another server on the port it would take (here: the shared MariaDB's,
    as an earlier run's file remembers it): a free port instead, and that one
    is remembered; a port asked for explicitly is not given up."""
    require(mysql_reachable("127.0.0.1", 3306), "MariaDB at 127.0.0.1:3306")
    shared = Settings(database_url=ROOT_URL + "dataservice")
    state = tmp_path / "state"
    state.mkdir()
    (state / "services.env").write_text(
        f"{DATABASE_VARIABLE}='mysql+mysqldb://root@127.0.0.1:3306/dataservice'\n"
    )
    with pytest.raises(ServiceSetupError, match="port 3306 answers"):
        ensure_binlog(shared, config.database, state, 3306)
    try:
        private = ensure_binlog(shared, config.database, state)
        assert private is not None
        assert private.started
        assert private.port != 3306
        assert f"127.0.0.1:{private.port}/" in read_env(private.env_file)[DATABASE_VARIABLE]
        again = ensure_binlog(shared, config.database, state)
        assert again is not None
        assert (again.port, again.started) == (private.port, False)
    finally:
        down(state)
        shutil.rmtree(mariadb_dir(state).parent, ignore_errors=True)


def test_services_leave_a_configured_database_with_a_binlog_as_it_is(
    binlog_database: BinlogDatabase, tmp_path: Path, config: Config
) -> None:
    stale = tmp_path / "services.env"
    stale.write_text(f"{DATABASE_VARIABLE}='mysql+mysqldb://root@127.0.0.1:1/x'\n")
    configured = Settings(database_url=binlog_database.admin_url)
    assert ensure_binlog(configured, config.database, tmp_path, free_port()) is None
    assert not stale.exists()
