"""Group commit against the real database: many keyed writes and deletes in
one transaction, each with the outcome the single-operation path would give,
applied once however often the group is sent, and never a deadlock between
groups writing side by side."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.store import Idempotency, RecordStore, create_store_engine
from dataservice.store.group import Mutation
from dataservice.store.idempotency import Outcome

WRITERS = 3


@pytest.fixture(scope="module")
def store(settings: Settings, config: Config, database: Engine) -> Iterator[RecordStore]:
    engine = create_store_engine(settings.database_url, WRITERS, config.database)
    yield RecordStore(engine, max_statement_ms=config.database.max_statement_ms)
    engine.dispose()


@pytest.fixture
def caller() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


def keyed(caller: str, key: str, request: bytes) -> Idempotency:
    return Idempotency(caller, key, hashlib.sha256(request).digest())


def write(caller: str, scope: str, object_id: str, payload: bytes, expected: int = 0) -> Mutation:
    key = keyed(caller, f"w-{object_id}-{expected}-{payload!r}", b"w" + payload + bytes([expected]))
    return Mutation(scope, object_id, payload, expected, key)


def delete(caller: str, scope: str, object_id: str, expected: int = 0) -> Mutation:
    return Mutation(scope, object_id, None, expected, keyed(caller, f"d-{object_id}", b"d"))


def revisions(engine: Engine, scope: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT object_id, revision FROM records WHERE scope = :s"), {"s": scope}
        )
        return {row[0]: int(row[1]) for row in rows}


def test_a_group_gives_each_operation_the_single_path_outcome(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.apply_group(
        [write(caller, scope, "a", b"1"), write(caller, scope, "b", b"1")]
    )  # a and b at revision 1
    outcomes = store.apply_group(
        [
            write(caller, scope, "z-new", b"x"),  # created
            write(caller, scope, "a", b"2"),  # replaced: 2
            write(caller, scope, "b", b"2", expected=5),  # stale: b is at 1
            delete(caller, scope, "missing"),  # not found
            delete(caller, scope, "c-absent", expected=3),  # conditional, absent
        ]
    )
    assert [(o.outcome, o.revision, o.created) for o in outcomes if o] == [
        (Outcome.OK, 1, True),
        (Outcome.OK, 2, False),
        (Outcome.REVISION_MISMATCH, 1, False),
        (Outcome.NOT_FOUND, None, False),
        (Outcome.REVISION_MISMATCH, None, False),
    ]
    assert revisions(database, scope) == {"a": 2, "b": 1, "z-new": 1}


def test_the_same_group_sent_again_changes_nothing_and_answers_the_same(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    group = [write(caller, scope, f"r{n}", b"p") for n in range(50)] + [
        delete(caller, scope, "never")
    ]
    first = store.apply_group(group)
    again = store.apply_group(group)
    assert [(o.outcome, o.revision) for o in first if o] == [
        (o.outcome, o.revision) for o in again if o
    ]
    assert all(o is not None and o.replayed for o in again)
    assert set(revisions(database, scope).values()) == {1}


def test_a_key_reused_for_another_request_fails_that_operation_alone(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    first = write(caller, scope, "k", b"one")
    store.apply_group([first])
    other = keyed(caller, first.idempotency.key, b"another request")
    reused = Mutation(scope, "k2", b"two", 0, other)
    outcomes = store.apply_group([reused, write(caller, scope, "k3", b"three")])
    assert outcomes[0] is None
    assert outcomes[1] is not None
    assert outcomes[1].outcome is Outcome.OK
    assert revisions(database, scope) == {"k": 1, "k3": 1}


def test_groups_writing_side_by_side_never_deadlock_and_lose_nothing(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    # Interleaved new ids and one shared record: gaps and rows contended at once.
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for round_ in range(20):
                ids = [f"id-{k:04d}" for k in range(n, 300, WRITERS)][round_ * 5 : round_ * 5 + 5]
                group = [write(f"{caller}-{n}", scope, i, b"v") for i in ids]
                group.append(write(f"{caller}-{n}", scope, "shared", f"{n}-{round_}".encode()))
                store.apply_group(group)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    found = revisions(database, scope)
    assert found.pop("shared") == WRITERS * 20
    assert len(found) == 300
    assert set(found.values()) == {1}
