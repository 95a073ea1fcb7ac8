"""The FastAPI example (examples/fastapi_app.py) served by uvicorn, as a user
would run it: many concurrent requests answered through one AsyncClient, and
the service's refusals and deadlines as HTTP statuses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from dataservice_tools.localservices import free_port
from dataservice_tools.testkit.waits import eventually

from dataservice import Client, WriteOp
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.supervisor import Supervisor
from tests.harness.support import bounded_admission

ROOT = Path(__file__).resolve().parents[2]
# No worker consumes this database: whatever is admitted stays queued.
UNSERVED_REDIS_URL = "redis://127.0.0.1:6379/11"
CONCURRENT = 200


def _serve(settings: Settings, log: Path) -> Iterator[str]:
    """The example under uvicorn, on ``settings``; its base URL."""
    port = free_port()
    env = {**os.environ, **settings.to_env(), "RECORDS_CALLER": "tests"}
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def serving() -> bool:
            assert server.poll() is None, log.read_text()
            try:
                httpx.get(f"{base}/docs", timeout=1)
            except httpx.TransportError:
                return False
            return True

        eventually(serving, timeout=20, interval=0.1, message=log.read_text)
        yield base
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def served(
    worker_processes: Supervisor, process_settings: Settings, tmp_path: Path
) -> Iterator[str]:
    yield from _serve(process_settings, tmp_path / "uvicorn.log")


@pytest.fixture
def unserved(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, redis.Redis, Config]]:
    """The example on a broker nobody consumes, whose interactive lane holds three."""
    bounds = {"max_messages": 3, "max_bytes": 1 << 20}
    with bounded_admission(settings, UNSERVED_REDIS_URL, tmp_path, interactive=bounds) as bounded:
        own, config, broker = bounded
        for base in _serve(own, tmp_path / "uvicorn.log"):
            yield base, broker, config


async def _get_all(base: str, paths: list[str], timeout_s: float) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(paths))
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as http:
        headers = {"X-Request-Timeout": str(timeout_s)}
        return await asyncio.gather(*(http.get(path, headers=headers) for path in paths))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_hundred_concurrent_requests_are_answered(
    served: str, process_settings: Settings, config: Config, scope: str
) -> None:
    ids = [f"r{n}" for n in range(CONCURRENT)]
    with Client("tests", process_settings, config) as client:
        for handle in client.submit_many([WriteOp(scope, i, i.encode()) for i in ids]):
            handle.result()
    paths = [f"/records/{scope}/{i}" for i in ids]
    responses = asyncio.run(_get_all(served, [*paths, f"/records/{scope}/missing"], 10))
    *found, missing = responses
    assert [(r.status_code, r.content) for r in found] == [(200, i.encode()) for i in ids]
    assert all(r.headers["ETag"] == '"1"' for r in found)
    assert missing.status_code == 404


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_deadline_passed_is_504_and_a_refusal_503_with_retry_after(
    unserved: tuple[str, redis.Redis, Config],
) -> None:
    base, broker, config = unserved

    async def main() -> tuple[list[httpx.Response], httpx.Response]:
        waiting = asyncio.ensure_future(_get_all(base, [f"/records/s/w{n}" for n in range(3)], 1))
        # Once the three are queued, the lane is full.
        while broker.llen(config.lanes.interactive.queue) < 3:
            await asyncio.sleep(0.02)
        (refused,) = await _get_all(base, ["/records/s/one-too-many"], 1)
        return await waiting, refused

    timed_out, refused = asyncio.run(main())
    assert [r.status_code for r in timed_out] == [504, 504, 504]
    assert all(r.json()["error"] == "DeadlineExceeded" for r in timed_out)
    assert refused.status_code == 503
    assert refused.json()["error"] == "ResourceExhausted"
    assert int(refused.headers["Retry-After"]) >= 1
