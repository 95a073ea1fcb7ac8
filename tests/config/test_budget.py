"""Acceptance: the budget arithmetic is checked, printed, and enforced at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataservice.config.budget import check_budget, require_within_budget
from dataservice.config.model import ConfigError, parse_config
from dataservice.enums import LaneName
from tests.conftest import SHIPPED_CONFIG
from tests.harness.support import changed


@pytest.fixture
def shipped() -> dict[str, Any]:
    data = yaml.safe_load(SHIPPED_CONFIG.read_text())
    assert isinstance(data, dict)
    return data


def _cli(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATASERVICE_CONFIG": str(config)}
    return subprocess.run(
        [sys.executable, "-m", "dataservice.cli", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "queues.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_check_config_passes_on_the_shipped_file_and_prints_the_arithmetic() -> None:
    result = _cli("check-config", config=SHIPPED_CONFIG)
    assert result.returncode == 0, result.stderr
    assert "120 active - 20 reserved = 100" in result.stdout
    assert "8 replicas x 12 statements = 96 <= 100 ok" in result.stdout
    assert "within budget" in result.stdout


def test_check_config_fails_naming_the_numbers_with_twenty_replicas(
    shipped: dict[str, Any], tmp_path: Path
) -> None:
    shipped["budget"]["max_replicas"] = 20
    result = _cli("check-config", config=_write(tmp_path, shipped))
    assert result.returncode == 1
    assert "20 replicas x 12 statements = 240 exceeds 120 - 20 = 100" in result.stderr
    assert "20 replicas x 12 connections = 240 exceeds budget.max_connections (150)" in (
        result.stderr
    )


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("lanes", "batch", "classes", "bounded_list"), 4, "lanes.batch.classes.bounded_list (4)"),
        (("budget", "reserved"), 120, "leaves nothing"),
        (("lanes", "interactive", "permits"), 9, "8 replicas x 14 statements = 112 exceeds"),
    ],
)
def test_each_broken_bound_is_named(
    shipped: dict[str, Any], path: tuple[str, ...], value: int, named: str
) -> None:
    data = changed(shipped, path, value)
    check = check_budget(parse_config(data))
    assert not check.ok
    assert any(named in problem for problem in check.problems), check.problems


def test_threads_beyond_the_permits_add_no_connection(shipped: dict[str, Any]) -> None:
    """A replica's connections are its threads up to its permits: a thread
    takes one only while it holds a permit."""
    shipped["lanes"]["interactive"]["concurrency"] = 40
    check = check_budget(parse_config(shipped))
    assert check.ok, check.problems
    # The shipped pools: interactive 7 (its permits), batch 3 (its permits, for 8
    # threads), each with its process's administrative connection.
    assert "connections: interactive 7 + 1 + batch 3 + 1 = 12 per replica x 8 replicas = 96" in (
        "\n".join(check.lines)
    )
    require_within_budget(parse_config(shipped), LaneName.INTERACTIVE, 40)


def test_a_worker_refuses_an_over_budget_configuration(
    shipped: dict[str, Any], tmp_path: Path
) -> None:
    shipped["budget"]["max_replicas"] = 20
    result = _cli("worker", "--lane", "batch", config=_write(tmp_path, shipped))
    assert result.returncode == 2
    assert "exceeds the database budget" in result.stderr


def test_within_budget_start_up_check_accepts_any_thread_count(shipped: dict[str, Any]) -> None:
    config = parse_config(shipped)
    require_within_budget(config, LaneName.BATCH, 3)
    require_within_budget(config, LaneName.BATCH, 12)
    with pytest.raises(ConfigError, match="at least one thread"):
        require_within_budget(config, LaneName.BATCH, 0)


def test_the_operations_guide_shows_what_check_config_prints_for_the_shipped_file() -> None:
    guide = (SHIPPED_CONFIG.parent / "docs" / "operations.md").read_text()
    block = guide.split("$ dataservice check-config\n", 1)[1].split("```", 1)[0]
    printed = _cli("check-config", config=SHIPPED_CONFIG).stdout
    # The guide names the file as an operator would; the test passes its path.
    assert block.splitlines()[1:] == printed.splitlines()[1:]
