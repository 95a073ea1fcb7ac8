"""``dataservice run`` starts the change consumer beside both pools, and its
summary shows the consumer's role, position and lag (seconds, events behind)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from dataservice_tools.testkit.waits import eventually
from rich.console import Console

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.supervisor import Supervisor
from tests.harness.binlog import BinlogDatabase
from tests.harness.changes import CHANGES_REDIS_URL
from tests.harness.support import on_redis


def _caption(supervisor: Supervisor) -> str:
    console = Console(width=200, record=True)
    console.print(supervisor.table(supervisor.snapshot()))
    # The table wraps long lines: a phrase may span two.
    return " ".join(console.export_text().split())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_summary_shows_the_consumer_beside_both_lanes(
    binlog_database: BinlogDatabase, settings: Settings, config: Config, tmp_path: Path
) -> None:
    redis.Redis.from_url(CHANGES_REDIS_URL).flushdb()
    own = binlog_database.on(on_redis(settings, CHANGES_REDIS_URL))
    supervisor = Supervisor(own, config, tmp_path, changes=True)
    supervisor.start()
    try:
        supervisor.wait_ready()
        eventually(lambda: "change consumer: active" in _caption(supervisor), timeout=30)
        # Events behind the server beside the seconds: none, once it has caught up.
        eventually(lambda: "lag 0.0 s, 0 events behind," in _caption(supervisor), timeout=30)
        text = _caption(supervisor)
        assert "interactive" in text
        assert "batch" in text
        assert "token 1" in text
    finally:
        supervisor.stop()
        redis.Redis.from_url(CHANGES_REDIS_URL).flushdb()
