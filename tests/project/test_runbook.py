"""docs/runbook.md is pinned to what it points at: one section per symptom
panel of the Grafana dashboard, every metric it names exported, every
scenario it names runnable, and every ``dataservice`` command it gives a real
command line of the CLI."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from dataservice_tools.loadtest.scenarios import SCENARIOS

from dataservice.observe.metrics import REGISTRY
from tests.harness.compose_file import check_options, resolve
from tests.project.test_compose_monitoring import DASHBOARD, SYMPTOMS

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"


def _text() -> str:
    return RUNBOOK.read_text(encoding="utf-8")


def _spans() -> list[str]:
    # A span may wrap across lines in the Markdown source.
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", _text(), re.S)]


def test_one_section_per_symptom_and_a_dashboard_panel_for_each() -> None:
    sections = re.findall(r"^## (.+)$", _text(), re.M)
    assert tuple(sections) == SYMPTOMS
    panels = {panel["title"] for panel in DASHBOARD["panels"]}
    assert set(SYMPTOMS) <= panels


def test_each_section_says_what_shows_it_and_how_to_reproduce_it() -> None:
    for section in re.split(r"^## ", _text(), flags=re.M)[1:]:
        title = section.splitlines()[0]
        assert "**Shows it**" in section, title
        assert "**Reproduce**" in section, title
        assert "dataservice_" in section, f"{title}: names no metric"


def test_every_metric_the_runbook_names_is_exported() -> None:
    samples = {sample.name for family in REGISTRY.collect() for sample in family.samples} | {
        family.name for family in REGISTRY.collect()
    }
    # Families with no sample yet (a labelled counter never touched) still count.
    exported = samples | {name + suffix for name in samples for suffix in ("_total", "_bucket")}
    named = {m for span in _spans() for m in re.findall(r"\bdataservice_[a-z_]+", span)}
    commands = {"dataservice_permits", "dataservice_changes"}  # celery inspect commands
    assert named - commands, "the runbook names no metric"
    assert not named - exported - commands, f"not exported: {sorted(named - exported - commands)}"


def test_every_scenario_the_runbook_names_exists() -> None:
    named = set(re.findall(r"--scenario ([a-z-]+)", _text()))
    assert named, "the runbook reproduces nothing with the load test"
    assert named <= set(SCENARIOS), f"unknown scenarios: {sorted(named - set(SCENARIOS))}"


def _command_lines() -> list[list[str]]:
    lines = []
    for span in _spans():
        if not span.startswith("dataservice ") or "<" in span or "..." in span:
            continue
        lines.append(shlex.split(span))
    return lines


@pytest.mark.parametrize("line", _command_lines(), ids=" ".join)
def test_every_command_the_runbook_gives_is_a_command_of_the_cli(line: list[str]) -> None:
    check_options(*resolve(line))
