"""``dataservice db changes-user --password-from-env``: a deployment that gives
the consumer its URL (compose/) creates the user with that URL's password,
never a drawn one, and no line it prints carries the password."""

from __future__ import annotations

import MySQLdb
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from dataservice.changes.server import check_server
from dataservice.changes.user import changes_url
from dataservice.cli import app
from dataservice.config.settings import Settings
from tests.harness.binlog import BinlogDatabase

VARIABLE = "DATASERVICE_CHANGES_DATABASE_URL"
PASSWORD = "from-the-environment-5e1b"


def _environment(binlog_database: BinlogDatabase, settings: Settings) -> dict[str, str | None]:
    return {**binlog_database.on(settings).to_env(), VARIABLE: None}


def _user_exists(admin_url: str, user: str) -> bool:
    engine = create_engine(admin_url)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT COUNT(*) FROM mysql.user WHERE User = :u"), {"u": user}
            )
            return bool(found.scalar_one())
    finally:
        engine.dispose()


def test_the_user_gets_the_environment_password_and_the_printed_url_hides_it(
    binlog_database: BinlogDatabase, settings: Settings
) -> None:
    url = changes_url(binlog_database.admin_url, "ds_env", PASSWORD)
    env = {**_environment(binlog_database, settings), VARIABLE: url}
    args = ["db", "changes-user", "--user", "ds_env", "--host", "%", "--password-from-env"]
    for _ in range(2):  # and again: nothing changes
        result = CliRunner().invoke(app, args, env=env)
        assert result.exit_code == 0, result.output
        assert PASSWORD not in result.output
        printed, _, shown = result.stdout.strip().partition("=")
        assert printed == VARIABLE
        assert make_url(shown).username == "ds_env"
        assert make_url(shown).password == "***"
        check_server(url)
    port = binlog_database.server.port
    MySQLdb.connect(host="127.0.0.1", port=port, user="ds_env", password=PASSWORD).close()


@pytest.mark.parametrize(
    "url",
    [None, "mysql+mysqldb://someone:pw@127.0.0.1/db", "mysql+mysqldb://ds_none@127.0.0.1/db"],
    ids=["unset", "another-user", "no-password"],
)
def test_without_a_password_for_that_user_in_the_environment_nothing_is_created(
    binlog_database: BinlogDatabase, settings: Settings, url: str | None
) -> None:
    env = {**_environment(binlog_database, settings), VARIABLE: url}
    args = ["db", "changes-user", "--user", "ds_none", "--password-from-env"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert "--password-from-env" in result.stderr
    assert "pw@" not in result.output
    assert not _user_exists(binlog_database.admin_url, "ds_none")
