"""The change consumer in compose/docker-compose.yml passes its own server
check (``dataservice.changes.server.check_server``) as it starts.

MariaDB writes the binlog the check asks for; the one-shot ``changes-user``
job runs ``dataservice db changes-user`` after the migration, as root, with
the consumer's own password; and the grants that command gives (its
``grant_statements``; tests/changes/test_changes_server.py shows on a real server that
it grants exactly those) are exactly the ones the check requires.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import URL, make_url

from dataservice.changes.grants import (
    REPLICATION,
    TABLE_PRIVILEGES,
    Grants,
    missing_grants,
    monitor_privilege,
)
from dataservice.changes.server import _REQUIRED as BINLOG_SETTINGS
from dataservice.changes.user import grant_statements
from tests.harness.compose_file import (
    CONSUMER,
    RAW_SERVICES,
    SERVICES,
    command,
    dataservice_environment,
    environment,
    mounted_config,
    parse,
    server_options,
    settings,
)

JOB = "changes-user"


def _consumer_url() -> URL:
    url = settings(SERVICES[CONSUMER]).changes_database_url
    assert url is not None, "the consumer has no DATASERVICE_CHANGES_DATABASE_URL"
    return make_url(url)


def _job() -> tuple[str, dict[str, Any]]:
    return parse(command(SERVICES[JOB]))


def _mariadb_version() -> tuple[int, ...]:
    tag = str(SERVICES["mariadb"]["image"]).partition(":")[2]
    match = re.match(r"(\d+)\.(\d+)", tag)
    assert match, f"mariadb's image tag {tag!r} names no version"
    return (int(match.group(1)), int(match.group(2)), 0)


def test_the_consumer_connects_as_a_user_of_its_own_never_as_the_service() -> None:
    consumer = dataservice_environment(SERVICES[CONSUMER])
    assert "DATASERVICE_DATABASE_URL" not in consumer, "it would know the service's password"
    url = _consumer_url()
    mariadb = environment(SERVICES["mariadb"])
    assert url.host == "mariadb"
    assert url.database == mariadb["MARIADB_DATABASE"]
    assert url.username not in {mariadb["MARIADB_USER"], "root"}
    assert url.password, "the consumer's URL carries its password"


def test_the_job_creates_that_user_with_that_password_after_the_migration() -> None:
    path, params = _job()
    assert path == "dataservice db changes-user"
    # Never a drawn password the consumer would not know, and none printed to the log.
    assert params["password_from_env"]
    job = settings(SERVICES[JOB])
    assert job.changes_database_url is not None
    assert make_url(job.changes_database_url) == _consumer_url()
    assert params["user"] == _consumer_url().username
    raw = RAW_SERVICES[JOB]["environment"]["DATASERVICE_CHANGES_DATABASE_URL"]
    assert raw == RAW_SERVICES[CONSUMER]["environment"]["DATASERVICE_CHANGES_DATABASE_URL"]
    depends_on = SERVICES[JOB]["depends_on"]
    # A table grant needs its table: the migration comes first.
    assert depends_on["migrate"]["condition"] == "service_completed_successfully"
    assert SERVICES[CONSUMER]["depends_on"][JOB]["condition"] == "service_completed_successfully"


def test_the_job_alone_connects_as_an_account_that_may_create_users() -> None:
    admin = make_url(settings(SERVICES[JOB]).database_url)
    mariadb = environment(SERVICES["mariadb"])
    assert admin.username == "root"
    assert admin.password == mariadb["MARIADB_ROOT_PASSWORD"]
    assert (admin.host, admin.database) == ("mariadb", _consumer_url().database)
    raw_root = "${MARIADB_ROOT_PASSWORD:"
    holders = [name for name, s in RAW_SERVICES.items() if raw_root in str(s.get("environment"))]
    assert sorted(holders) == sorted(["mariadb", JOB])


def test_the_user_may_connect_from_any_container() -> None:
    # Compose gives each container an address of its choosing on the network.
    assert "%" in _job()[1]["host"]


def test_the_grants_compose_gives_are_exactly_what_the_server_check_requires() -> None:
    database = _consumer_url().database
    assert database is not None
    monitor = monitor_privilege(True, _mariadb_version())
    assert monitor == "BINLOG MONITOR"
    given = Grants.parse(grant_statements(database, monitor))
    assert missing_grants(given, database, monitor) == []
    # ... and nothing more: a leaked consumer password changes no record.
    assert given.global_privileges == {REPLICATION, monitor}
    assert given.databases == ()
    assert given.revoked == {}
    assert dict(given.tables) == {
        (database, table): frozenset(privileges) for table, privileges in TABLE_PRIVILEGES.items()
    }


def test_mariadb_writes_the_binlog_the_server_check_requires() -> None:
    options = server_options(SERVICES["mariadb"])
    for name, wanted, _ in BINLOG_SETTINGS:
        if name == "log_bin":
            assert "log_bin" in options, "the binary log is not enabled (--log-bin)"
        else:
            assert options.get(name, "").upper() == wanted, f"--{name.replace('_', '-')}"
    server_id = int(options.get("server_id") or 0)
    assert server_id > 0, "--server-id must be set"
    replica_id = mounted_config(SERVICES[CONSUMER]).changes.server_id
    assert server_id != replica_id, "the consumer joins as a replica with changes.server_id"


def test_the_consumer_serves_liveness_and_metrics_and_has_a_standby() -> None:
    _, params = parse(command(SERVICES[CONSUMER]))
    assert params["alive_file"] is not None
    assert params["metrics_port"] == 9100
    # One holds the lease; the other takes over once it lapses.
    assert int(SERVICES[CONSUMER]["deploy"]["replicas"]) >= 2
