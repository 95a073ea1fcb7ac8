"""Database failures reach callers as codes that say whether a retry is safe."""

from __future__ import annotations

import MySQLdb
import pytest
from sqlalchemy.exc import DBAPIError

from dataservice.enums import StatusCode
from dataservice.handler.failures import database_error, verdict


def _driver_error(errno: int | None, lost: bool) -> DBAPIError:
    orig = MySQLdb.OperationalError(errno, "detail") if errno else MySQLdb.OperationalError()
    return DBAPIError.instance(
        "SELECT secret FROM records", {}, orig, MySQLdb.Error, connection_invalidated=lost
    )


@pytest.mark.parametrize(
    ("errno", "lost", "code"),
    [
        (2003, False, StatusCode.UNAVAILABLE),  # cannot connect: nothing was sent
        (1213, False, StatusCode.UNAVAILABLE),  # deadlock: rolled back
        (1205, False, StatusCode.UNAVAILABLE),  # lock wait timeout: rolled back
        (1040, False, StatusCode.RESOURCE_EXHAUSTED),  # too many connections
        # Lost mid-statement: a read, or a write under its idempotency key, is
        # safe to retry (the key finds the outcome if the first attempt committed).
        (2013, True, StatusCode.UNAVAILABLE),
        (2006, False, StatusCode.UNAVAILABLE),
        (1054, False, StatusCode.INTERNAL),  # unknown column: retrying cannot help
        (1142, False, StatusCode.INTERNAL),  # privilege
        (None, False, StatusCode.INTERNAL),
    ],
)
def test_database_errors_are_retryable_only_when_a_retry_is_safe(
    errno: int | None, lost: bool, code: StatusCode
) -> None:
    answer = verdict(database_error(_driver_error(errno, lost)))
    assert answer.code is code
    assert (answer.retry_after_ms > 0) == code.retryable
    assert "SELECT" not in answer.message
    assert "secret" not in answer.message
