"""``dataservice conformance``: the runner drives a caller program through
every case on each broker. The Python clients (through their adapter) and
the Node caller in examples/node pass every one; a caller that only claims
success passes none, so the runner checks the service, not the caller's word."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from dataservice_tools.conformance.cases import CASES
from dataservice_tools.conformance.cli import BROKERS, run_conformance
from dataservice_tools.localservices.probes import redis_reachable
from sqlalchemy.engine import Engine

from dataservice.config.settings import Settings
from tests.conftest import require

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = f"{sys.executable} -m dataservice_tools.conformance.adapter"
NODE_EXAMPLE = ROOT / "examples" / "node"

# Answers every call OK, with nothing in it: what a caller that does nothing would say.
LIAR = """
import json, sys
sys.stdin.readline()
print(json.dumps({"type": "ready", "name": "liar"}), flush=True)
for line in sys.stdin:
    call = json.loads(line)
    print(json.dumps({"type": "result", "id": call["id"], "status": "OK"}), flush=True)
"""


def run(settings: Settings, command: str, broker: str, tmp_path: Path) -> tuple[int, int, str]:
    require(redis_reachable(settings.redis_url), "Redis at 127.0.0.1:6379")
    lines: list[str] = []
    passed, failed = run_conformance(lines.append, settings, command, broker, tmp_path / "logs")
    return passed, failed, "\n".join(lines)


@pytest.mark.parametrize("broker", BROKERS)
def test_the_python_clients_pass_every_case(
    settings: Settings, database: Engine, broker: str, tmp_path: Path
) -> None:
    passed, failed, said = run(settings, ADAPTER, broker, tmp_path)
    assert (passed, failed) == (len(CASES), 0), said
    assert said.splitlines()[-1] == f"{len(CASES)} passed, 0 failed"


@pytest.mark.parametrize("broker", BROKERS)
def test_the_node_caller_passes_every_case(
    settings: Settings, database: Engine, broker: str, tmp_path: Path
) -> None:
    node = shutil.which("node")
    require(node is not None, "Node.js (scripts/bootstrap.sh installs it)")
    require(
        (NODE_EXAMPLE / "node_modules").is_dir(),
        "examples/node's packages (scripts/bootstrap.sh runs npm ci)",
    )
    command = f"{node} {NODE_EXAMPLE / 'caller.js'}"
    passed, failed, said = run(settings, command, broker, tmp_path)
    assert (passed, failed) == (len(CASES), 0), said


def test_a_caller_that_only_claims_success_passes_no_case(
    settings: Settings, database: Engine, tmp_path: Path
) -> None:
    liar = tmp_path / "liar.py"
    liar.write_text(LIAR, encoding="utf-8")
    passed, failed, said = run(settings, f"{sys.executable} {liar}", "redis", tmp_path)
    assert (passed, failed) == (0, len(CASES)), said


def test_a_caller_that_dies_fails_the_cases_it_left(
    settings: Settings, database: Engine, tmp_path: Path
) -> None:
    passed, failed, said = run(settings, f"{sys.executable} -c pass", "redis", tmp_path)
    assert (passed, failed) == (0, len(CASES)), said
    assert "did not say ready" in said
