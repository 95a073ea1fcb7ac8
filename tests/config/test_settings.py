"""``DATASERVICE_*`` variables: the change consumer's own connection, and
the table in docs/operations.md ("Environment variables") naming every variable
the settings read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dataservice.config import settings as settings_module
from dataservice.config.settings import Settings
from dataservice.errors import ConfigError

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
CONSUMER_URL = "mysql+mysqldb://ds_changes:pw@127.0.0.1:3307/dataservice"


def test_the_consumer_connects_as_the_service_unless_given_its_own_url() -> None:
    plain = Settings.from_env({"DATASERVICE_DATABASE_URL": "mysql+mysqldb://u@db/x"})
    assert plain.changes_database_url is None
    assert plain.changes_url == "mysql+mysqldb://u@db/x"
    assert "DATASERVICE_CHANGES_DATABASE_URL" not in plain.to_env()
    own = Settings.from_env({"DATASERVICE_CHANGES_DATABASE_URL": CONSUMER_URL})
    assert own.changes_url == CONSUMER_URL
    assert Settings.from_env(own.to_env()) == own


@pytest.mark.parametrize("value", ["", "redis://127.0.0.1:6379/0"])
def test_a_changes_url_that_is_not_mysql_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="DATASERVICE_CHANGES_DATABASE_URL"):
        Settings.from_env({"DATASERVICE_CHANGES_DATABASE_URL": value})


def test_the_operations_guide_lists_every_variable_the_settings_read() -> None:
    text = OPERATIONS.read_text()
    documented = set(re.findall(r"^\| `(DATASERVICE_\w+)` \|", text, re.MULTILINE))
    assert documented == set(settings_module._ENV_FIELDS)


def test_flower_credentials_come_from_the_environment_and_stay_out_of_reprs() -> None:
    settings = Settings.from_env({"DATASERVICE_FLOWER_AUTH": "ops:hunter2"})
    assert settings.flower_auth == "ops:hunter2"
    assert "hunter2" not in repr(settings)
    assert settings.to_env()["DATASERVICE_FLOWER_AUTH"] == "ops:hunter2"
