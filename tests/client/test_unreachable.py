"""A caller whose broker or result backend is down gets a fast, retryable error."""

from __future__ import annotations

import time

import pytest
from dataservice_tools.localservices import free_port

from dataservice import RetryableError, Unavailable
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from tests.harness.clients import ClientKind, make_client
from tests.harness.support import on_redis


@pytest.mark.timeout(30)
def test_unreachable_broker_is_unavailable_within_a_bounded_time(
    client_kind: ClientKind, settings: Settings, config: Config
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    unreachable = on_redis(settings, dead)
    with make_client(client_kind, "tests", unreachable, config) as client:
        start = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            client.read("s", "a", timeout=1.0)
        elapsed = time.monotonic() - start
    assert isinstance(caught.value, RetryableError)
    assert caught.value.retry_after > 0
    assert elapsed < 10, "the client must not hang on a dead broker"
