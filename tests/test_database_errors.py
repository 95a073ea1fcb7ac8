"""Database failures reach callers as codes that say whether a retry is safe."""

from __future__ import annotations

import pytest

from dataservice.service import _database_error
from dataservice.status import StatusCode


@pytest.mark.parametrize(
    ("errno", "lost", "mutation", "code"),
    [
        (2003, False, True, StatusCode.UNAVAILABLE),  # cannot connect: nothing was sent
        (1213, False, True, StatusCode.UNAVAILABLE),  # deadlock: rolled back
        (1205, False, True, StatusCode.UNAVAILABLE),  # lock wait timeout: rolled back
        (1040, False, False, StatusCode.RESOURCE_EXHAUSTED),  # too many connections
        (2013, True, False, StatusCode.UNAVAILABLE),  # a read lost mid-statement
        (2013, True, True, StatusCode.DEADLINE_EXCEEDED),  # a write's outcome is unknown
        (1054, False, False, StatusCode.INTERNAL),  # unknown column: retrying cannot help
        (1142, False, True, StatusCode.INTERNAL),  # privilege
        (None, False, False, StatusCode.INTERNAL),
    ],
)
def test_database_errors_are_retryable_only_when_a_retry_is_safe(
    errno: int | None, lost: bool, mutation: bool, code: StatusCode
) -> None:
    error, retry_after_ms = _database_error(errno, lost, mutation)
    assert error.code is code
    assert (retry_after_ms > 0) == code.retryable
    assert "SELECT" not in error.message
    assert "INSERT" not in error.message
