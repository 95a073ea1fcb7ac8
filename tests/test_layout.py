"""Modules stay small enough to read whole: no module of the service over 300
lines, no class over 150, and the request handler, which holds only the order
of the contract, under 200. Generated code is left out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 300
MAX_CLASS_LINES = 150
HANDLER = ROOT / "dataservice" / "worker" / "handler.py"
MAX_HANDLER_LINES = 200


def _modules() -> list[Path]:
    found = [
        path
        for package in ("dataservice", "workers")
        for path in sorted((ROOT / package).rglob("*.py"))
        if not path.name.endswith("_pb2.py")
    ]
    assert len(found) > 40
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_its_classes_stay_small(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert len(source.splitlines()) <= MAX_MODULE_LINES
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            assert length <= MAX_CLASS_LINES, f"class {node.name} has {length} lines"


def test_the_request_handler_holds_only_the_order_of_the_contract() -> None:
    assert len(HANDLER.read_text(encoding="utf-8").splitlines()) < MAX_HANDLER_LINES
