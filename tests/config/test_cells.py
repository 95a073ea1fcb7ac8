"""Cells: which cell a caller belongs to, the cells file, and the budget
shared by every cell's replicas."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataservice.config.budget import check_budget, process_share
from dataservice.config.cells import CellsConfig
from dataservice.config.model import Config, parse_config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ConfigError

CALLERS = [f"caller-{n}" for n in range(3000)]


def test_a_caller_belongs_to_the_same_cell_in_every_process_and_a_pin_wins() -> None:
    cells = CellsConfig(names=("a", "b", "c"), callers={"caller-1": "c"})
    assert cells.cell_of("caller-1", CALLERS) == "c"
    again = CellsConfig(names=("a", "b", "c"), callers={"caller-1": "c"})
    assert again.cell_of("caller-2", CALLERS) == cells.cell_of("caller-2", CALLERS)
    assert CellsConfig().cell_of("caller-2", CALLERS) is None
    assert CellsConfig().count == 1
    # A caller no policy names: its best cell by weight alone.
    assert cells.cell_of("stranger", CALLERS) in {"a", "b", "c"}


@pytest.mark.parametrize("count", [12, 13, 3000])
def test_the_cells_caller_counts_differ_by_one_at_most(count: int) -> None:
    callers = CALLERS[:count]
    loads = Counter(CellsConfig(names=("a", "b", "c")).assign(callers).values())
    assert max(loads.values()) - min(loads.values()) <= 1, loads
    pinned = CellsConfig(names=("a", "b", "c"), callers={"caller-1": "a", "caller-2": "a"})
    table = pinned.assign(callers)
    assert table["caller-1"] == table["caller-2"] == "a"
    loads = Counter(table.values())
    assert max(loads.values()) - min(loads.values()) <= 1, loads


def test_a_new_cell_takes_about_one_caller_in_n_and_moves_few_others() -> None:
    three = CellsConfig(names=("a", "b", "c")).assign(CALLERS)
    four = CellsConfig(names=("a", "b", "c", "d")).assign(CALLERS)
    moved = [caller for caller in CALLERS if three[caller] != four[caller]]
    to_new = [caller for caller in moved if four[caller] == "d"]
    assert len(to_new) == len(CALLERS) // 4
    assert len(moved) - len(to_new) <= len(CALLERS) // 100
    two = CellsConfig(names=("a", "c")).assign(CALLERS)
    moved = [caller for caller in CALLERS if three[caller] != two[caller]]
    assert len([c for c in moved if three[c] == "b"]) == len(CALLERS) // 3
    assert len(moved) - len(CALLERS) // 3 <= len(CALLERS) // 100


def _with(config: Config, **changes: Any) -> dict[str, Any]:
    data = config.model_dump(mode="python")
    for path, value in changes.items():
        node = data
        *parents, last = path.split("__")
        for parent in parents:
            node = node[parent]
        node[last] = value
    return data


@pytest.mark.parametrize(
    ("cells", "complaint"),
    [
        ({"names": ["a", "a"]}, "repeats a name"),
        ({"names": ["a"], "callers": {"tests": "b"}}, "not in cells.names"),
        ({"names": ["A"]}, "cells.names.0"),
        ({"names": ["a"], "extra": 1}, "unknown key"),
    ],
)
def test_a_bad_cells_section_is_refused(config: Config, cells: object, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        parse_config(_with(config, cells=cells))


def test_the_budget_counts_every_cells_replicas(config: Config) -> None:
    one = check_budget(config)
    assert one.ok
    active = config.budget.database_active - config.budget.reserved
    per_replica = sum(process_share(config.lanes[lane]).active for lane in LaneName)
    cells = active // (config.budget.max_replicas * per_replica) + 1
    names = [f"c{n}" for n in range(cells)]
    over = check_budget(parse_config(_with(config, cells={"names": names}, changes__guard=True)))
    assert not over.ok
    assert any(f"{cells} cells x {config.budget.max_replicas} replicas" in p for p in over.problems)
    # Fewer replicas in each cell bring it back.
    fewer = max(active // (cells * per_replica), 1)
    data = _with(config, cells={"names": names}, budget__max_replicas=fewer, changes__guard=True)
    assert not [p for p in check_budget(parse_config(data)).problems if "statements" in p]


@pytest.fixture
def cells_file(tmp_path: Path) -> Path:
    path = tmp_path / "cells.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "cells": {
                    "a": {"redis_url": "redis://ra:6379/0"},
                    "b": {
                        "redis_url": "redis://rb:6379/0",
                        "broker_url": "amqp://guest:guest@mq:5672/b",
                        "result_backend_url": "redis://rb:6379/1",
                    },
                }
            }
        )
    )
    return path


def test_a_cell_takes_its_urls_from_the_cells_file(config: Config, cells_file: Path) -> None:
    settings = Settings(cells_file=cells_file)
    a = settings.for_cell("a")
    assert (a.broker_url, a.result_backend_url, a.redis_url) == ("redis://ra:6379/0",) * 3
    assert a.cell == "a"
    b = settings.for_cell("b")
    assert (b.broker_url, b.result_backend_url) == (
        "amqp://guest:guest@mq:5672/b",
        "redis://rb:6379/1",
    )
    with pytest.raises(ConfigError, match="no cell 'c'"):
        settings.for_cell("c")
    with pytest.raises(ConfigError, match="DATASERVICE_CELLS_FILE"):
        Settings().for_cell("a")


def test_a_caller_gets_its_cells_settings_and_a_worker_must_name_its_cell(
    config: Config, cells_file: Path
) -> None:
    cells = parse_config(
        _with(config, cells={"names": ["a", "b"], "callers": {"tests": "b"}}, changes__guard=True)
    )
    settings = Settings(cells_file=cells_file)
    assert settings.for_caller("tests", cells).cell == "b"
    assert settings.for_caller("tests", config) is settings
    with pytest.raises(ConfigError, match="belongs to cell 'b'"):
        dataclasses.replace(settings, cell="a").for_caller("tests", cells)
    with pytest.raises(ConfigError, match="must name the one this process serves"):
        settings.for_worker(cells)
    with pytest.raises(ConfigError, match="not one of the cells"):
        dataclasses.replace(settings, cell="z").for_worker(cells)
    assert (
        dataclasses.replace(settings, cell="a").for_worker(cells).redis_url == "redis://ra:6379/0"
    )


@pytest.mark.parametrize(
    ("entry", "complaint"),
    [
        ({"broker_url": "redis://x:1/0"}, "redis_url is required"),
        ({"redis_url": "redis://x:1/0", "other": "y"}, "unknown key"),
        ({"redis_url": "http://x:1/0"}, "cells.a.redis_url must be a redis://"),
        ({"redis_url": "redis://x:1/0", "result_backend_url": "amqp://x"}, "result_backend_url"),
    ],
)
def test_a_bad_cells_file_is_refused_naming_the_key_and_never_the_url(
    tmp_path: Path, entry: dict[str, str], complaint: str
) -> None:
    path = tmp_path / "cells.yml"
    path.write_text(yaml.safe_dump({"cells": {"a": {**entry}}}))
    with pytest.raises(ConfigError, match=complaint) as raised:
        Settings(cells_file=path).for_cell("a")
    assert "x:1" not in str(raised.value)
