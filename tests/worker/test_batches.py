"""Acceptance: many operations per message, one outcome each.

A real batch worker (``dataservice worker --lane batch``) on a Redis database
of its own. ``submit_many`` packs writes and deletes into batch messages; the
worker commits them a transaction per permit. One operation's failure fails
that operation alone; the same batch sent again under the same keys changes
nothing and answers the same; and a worker SIGKILLed again and again while
it commits loses no acknowledged write and applies none twice.
"""

from __future__ import annotations

import random
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from dataservice_tools.localservices import redis_reachable
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Engine, text

from dataservice import Client, Conflict, DataServiceError, InvalidArgument
from dataservice.broker.celery import celery_app
from dataservice.client.handle import AsyncHandle, Carrier, Handle
from dataservice.codec import batch_envelope
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.ops.processes import WorkerProcess, stop_all, wait_answering
from dataservice.proto import pb
from dataservice.redis.keys import admission_key
from dataservice.security.auth import sign
from dataservice.types import WriteOp, WriteResult
from tests.conftest import require
from tests.harness.clients import (
    AnyClient,
    AnyHandle,
    ClientKind,
    DrivenAsyncClient,
    DrivenHandle,
    make_client,
)
from tests.harness.support import caller_key, now_ms, on_redis, with_changes

OWN_REDIS_URL = "redis://127.0.0.1:6379/9"
CALLER = "loadtest"
BATCH = 500
KILLED_WRITES = 5000
# A message lost with a killed worker costs its writes this long before resent.
KILLED_TIMEOUT_S = 15
# A killed worker's messages come back to the other one this soon.
SHORT_VISIBILITY: dict[tuple[str, ...], object] = {
    ("broker", "visibility_timeout_s"): 2,
    ("broker", "restore_every_s"): 1,
}


@pytest.fixture
def own(settings: Settings, database: Engine, tmp_path: Path) -> Iterator[Settings]:
    require(redis_reachable(OWN_REDIS_URL), "Redis at 127.0.0.1:6379")
    client = redis.Redis.from_url(OWN_REDIS_URL)
    client.flushdb()
    yield with_changes(on_redis(settings, OWN_REDIS_URL), tmp_path / "q.yml", SHORT_VISIBILITY)
    client.flushdb()
    client.close()


def start(own: Settings, config: Config, log: Path, count: int = 1) -> list[WorkerProcess]:
    workers = [
        WorkerProcess.for_lane(own, LaneName.BATCH, log.with_suffix(f".{n}.log")).start()
        for n in range(count)
    ]
    control = celery_app("batch-test", own, config)
    try:
        wait_answering(control, workers)
    finally:
        control.close()
    return workers


def done(config: Config) -> int:
    """Operations the batch lane has completed (admission's count)."""
    stats = redis.Redis.from_url(OWN_REDIS_URL)
    try:
        return int(stats.hget(admission_key(config.lanes.batch.queue), "done") or 0)
    finally:
        stats.close()


def rows(engine: Engine, scope: str) -> dict[str, tuple[int, bytes]]:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT object_id, revision, payload FROM records WHERE scope = :s"), {"s": scope}
        )
        return {row[0]: (int(row[1]), bytes(row[2])) for row in found}


def _op(
    scope: str, object_id: str, payload: bytes, key: str, expected: int = 0
) -> pb.BatchOperation:
    """A write as the client would put it in a batch, unchecked (so that a
    test can send what a well-behaved client never would)."""
    return pb.BatchOperation(
        request_id=uuid.uuid4().hex,
        deadline_unix_ms=now_ms() + 60_000,
        idempotency_key=key,
        write=pb.WriteRecordRequest(
            scope=scope, object_id=object_id, payload=payload, expected_revision=expected
        ),
    )


def send(client: AnyClient, own: Settings, ops: list[pb.BatchOperation]) -> list[AnyHandle]:
    """``ops`` in batch messages as full as the lane takes them, as ``submit_many``
    packs them, but unchecked; a handle per operation, of the client's kind."""
    transport = client._transport
    most = client.config.lanes.batch.max_ops_per_message
    items = []
    carriers = []
    for start in range(0, len(ops), most):
        carried = ops[start : start + most]
        envelope = batch_envelope(CALLER, uuid.uuid4().hex, now_ms(), carried)
        envelope.reply_channel = transport.replies.channel
        body = sign(envelope.SerializeToString(), caller_key(own, CALLER))
        items.append((body, envelope.request_id, envelope.deadline_unix_ms, "batch", len(carried)))
        # The message's answer carries each of its operations' (a BatchResponse).
        carrier = Carrier(envelope.request_id, envelope.deadline_unix_ms)
        carriers += [carrier] * len(carried)
    made = zip(ops, carriers, strict=True)
    if isinstance(client, DrivenAsyncClient):
        epoch = client.run(transport.publish_many(items, lane=LaneName.BATCH, caller=CALLER))
        return [
            DrivenHandle(
                client,
                AsyncHandle(
                    transport, CALLER, o.request_id, o.deadline_unix_ms, epoch, o.idempotency_key, c
                ),
            )
            for o, c in made
        ]
    epoch = transport.publish_many(items, lane=LaneName.BATCH, caller=CALLER)
    return [
        Handle(transport, CALLER, o.request_id, o.deadline_unix_ms, epoch, o.idempotency_key, c)
        for o, c in made
    ]


def outcomes(handles: list[AnyHandle]) -> list[object]:
    answers: list[object] = []
    for handle in handles:
        try:
            answers.append(handle.result())
        except DataServiceError as exc:
            answers.append(exc)
    return answers


@pytest.mark.slow
def test_one_failing_operation_fails_alone_and_a_resend_changes_nothing(
    client_kind: ClientKind,
    own: Settings,
    config: Config,
    database: Engine,
    scope: str,
    tmp_path: Path,
) -> None:
    workers = start(own, config, tmp_path / "worker")
    try:
        with make_client(client_kind, CALLER, own, config) as client:
            # Three records at revision 1, and a key already used for another write.
            seeded = client.submit_many(
                [WriteOp(scope, f"stale-{n}", b"v1") for n in range(3)]
                + [WriteOp(scope, "first", b"first", idempotency_key=f"{scope}-reused")]
            )
            assert all(isinstance(h.result(), WriteResult) for h in seeded)
            too_big = b"x" * (config.limits.max_payload_bytes + 1)
            ops = [_op(scope, f"rec-{n:03d}", b"p%d" % n, f"{scope}-k-{n}") for n in range(494)]
            ops += [
                _op(scope, f"stale-{n}", b"v2", f"{scope}-stale-{n}", expected=7) for n in range(3)
            ]
            ops += [_op(scope, f"big-{n}", too_big, f"{scope}-big-{n}") for n in range(2)]
            ops += [_op(scope, "other", b"another request", f"{scope}-reused")]
            random.Random(7).shuffle(ops)
            assert len(ops) == BATCH
            first = outcomes(send(client, own, ops))
            failed = {
                op.write.object_id: type(answer)
                for op, answer in zip(ops, first, strict=True)
                if not isinstance(answer, WriteResult)
            }
            assert failed == {
                "stale-0": Conflict,
                "stale-1": Conflict,
                "stale-2": Conflict,
                "big-0": InvalidArgument,
                "big-1": InvalidArgument,
                "other": Conflict,
            }
            before = rows(database, scope)
            assert len(before) == 494 + 3 + 1
            assert all(before[f"rec-{n:03d}"] == (1, b"p%d" % n) for n in range(494))
            assert all(before[f"stale-{n}"] == (1, b"v1") for n in range(3))
            # The same batch again, as a caller that timed out would send it.
            again = [
                _op(
                    scope,
                    op.write.object_id,
                    op.write.payload,
                    op.idempotency_key,
                    op.write.expected_revision,
                )
                for op in ops
            ]
            second = outcomes(send(client, own, again))
            assert rows(database, scope) == before
            assert [(type(a), getattr(a, "revision", None)) for a in first] == [
                (type(a), getattr(a, "revision", None)) for a in second
            ]
    finally:
        stop_all(workers)


def test_a_batch_refused_by_admission_is_counted_in_operations(
    own: Settings, config: Config, database: Engine, scope: str
) -> None:
    lane = config.lanes.batch
    count = 2 * lane.max_ops_per_message + 50
    with Client(CALLER, own, config) as client:
        handles = client.submit_many([WriteOp(scope, f"q-{n}", b"v") for n in range(count)])
    stats = redis.Redis.from_url(OWN_REDIS_URL)
    # In three messages (two full, one of 50), nobody consuming them yet.
    assert stats.llen(lane.queue) == 3
    assert int(stats.hget(admission_key(lane.queue), "admitted") or 0) == count
    assert len(handles) == count


@pytest.mark.fault
def test_a_worker_killed_again_and_again_loses_no_acknowledged_write_and_applies_none_twice(
    own: Settings, config: Config, database: Engine, scope: str, tmp_path: Path
) -> None:
    """Two workers; three times, once a random share of the writes is done,
    one is SIGKILLed and started again. A message a killed worker held comes
    back to the other after the visibility timeout. One it had only just
    taken off the queue (kombu's own window, before its delivery is recorded)
    is lost with it: its writes get no answer, and are sent again under their
    keys, as a batch job would."""
    chance = random.Random()
    workers = start(own, config, tmp_path / "a", count=2)
    ops = [
        WriteOp(scope, f"w-{n:05d}", b"%d" % n, idempotency_key=f"{scope}-{n}")
        for n in range(KILLED_WRITES)
    ]
    answers: list[object] = []
    try:
        with Client(CALLER, own, config) as client:
            handles = client.submit_many(ops, timeout=KILLED_TIMEOUT_S)
            pending_at_kills = []
            for round_, share in enumerate(sorted(chance.uniform(0.05, 0.8) for _ in range(3))):
                eventually(lambda share=share: done(config) >= share * KILLED_WRITES,
                           timeout=KILLED_TIMEOUT_S, interval=0.005)  # fmt: skip
                victim = workers[round_ % 2]
                pending_at_kills.append(KILLED_WRITES - done(config))
                victim.send_signal(signal.SIGKILL)
                victim.wait(10)
                workers[round_ % 2] = start(own, config, tmp_path / f"r{round_}")[0]
            answers = client.results(handles)
            for _ in range(3):
                unanswered = [i for i, a in enumerate(answers) if not isinstance(a, WriteResult)]
                if not unanswered:
                    break
                again = client.results(
                    client.submit_many([ops[i] for i in unanswered], timeout=KILLED_TIMEOUT_S)
                )
                for i, answer in zip(unanswered, again, strict=True):
                    answers[i] = answer
    finally:
        stop_all(workers)
    # The first kill, at least, came while writes were still being committed.
    assert pending_at_kills[0] > 0
    assert all(isinstance(a, WriteResult) for a in answers), {type(a).__name__ for a in answers}
    # Each applied once: created at revision 1, never written again by a
    # redelivery or a resend (those are answered from the key's record).
    assert all(a.revision == 1 for a in answers if isinstance(a, WriteResult))
    assert rows(database, scope) == {op.object_id: (1, op.payload) for op in ops}
