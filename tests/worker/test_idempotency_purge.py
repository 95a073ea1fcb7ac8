"""Expired idempotency outcomes are purged by the batch lane's workers, in
bounded statements, and only expired ones: the table does not grow forever."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, text

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.worker.app import LaneRuntime

CALLER = "tests-purge"


@pytest.fixture
def outcomes(database: Engine) -> Iterator[Engine]:
    """Seven expired outcomes and one that is still live."""
    insert = text(
        "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, outcome, revision,"
        " created, expires_at) VALUES (:caller, :key, :fp, 0, 1, 1,"
        " TIMESTAMPADD(SECOND, :offset, UTC_TIMESTAMP(6)))"
    )
    rows = [
        {"caller": CALLER, "key": f"old-{n}", "fp": b"\0" * 32, "offset": -60} for n in range(7)
    ]
    rows.append({"caller": CALLER, "key": "live", "fp": b"\0" * 32, "offset": 3600})
    with database.begin() as conn:
        conn.execute(text("DELETE FROM idempotency_keys WHERE caller = :c"), {"c": CALLER})
        conn.execute(insert, rows)
    yield database
    with database.begin() as conn:
        conn.execute(text("DELETE FROM idempotency_keys WHERE caller = :c"), {"c": CALLER})


def _left(database: Engine) -> set[str]:
    with database.connect() as conn:
        query = text("SELECT idem_key FROM idempotency_keys WHERE caller = :c")
        return {row[0] for row in conn.execute(query, {"c": CALLER})}


@pytest.mark.timeout(30)
def test_batch_workers_purge_expired_outcomes_only(
    settings: Settings, config: Config, outcomes: Engine
) -> None:
    quick = config.idempotency.model_copy(update={"purge_interval_s": 1, "purge_batch": 3})
    runtime = LaneRuntime(
        settings, config.model_copy(update={"idempotency": quick}), LaneName.BATCH
    )
    try:
        # Other tests' expired outcomes may be purged too; this caller's live one never.
        eventually(lambda: _left(outcomes) == {"live"}, timeout=10, interval=0.1,
                   message=lambda: f"only the live outcome left: {_left(outcomes)}")  # fmt: skip
        # Each round was a write under a batch permit, given back.
        snapshot = runtime.permits.snapshot()
        assert snapshot.acquired_total >= 3  # 7 rows, 3 per statement
        assert snapshot.in_use == 0
    finally:
        runtime.close()


def test_interactive_workers_do_not_purge(
    settings: Settings, config: Config, outcomes: Engine
) -> None:
    quick = config.idempotency.model_copy(update={"purge_interval_s": 1})
    runtime = LaneRuntime(
        settings, config.model_copy(update={"idempotency": quick}), LaneName.INTERACTIVE
    )
    try:
        time.sleep(1.5)
        assert len(_left(outcomes)) == 8
    finally:
        runtime.close()
