"""Configuration is typed, frozen and validated on load; errors name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from dataservice import ConfigError, LaneName, Settings, load_config
from dataservice.config.model import UNTIL_DEADLINE, parse_config
from tests.conftest import SHIPPED_CONFIG
from tests.harness.support import changed


@pytest.fixture
def shipped() -> dict[str, Any]:
    data = yaml.safe_load(SHIPPED_CONFIG.read_text())
    assert isinstance(data, dict)
    return data


def test_shipped_configuration_loads(shipped: dict[str, Any]) -> None:
    config = parse_config(shipped)
    assert config.lanes[LaneName.INTERACTIVE].queue == "interactive"
    assert config.lanes[LaneName.BATCH].queue == "batch"
    assert config.longest_deadline_ms == config.lanes.batch.max_deadline_ms


def test_configuration_is_frozen(shipped: dict[str, Any]) -> None:
    config = parse_config(shipped)
    with pytest.raises(ValidationError):
        config.lanes.interactive.concurrency = 99  # type: ignore[misc]


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("lanes", "interactive", "concurency"), 3, "lanes.interactive.concurency: unknown key"),
        (("surprise",), 1, "surprise: unknown key"),
        (("lanes", "batch", "concurrency"), 0, "lanes.batch.concurrency"),
        (("lanes", "batch", "concurrency"), "3", "lanes.batch.concurrency"),
        (("limits", "max_payload_bytes"), 1 << 30, "limits.max_payload_bytes"),
        (("lanes", "interactive", "queue"), "Bad Queue!", "lanes.interactive.queue"),
        (("results", "grace_ms"), -1, "results.grace_ms"),
        (("lanes", "batch", "permit_wait_ms"), "forever", "lanes.batch.permit_wait_ms"),
        (("lanes", "batch", "permit_wait_ms"), "500", "lanes.batch.permit_wait_ms"),
        (("lanes", "interactive", "permit_wait_ms"), 0, "lanes.interactive.permit_wait_ms"),
        (("lanes", "interactive", "permit_wait_ms"), None, "lanes.interactive.permit_wait_ms"),
    ],
)
def test_bad_key_or_value_is_an_error_naming_it(
    shipped: dict[str, Any], path: tuple[str, ...], value: object, named: str
) -> None:
    data = changed(shipped, path, value)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        parse_config(data)


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("lanes", "interactive", "default_deadline_ms"), 60_000, "default_deadline_ms"),
        (("lanes", "batch", "queue"), "interactive", "different queues"),
        (("limits", "max_request_bytes"), 65_536, "max_request_bytes"),
        (("lanes", "batch", "admission", "max_bytes"), 1_000, "admission.max_bytes"),
        (("lanes", "interactive", "permit_wait_ms"), 2_000, "permit_wait_ms"),
    ],
)
def test_inconsistent_numbers_are_rejected(
    shipped: dict[str, Any], path: tuple[str, ...], value: object, named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_config(changed(shipped, path, value))


def test_each_lane_says_how_long_its_requests_wait_for_a_permit(shipped: dict[str, Any]) -> None:
    config = parse_config(shipped)
    assert config.lanes.interactive.permit_wait_ms == 500
    assert config.lanes.batch.permit_wait_ms == UNTIL_DEADLINE
    del shipped["lanes"]["batch"]["permit_wait_ms"]
    with pytest.raises(ConfigError, match=r"lanes\.batch\.permit_wait_ms: Field required"):
        parse_config(shipped)


def test_unreadable_or_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yml")
    broken = tmp_path / "broken.yml"
    broken.write_text("lanes: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    broken.write_text("- a list")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(broken)


def test_environment_overrides_and_rejects_unknown_variables() -> None:
    settings = Settings.from_env(
        {
            "DATASERVICE_BROKER_URL": "redis://broker:6379/1",
            "DATASERVICE_DATABASE_URL": "mysql+mysqldb://u@db/x",
            "UNRELATED": "ignored",
        }
    )
    assert settings.broker_url == "redis://broker:6379/1"
    assert settings.result_backend_url == "redis://127.0.0.1:6379/0"
    assert Settings.from_env(settings.to_env()) == settings
    with pytest.raises(ConfigError, match="DATASERVICE_BROKR_URL"):
        Settings.from_env({"DATASERVICE_BROKR_URL": "redis://x"})
    with pytest.raises(ConfigError, match="DATASERVICE_REDIS_URL"):
        Settings.from_env({"DATASERVICE_REDIS_URL": "http://x"})
    with pytest.raises(ConfigError, match="DATASERVICE_DATABASE_URL"):
        Settings.from_env({"DATASERVICE_DATABASE_URL": ""})
