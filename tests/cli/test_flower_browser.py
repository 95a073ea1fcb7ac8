"""Flower in a real browser: Debian's Chromium, headless, driven by Playwright,
logs in, opens the workers page and the broker page while a batch backlog
waits, finds both lanes with their lengths and a live worker node, and saves
screenshots under ``.state/artifacts/`` (kept after the run). On each broker:
on RabbitMQ Flower reads the lengths from its management API, whose counts
lag by seconds, so the broker page is read until they show."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from dataservice_tools.localservices import free_port, redis_reachable

from dataservice.broker.celery import celery_app
from dataservice.client import Client
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, wait_answering
from dataservice.types import ReadOp
from tests.conftest import require
from tests.harness.rabbit import BROKERS, on_rabbitmq
from tests.harness.support import on_redis

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / ".state" / "artifacts"
BROWSER_REDIS_URL = "redis://127.0.0.1:6379/8"
PASSWORD = "browser-test-password-41c9"
BACKLOG = 7
# RabbitMQ's management statistics are collected every 5 s.
LENGTHS_SETTLE_S = 15
# Chromium on a closed network: no background connections it would wait on.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(params=BROKERS)
def own(request: pytest.FixtureRequest, settings: Settings, config: Config) -> Iterator[Settings]:
    require(redis_reachable(BROWSER_REDIS_URL), "Redis at 127.0.0.1:6379")
    require(CHROMIUM.exists(), f"Chromium at {CHROMIUM} (scripts/bootstrap.sh installs it)")
    client = redis.Redis.from_url(BROWSER_REDIS_URL)
    client.flushdb()
    own = on_redis(settings, BROWSER_REDIS_URL)
    if request.param == "amqp":
        own = on_rabbitmq(own, config, "dataservice-browser")
    yield dataclasses.replace(own, flower_auth=f"ops:{PASSWORD}")
    client.flushdb()
    client.close()


@pytest.mark.timeout(120)
def test_flower_shows_both_lanes_with_their_lengths_and_the_workers(
    own: Settings, config: Config, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    # An interactive pool answers; no batch pool runs, so the batch backlog stays.
    worker = WorkerProcess.for_lane(own, LaneName.INTERACTIVE, tmp_path / "worker.log").start()
    port = free_port()
    flower = WorkerProcess.for_command(
        own, tmp_path / "flower.log", "flower", "--port", str(port)
    ).start()
    control = celery_app("browser-test", own, config)
    caller = Client("demo", own, config)
    # RabbitMQ lists the queues that exist: the change consumers' is made by
    # the first of them, and none runs here.
    expected = {"interactive": "0", "batch": str(BACKLOG)}
    if not own.broker_is_amqp:
        expected["changes"] = "0"
    queues = tuple(expected)
    try:
        wait_answering(control, [worker], 30)
        for n in range(BACKLOG):
            caller.submit(ReadOp("demo", f"backlog-{n}"), timeout=600)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                context = browser.new_context(
                    http_credentials={"username": "ops", "password": PASSWORD}
                )
                page = context.new_page()
                _goto(page, f"{base}/workers", flower)
                page.wait_for_selector("text=interactive-", timeout=20_000)
                page.screenshot(path=str(ARTIFACTS / "flower-workers.png"), full_page=True)
                lengths = _lengths(page, f"{base}/broker", flower, queues)
                page.screenshot(path=str(ARTIFACTS / "flower-broker.png"), full_page=True)
                # Without credentials Flower answers 401.
                anonymous = playwright.request.new_context()
                assert anonymous.get(f"{base}/broker").status == 401
                anonymous.dispose()
            finally:
                browser.close()
        assert lengths == expected
        assert (ARTIFACTS / "flower-broker.png").stat().st_size > 10_000
        assert (ARTIFACTS / "flower-workers.png").stat().st_size > 10_000
    finally:
        caller.close()
        control.close()
        flower.stop()
        worker.stop()


def _lengths(page: Any, url: str, flower: WorkerProcess, queues: tuple[str, ...]) -> dict[str, str]:
    """Each queue's length on Flower's broker page, read again until the
    batch backlog shows (RabbitMQ's management API counts a few seconds late)."""
    deadline = time.monotonic() + LENGTHS_SETTLE_S
    while True:
        _goto(page, url, flower)
        lengths = {q: page.inner_text(f"tr#{q} td:nth-child(2)").strip() for q in queues}
        if lengths.get("batch") == str(BACKLOG) or time.monotonic() > deadline:
            return lengths
        time.sleep(0.5)


def _goto(page: Any, url: str, flower: WorkerProcess) -> Any:
    """``page.goto(url)`` once Flower listens."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return page.goto(url)
        except Exception:
            flower.check_alive()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
