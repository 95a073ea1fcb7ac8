"""``dataservice flower``: authenticated by default, never unauthenticated off
loopback, and showing the lanes' and the consumers' queues with their
lengths. A real Flower process on a Redis db no worker serves."""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from dataservice_tools.localservices import PrivateRedis, free_port, redis_reachable
from dataservice_tools.localservices.flower_env import ensure_flower_env
from dataservice_tools.localservices.sentinel import SentinelGroup
from dataservice_tools.testkit.waits import eventually
from rich.console import Console

from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.processes import WorkerProcess, dataservice_argv, worker_environ
from dataservice.ops.supervisor import Supervisor
from dataservice.types import ReadOp
from tests.conftest import require
from tests.harness.support import on_redis, with_changes

FLOWER_REDIS_URL = "redis://127.0.0.1:6379/8"
PASSWORD = "flower-test-password-7d1f"
AUTH = f"ops:{PASSWORD}"


@pytest.fixture
def own(settings: Settings) -> Iterator[Settings]:
    require(redis_reachable(FLOWER_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(FLOWER_REDIS_URL)
    client.flushdb()
    yield dataclasses.replace(on_redis(settings, FLOWER_REDIS_URL), flower_auth=AUTH)
    client.flushdb()
    client.close()


def _get(url: str, auth: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            body = response.read()
            kind = response.headers.get("Content-Type", "")
            return response.status, json.loads(body) if "json" in kind else body
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except urllib.error.URLError:
        return 0, None  # not listening (yet)


def _refused(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        dataservice_argv("flower", *args),
        env=worker_environ(settings),
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.slow
def test_flower_without_credentials_or_unauthenticated_off_loopback_is_refused(
    own: Settings,
) -> None:
    none = dataclasses.replace(own, flower_auth=None)
    refused = _refused(none, "--port", str(free_port()))
    assert refused.returncode == 2
    assert "DATASERVICE_FLOWER_AUTH" in refused.stderr
    refused = _refused(own, "--no-auth", "--address", "0.0.0.0", "--port", str(free_port()))
    assert refused.returncode == 2
    assert "loopback" in refused.stderr
    bad = dataclasses.replace(own, flower_auth="ops")
    refused = _refused(bad, "--port", str(free_port()))
    assert refused.returncode == 2
    assert "user:password" in refused.stderr


@pytest.mark.timeout(60)
def test_flower_shows_every_queue_with_its_length_to_an_operator_only(
    own: Settings, config: Config, tmp_path: Path
) -> None:
    caller = Client("demo", own, config)
    try:
        for n in range(3):
            caller.submit(ReadOp("demo", f"waiting-{n}"), timeout=600)
    finally:
        caller.close()
    port = free_port()
    flower = WorkerProcess.for_command(
        own, tmp_path / "flower.log", "flower", "--port", str(port)
    ).start()
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            flower.check_alive()
            return bool(_get(f"{base}/healthcheck")[0] == 200)

        eventually(healthy, timeout=30, interval=0.2, message=flower.log_tail)
        assert _get(f"{base}/api/queues/length")[0] == 401
        assert _get(f"{base}/api/queues/length", "ops:wrong")[0] == 401
        status, body = _get(f"{base}/api/queues/length", AUTH)
        assert status == 200
        lengths = {queue["name"]: queue["messages"] for queue in body["active_queues"]}
        assert lengths == {"interactive": 0, "batch": 3, "changes": 0}
        # The password is in no command line and no log line.
        assert PASSWORD not in " ".join(flower.argv)
        assert PASSWORD not in Path(f"/proc/{flower.pid}/cmdline").read_text(errors="replace")
    finally:
        flower.stop()
    assert PASSWORD not in (tmp_path / "flower.log").read_text(errors="replace")


def _started_flower(settings: Settings, log: Path, *args: str) -> tuple[WorkerProcess, str]:
    port = free_port()
    flower = WorkerProcess.for_command(settings, log, "flower", "--port", str(port), *args).start()
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        flower.check_alive()
        return bool(_get(f"{base}/healthcheck")[0] == 200)

    try:
        eventually(healthy, timeout=30, interval=0.2, message=flower.log_tail)
    except BaseException:
        flower.stop()
        raise
    return flower, base


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_with_cells_each_flower_watches_the_cell_it_is_given(own: Settings, tmp_path: Path) -> None:
    """Cell a on a Sentinel-managed primary, cell b on a Redis of its own: a
    Flower per cell shows that cell's queues, and one given no cell is refused."""
    with SentinelGroup(tmp_path / "cell-a") as group:
        cell_b = PrivateRedis(tmp_path / "cell-b")
        cell_b.start()
        try:
            cells_file = tmp_path / "cells.yml"
            urls = {"a": group.url(), "b": cell_b.url}
            cells_file.write_text(
                yaml.safe_dump({"cells": {n: {"redis_url": u} for n, u in urls.items()}})
            )
            cells = {"names": ["a", "b"], "callers": {"demo": "b"}}
            settings = with_changes(own, tmp_path / "queues.yml", {("cells",): cells})
            settings = dataclasses.replace(settings, cells_file=cells_file)
            config = settings.load()
            caller = Client("demo", settings, config)
            try:
                for n in range(3):
                    caller.submit(ReadOp("demo", f"waiting-{n}"), timeout=600)
            finally:
                caller.close()

            refused = _refused(settings, "--port", str(free_port()))
            assert refused.returncode == 2
            assert "DATASERVICE_CELL" in refused.stderr
            lengths = {}
            for cell in ("a", "b"):
                flower, base = _started_flower(settings, tmp_path / f"flower-{cell}.log",
                                               "--cell", cell)  # fmt: skip
                try:
                    status, body = _get(f"{base}/api/queues/length", AUTH)
                finally:
                    flower.stop()
                assert status == 200, flower.log_tail()
                lengths[cell] = {q["name"]: q["messages"] for q in body["active_queues"]}
        finally:
            cell_b.signal(9)
    assert lengths["a"] == {"interactive": 0, "batch": 0, "changes": 0}
    assert lengths["b"] == {"interactive": 0, "batch": 3, "changes": 0}


@pytest.mark.timeout(60)
def test_run_starts_flower_beside_the_pools_and_shows_its_address(
    own: Settings, config: Config, tmp_path: Path
) -> None:
    port = free_port()
    supervisor = Supervisor(own, config, tmp_path, lanes=(), flower_port=port)
    supervisor.start()
    try:

        def healthy() -> bool:
            supervisor.check_pools()
            return bool(_get(f"http://127.0.0.1:{port}/healthcheck")[0] == 200)

        eventually(healthy, timeout=30, interval=0.2, message=(tmp_path / "flower.log").read_text)
        console = Console(width=200, record=True)
        console.print(supervisor.table(supervisor.snapshot()))
        assert f"Flower: http://127.0.0.1:{port}" in console.export_text()
    finally:
        supervisor.stop()


def test_make_services_writes_flowers_credentials_once_and_privately(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATASERVICE_FLOWER_AUTH", raising=False)
    path = ensure_flower_env(tmp_path / "state")
    assert path is not None
    assert path.stat().st_mode & 0o777 == 0o600
    first = path.read_text()
    auth = Settings.from_env(
        {"DATASERVICE_FLOWER_AUTH": first.split("DATASERVICE_FLOWER_AUTH=")[1].strip()}
    ).flower_auth
    assert auth is not None
    assert auth.startswith("ops:")
    assert len(auth) > 20
    assert ensure_flower_env(tmp_path / "state") == path
    assert path.read_text() == first
    monkeypatch.setenv("DATASERVICE_FLOWER_AUTH", "ops:given")
    assert ensure_flower_env(tmp_path / "other") is None
