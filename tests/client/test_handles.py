"""Batch handles, of each client: waiting less than the deadline, and past it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from dataservice import DeadlineExceeded, ReadOp, ResultNotReady
from dataservice.config.model import Config
from tests.harness.clients import AnyClient
from tests.harness.support import now_ms


@pytest.fixture
def unserved_batch_lane(redis_client: redis.Redis, config: Config) -> Iterator[None]:
    """In Redis database 15 only the interactive lane has a worker."""
    yield
    redis_client.delete(config.lanes.batch.queue)


@pytest.mark.usefixtures("unserved_batch_lane")
def test_a_short_wait_says_not_ready_and_the_deadline_says_exceeded(
    any_client: AnyClient,
) -> None:
    handle = any_client.submit(ReadOp("s", "a"), timeout=0.5)
    start = time.monotonic()
    with pytest.raises(ResultNotReady):
        handle.result(timeout=0.05)
    # The short wait ended, not ready, before the deadline (which would have
    # said DeadlineExceeded instead).
    assert now_ms() < handle.deadline_ms
    assert not handle.done()
    with pytest.raises(DeadlineExceeded):
        handle.result()
    assert time.monotonic() - start < 1.5
