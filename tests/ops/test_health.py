"""``dataservice health``: liveness never touches the database; deep readiness
does (docs/operations.md, "Health"). A real worker process touches its alive
file from its consumer loop; the database is a private MariaDB the test stops."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml
from dataservice_tools.testkit.waits import eventually

from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.health import Check, HealthExit, exit_status, liveness
from dataservice.ops.processes import WorkerProcess, dataservice_argv, worker_environ
from tests.conftest import PROCESS_REDIS_URL, SHIPPED_CONFIG
from tests.harness.binlog import BinlogDatabase
from tests.harness.support import on_redis


def _health(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        dataservice_argv("health", *args),
        env=worker_environ(settings),
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )


def _wait_for_file(path: Path, worker: WorkerProcess, timeout_s: float = 30) -> None:
    def appeared() -> bool:
        worker.check_alive()
        return path.exists()

    eventually(appeared, timeout=timeout_s, interval=0.1,
               message=lambda: f"{path} to appear:\n{worker.log_tail()}")  # fmt: skip


def test_an_alive_file_must_exist_and_be_fresh(tmp_path: Path) -> None:
    settings = Settings(broker_url=PROCESS_REDIS_URL)
    fresh, stale, missing = tmp_path / "fresh", tmp_path / "stale", tmp_path / "missing"
    fresh.touch()
    stale.touch()
    os.utime(stale, (time.time() - 30, time.time() - 30))
    broker, *files = liveness(settings, [fresh, stale, missing], 10.0, 2.0)
    assert broker.ok
    assert [check.ok for check in files] == [True, False, False]
    assert "30" in files[1].detail
    assert "missing" in files[2].detail


def test_exit_status_puts_liveness_before_readiness() -> None:
    good, bad = Check("a", True, ""), Check("b", False, "")
    assert exit_status([good], []) is HealthExit.OK
    assert exit_status([good], [good]) is HealthExit.OK
    assert exit_status([good], [bad]) is HealthExit.NOT_READY
    assert exit_status([bad], [bad]) is HealthExit.NOT_LIVE
    assert exit_status([bad], []) is HealthExit.NOT_LIVE


@pytest.mark.fault
@pytest.mark.timeout(150)
def test_with_the_database_stopped_liveness_stays_green_and_deep_readiness_turns_red(
    binlog_database: BinlogDatabase, settings: Settings, tmp_path: Path
) -> None:
    redis.Redis.from_url(PROCESS_REDIS_URL).flushdb()
    # The change stream is another check's business: here the database alone turns red.
    document = yaml.safe_load(SHIPPED_CONFIG.read_text())
    document["changes"]["guard"] = False
    config_path = tmp_path / "queues.yml"
    config_path.write_text(yaml.safe_dump(document))
    own = dataclasses.replace(
        binlog_database.on(on_redis(settings, PROCESS_REDIS_URL)), config_path=config_path
    )
    alive = tmp_path / "alive" / "interactive"
    worker = WorkerProcess.for_lane(
        own, LaneName.INTERACTIVE, tmp_path / "worker.log", "--alive-file", str(alive)
    ).start()
    try:
        _wait_for_file(alive, worker)
        args = ("--alive-file", str(alive), "--max-age", "3")
        assert _health(own, *args).returncode == HealthExit.OK
        deep = _health(own, *args, "--deep")
        assert deep.returncode == HealthExit.OK, deep.stdout
        binlog_database.stop()
        try:
            for _ in range(3):  # for longer than the alive file may go untouched
                live = _health(own, *args)
                assert live.returncode == HealthExit.OK, live.stdout
                deep = _health(own, *args, "--deep")
                assert deep.returncode == HealthExit.NOT_READY, deep.stdout
                assert "FAIL ready database" in deep.stdout
                time.sleep(1)
            worker.check_alive()
        finally:
            binlog_database.start()
        # A loop that stops turning goes stale, database or not.
        worker.send_signal(signal.SIGSTOP)
        time.sleep(4)
        stopped = _health(own, *args)
        worker.send_signal(signal.SIGCONT)
        assert stopped.returncode == HealthExit.NOT_LIVE, stopped.stdout
        assert "FAIL live  alive" in stopped.stdout
    finally:
        worker.stop()
