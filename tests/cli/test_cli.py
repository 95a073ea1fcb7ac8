"""The command line, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine

from dataservice.cli.console import WIDTH_OFF_TERMINAL, console
from dataservice.config.cells import CellsConfig
from dataservice.config.settings import Settings
from tests.harness.support import with_changes


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


def test_cells_show_names_each_callers_cell_and_who_a_new_cell_would_take(
    settings: Settings, tmp_path: Path
) -> None:
    cells = {"names": ["a", "b"], "callers": {"demo": "b"}}
    configured = with_changes(
        settings, tmp_path / "queues.yml", {("cells",): cells, ("changes", "guard"): True}
    )
    result = _run(["cells", "show", "--with", "c"], configured, 30)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines["demo"].startswith("b (pinned)")
    callers = configured.load().callers
    rule = CellsConfig(names=("a", "b"), callers={"demo": "b"}).assign(callers)
    more = CellsConfig(names=("a", "b", "c"), callers={"demo": "b"}).assign(callers)
    for caller, shown in lines.items():
        if caller.startswith("cell "):
            continue
        assert shown.startswith(rule[caller])
        assert shown.endswith(f"-> {more[caller]}") == (more[caller] != rule[caller])


def test_a_worker_of_a_deployment_with_cells_must_name_its_cell(
    settings: Settings, tmp_path: Path
) -> None:
    configured = with_changes(
        settings,
        tmp_path / "queues.yml",
        {("cells",): {"names": ["a", "b"]}, ("changes", "guard"): True},
    )
    result = _run(["worker", "--lane", "batch"], configured, 30)
    assert result.returncode == 2
    assert "DATASERVICE_CELL (or --cell)" in result.stderr
    assert "Traceback" not in result.stderr
