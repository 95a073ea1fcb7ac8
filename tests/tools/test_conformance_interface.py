"""The conformance interface's lines (tools/dataservice_tools/conformance/interface.py):
a result line's fields are checked for their types, so a caller's broken line
fails its own case with a clear message."""

from __future__ import annotations

from typing import Any

import pytest
from dataservice_tools.conformance.interface import (
    CallerInterfaceError,
    Hello,
    Outcome,
    dumps,
    loads,
)


def test_a_result_line_is_read_back_as_it_was_written() -> None:
    outcome = Outcome("RESOURCE_EXHAUSTED", "rate_limited", 750, 2, "", {}, None, "")
    assert Outcome.parse(loads(dumps(outcome.line("7")))) == outcome


@pytest.mark.parametrize(
    "line",
    [
        {"type": "result", "id": "1"},
        {"type": "ready", "id": "1", "status": "OK"},
        {"type": "result", "id": "1", "status": "OK", "retry_after_ms": "x"},
        {"type": "result", "id": "1", "status": "OK", "attempts": True},
        {"type": "result", "id": "1", "status": "OK", "result": []},
        {"type": "result", "id": "1", "status": "OK", "replay": "DEADLINE_EXCEEDED"},
    ],
)
def test_a_result_line_of_the_wrong_shape_is_the_callers_fault(line: dict[str, Any]) -> None:
    with pytest.raises(CallerInterfaceError):
        Outcome.parse(line)


@pytest.mark.parametrize("text", ["not json", "[1, 2]"])
def test_a_line_that_is_not_a_json_object_is_the_callers_fault(text: str) -> None:
    with pytest.raises(CallerInterfaceError):
        loads(text)


def test_a_hello_of_another_version_is_refused() -> None:
    hello = Hello("redis", "redis://x", "redis://x", {}).line()
    assert Hello.parse(hello).broker == "redis"
    with pytest.raises(CallerInterfaceError):
        Hello.parse({**hello, "version": 2})
