"""Acceptance: round trips through a real broker, real worker processes and
MariaDB, with each client (the sync one, then the asyncio one), on each
broker (Redis, then RabbitMQ)."""

from __future__ import annotations

import time

import pytest
import redis
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine

from dataservice import (
    DeleteOp,
    DeleteResult,
    ListOp,
    NotFound,
    Page,
    ReadMode,
    ReadOp,
    Record,
    WriteOp,
    WriteResult,
)
from dataservice.client.inbox import SLICE_S
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.supervisor import Supervisor
from dataservice.redis.keys import reply_key, result_key
from tests.harness.clients import AnyClient
from tests.harness.rabbit import BROKERS, processes_on
from tests.harness.support import row_count

pytestmark = pytest.mark.usefixtures("worker_processes")


@pytest.fixture(scope="module", params=BROKERS)
def process_settings(
    request: pytest.FixtureRequest, settings: Settings, config: Config
) -> Settings:
    """The worker processes' settings (``worker_processes``), on each broker."""
    return processes_on(request.param, settings, config)


@pytest.mark.slow
def test_interactive_write_read_list_delete_round_trip(
    any_process_client: AnyClient, scope: str, database: Engine
) -> None:
    first = any_process_client.write(scope, "alpha", b"\x00one\xff")
    assert first == WriteResult("alpha", revision=1, created=True)
    second = any_process_client.write(scope, "alpha", b"two")
    assert second == WriteResult("alpha", revision=2, created=False)

    record = any_process_client.read(scope, "alpha", mode=ReadMode.PRIMARY)
    assert (record.object_id, record.revision, record.payload) == ("alpha", 2, b"two")
    assert any_process_client.read(scope, "alpha").revision == 2

    page = any_process_client.list(scope)
    assert [(r.object_id, r.revision, r.payload) for r in page.records] == [("alpha", 2, b"two")]
    assert page.next_cursor is None

    assert any_process_client.delete(scope, "alpha") == DeleteResult("alpha", revision=2)
    with pytest.raises(NotFound):
        any_process_client.read(scope, "alpha")
    with pytest.raises(NotFound):
        any_process_client.delete(scope, "alpha")
    assert row_count(database, scope) == 0


def test_list_pages_through_a_scope_in_id_order(any_process_client: AnyClient, scope: str) -> None:
    ids = [f"item-{n:03d}" for n in range(25)]
    for object_id in reversed(ids):
        any_process_client.write(scope, object_id, object_id.encode())
    seen: list[str] = []
    cursor = None
    while True:
        page = any_process_client.list(scope, page_size=10, cursor=cursor)
        assert len(page.records) <= 10
        seen += [r.object_id for r in page.records]
        assert all(r.payload == r.object_id.encode() for r in page.records)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ids


def test_batch_submissions_are_answered_through_handles(
    any_process_client: AnyClient, scope: str, worker_processes: Supervisor
) -> None:
    writes = any_process_client.submit_many(
        [WriteOp(scope, f"b{n}", bytes([n]) * 100) for n in range(20)], timeout=60
    )
    results = [h.result() for h in writes]
    assert all(isinstance(r, WriteResult) and r.revision == 1 for r in results)

    read = any_process_client.submit(ReadOp(scope, "b7"), timeout=60).result()
    assert isinstance(read, Record)
    assert read.payload == bytes([7]) * 100
    listed = any_process_client.submit(ListOp(scope, page_size=5), timeout=60).result()
    assert isinstance(listed, Page)
    assert len(listed.records) == 5
    deleted = any_process_client.submit(DeleteOp(scope, "b7"), timeout=60).result()
    assert deleted == DeleteResult("b7", 1)
    snapshot = worker_processes.snapshot()
    assert all(stats.workers == 1 for stats in snapshot.lanes.values())


@pytest.mark.slow
def test_an_uncollected_answer_is_let_go_at_deadline_plus_grace(
    any_process_client: AnyClient, process_settings: Settings, config: Config, scope: str
) -> None:
    handle = any_process_client.submit(WriteOp(scope, "ignored", b"x"), timeout=1)
    eventually(handle.done, timeout=1.0)
    assert handle.done()
    # The reader took it off the channel into the handle's slot; nothing of
    # it stays in Redis.
    replies = any_process_client._transport.replies
    results = redis.Redis.from_url(process_settings.result_backend_url)
    keys = [result_key(handle.caller, handle.request_id), reply_key(handle.caller, replies.channel)]
    assert replies.expecting(handle.request_id)
    assert not results.exists(*keys)
    expires_at_ms = handle.deadline_ms + config.results.grace_ms
    # The reader lets it go on its first slice past the deadline and the grace.
    eventually(lambda: not replies.expecting(handle.request_id),
               timeout=max(0.0, expires_at_ms / 1000 - time.time()) + SLICE_S + 5,
               message="the reader to let the uncollected answer go")  # fmt: skip
    assert not replies.expecting(handle.request_id)
    assert not results.exists(*keys)
