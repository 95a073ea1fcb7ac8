"""The command line, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import Engine

from dataservice.cli.console import WIDTH_OFF_TERMINAL, console
from dataservice.config.settings import Settings


def _run(args: list[str], settings: Settings, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataservice.cli", *args],
        env={**os.environ, **settings.to_env()},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def test_db_upgrade_is_idempotent(settings: Settings, database: Engine) -> None:
    result = _run(["db", "upgrade"], settings, 60)
    assert result.returncode == 0, result.stderr
    assert "schema at head" in result.stdout


def test_bad_environment_is_reported_not_raised(settings: Settings) -> None:
    env = {**settings.to_env(), "DATASERVICE_BOGUS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "dataservice.cli", "worker", "--lane", "batch"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "DATASERVICE_BOGUS" in result.stderr
    assert "Traceback" not in result.stderr


def test_off_a_terminal_tables_keep_their_cells_unless_columns_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == WIDTH_OFF_TERMINAL
    monkeypatch.setenv("COLUMNS", "90")
    assert console().width == 90
