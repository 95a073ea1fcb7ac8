"""Keyed and conditional mutations, against the real database: a key's change
and the record of its outcome commit together or not at all, and a retry gets
the original answer however the record has moved since."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from dataservice_tools.testkit.waits import eventually
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.store import (
    Bounds,
    Idempotency,
    IdempotencyConflict,
    RecordStore,
    RevisionMismatch,
    WriteOutcome,
    create_store_engine,
)
from dataservice.store.connections import StatementTimeout, now_ms
from tests.conftest import SERVICE_USER

RACERS = 20


@pytest.fixture(scope="module")
def store_engine(settings: Settings, config: Config, database: Engine) -> Iterator[Engine]:
    # A burst as large as the pool: the racing test opens every connection at once.
    db_config = config.database.model_copy(update={"connect_burst": RACERS})
    engine = create_store_engine(settings.database_url, RACERS, db_config)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module", params=["returning", "select-for-update"])
def store(request: pytest.FixtureRequest, store_engine: Engine, config: Config) -> RecordStore:
    """The store, once with DELETE ... RETURNING (MariaDB) and once without (MySQL)."""
    with store_engine.connect():
        pass  # the dialect learns what the server supports on its first connection
    store_engine.dialect.delete_returning = request.param == "returning"
    return RecordStore(store_engine, max_statement_ms=config.database.max_statement_ms)


@pytest.fixture
def caller() -> str:
    """A caller of the test's own, so tests never see each other's keys."""
    return f"c-{uuid.uuid4().hex[:12]}"


def keyed(caller: str, key: str = "k1", request: bytes = b"request") -> Idempotency:
    return Idempotency(caller, key, hashlib.sha256(request).digest())


def revision_of(database: Engine, scope: str, object_id: str) -> int | None:
    with database.connect() as conn:
        value = conn.execute(
            text("SELECT revision FROM records WHERE scope = :s AND object_id = :o"),
            {"s": scope, "o": object_id},
        ).scalar()
    return None if value is None else int(value)


def records_of(database: Engine, scope: str) -> list[Any]:
    """Every row of ``scope``, every column: equal before and after means no change.
    (Not the whole table's checksum: other test runs may share the database.)"""
    with database.connect() as conn:
        return list(
            conn.execute(
                text("SELECT * FROM records WHERE scope = :s ORDER BY object_id"), {"s": scope}
            )
        )


def key_rows(database: Engine, caller: str) -> list[Any]:
    with database.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT idem_key, outcome, revision, created FROM idempotency_keys"
                    " WHERE caller = :c ORDER BY idem_key"
                ),
                {"c": caller},
            )
        )


def test_a_retried_write_returns_the_original_outcome_and_applies_once(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    first = store.write(scope, "a", b"one", idempotency=keyed(caller))
    again = store.write(scope, "a", b"one", idempotency=keyed(caller))

    assert first == WriteOutcome(revision=1, created=True)
    assert again == WriteOutcome(revision=1, created=True, replayed=True)
    assert revision_of(database, scope, "a") == 1
    # Even once the record has moved on, the retry is answered as the original was.
    store.write(scope, "a", b"two")
    assert store.write(scope, "a", b"one", idempotency=keyed(caller)) == again
    stored = store.read(scope, "a")
    assert stored is not None
    assert (stored.revision, stored.payload) == (2, b"two")


def test_a_retried_delete_returns_the_deleted_revision_and_deletes_nothing_more(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.write(scope, "a", b"x")
    store.write(scope, "a", b"x")
    assert store.delete(scope, "a", idempotency=keyed(caller)) == 2
    store.write(scope, "a", b"back")

    assert store.delete(scope, "a", idempotency=keyed(caller)) == 2
    assert revision_of(database, scope, "a") == 1


def test_a_delete_that_found_nothing_is_recorded_and_replayed(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    assert store.delete(scope, "a", idempotency=keyed(caller)) is None
    store.write(scope, "a", b"created later")

    assert store.delete(scope, "a", idempotency=keyed(caller)) is None
    assert revision_of(database, scope, "a") == 1
    assert [(r.outcome, r.revision) for r in key_rows(database, caller)] == [(2, None)]


def test_a_key_reused_for_another_request_is_a_conflict_and_changes_nothing(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.write(scope, "a", b"one", idempotency=keyed(caller, request=b"write a one"))
    records_before = records_of(database, scope)
    keys_before = key_rows(database, caller)

    with pytest.raises(IdempotencyConflict):
        store.write(scope, "a", b"two", idempotency=keyed(caller, request=b"write a two"))
    with pytest.raises(IdempotencyConflict):
        store.write(scope, "b", b"one", idempotency=keyed(caller, request=b"write b one"))
    with pytest.raises(IdempotencyConflict):
        store.delete(scope, "a", idempotency=keyed(caller, request=b"delete a"))

    assert records_of(database, scope) == records_before
    assert key_rows(database, caller) == keys_before


def test_keys_are_per_caller(store: RecordStore, scope: str, caller: str) -> None:
    store.write(scope, "a", b"x", idempotency=keyed(caller))
    other = store.write(scope, "a", b"x", idempotency=keyed(caller + "-other"))
    assert other == WriteOutcome(revision=2, created=False)


def test_conditional_changes_apply_only_at_the_expected_revision(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.write(scope, "a", b"one")
    assert store.write(scope, "a", b"two", expected_revision=1) == WriteOutcome(2, False)
    assert store.write(
        scope, "a", b"three", idempotency=keyed(caller, "w"), expected_revision=2
    ) == WriteOutcome(3, False)
    assert store.delete(scope, "a", expected_revision=3) == 3
    store.write(scope, "b", b"one")
    assert store.delete(scope, "b", idempotency=keyed(caller, "d"), expected_revision=1) == 1
    assert revision_of(database, scope, "a") is None
    assert revision_of(database, scope, "b") is None


@pytest.mark.parametrize("keyed_request", [False, True])
def test_a_revision_mismatch_changes_nothing(
    store: RecordStore, database: Engine, scope: str, caller: str, keyed_request: bool
) -> None:
    store.write(scope, "a", b"one")
    store.write(scope, "a", b"two")
    before = records_of(database, scope)

    def idem(key: str) -> Idempotency | None:
        return keyed(caller, key) if keyed_request else None

    with pytest.raises(RevisionMismatch) as stale_write:
        store.write(scope, "a", b"x", idempotency=idem("w"), expected_revision=1)
    with pytest.raises(RevisionMismatch) as stale_delete:
        store.delete(scope, "a", idempotency=idem("d"), expected_revision=1)
    with pytest.raises(RevisionMismatch) as absent_write:
        store.write(scope, "none", b"x", idempotency=idem("wn"), expected_revision=1)
    with pytest.raises(RevisionMismatch) as absent_delete:
        store.delete(scope, "none", idempotency=idem("dn"), expected_revision=1)

    assert (stale_write.value.current, stale_delete.value.current) == (2, 2)
    assert (absent_write.value.current, absent_delete.value.current) == (None, None)
    assert records_of(database, scope) == before


def test_a_retried_mismatch_stays_a_mismatch_after_the_record_reaches_the_revision(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.write(scope, "a", b"one")
    store.write(scope, "a", b"two")
    for attempt in range(2):
        with pytest.raises(RevisionMismatch) as write_mismatch:
            store.write(scope, "a", b"x", idempotency=keyed(caller, "w"), expected_revision=3)
        with pytest.raises(RevisionMismatch) as delete_mismatch:
            store.delete(scope, "a", idempotency=keyed(caller, "d"), expected_revision=3)
        assert (write_mismatch.value.current, delete_mismatch.value.current) == (2, 2)
        if attempt == 0:
            store.write(scope, "a", b"three")

    stored = store.read(scope, "a")
    assert stored is not None
    assert (stored.revision, stored.payload) == (3, b"three")


def test_racing_requests_with_one_key_apply_exactly_once(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.write(scope, "a", b"start")
    start = threading.Barrier(RACERS)
    outcomes: list[WriteOutcome] = []
    errors: list[BaseException] = []

    def race() -> None:
        try:
            start.wait()
            outcome = store.write(scope, "a", b"raced", idempotency=keyed(caller))
            outcomes.append(outcome)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=race) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert not errors
    assert revision_of(database, scope, "a") == 2
    assert {(o.revision, o.created) for o in outcomes} == {(2, False)}
    assert sorted(o.replayed for o in outcomes) == [False] + [True] * (RACERS - 1)


def test_racing_deletes_with_one_key_delete_once(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.write(scope, "a", b"x")
    start = threading.Barrier(RACERS)
    results: list[int | None] = []

    def race() -> None:
        start.wait()
        results.append(store.delete(scope, "a", idempotency=keyed(caller)))

    threads = [threading.Thread(target=race) for _ in range(RACERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [1] * RACERS
    assert revision_of(database, scope, "a") is None


class KeyHeld:
    """Another session's uncommitted row for a key: a keyed request for it waits
    after having made its change, in the middle of its transaction."""

    def __init__(self, database: Engine, caller: str, key: str) -> None:
        self.conn: Connection = database.connect()
        self.conn.execute(text("START TRANSACTION"))
        self.conn.execute(
            text(
                "INSERT INTO idempotency_keys VALUES"
                " (:c, :k, :f, 1, 1, 1, UTC_TIMESTAMP(6) + INTERVAL 1 DAY)"
            ),
            {"c": caller, "k": key, "f": bytes(32)},
        )

    def release(self) -> None:
        self.conn.execute(text("ROLLBACK"))
        self.conn.close()


def waiting_insert(database: Engine, caller: str) -> int:
    """The id of the connection whose INSERT of ``caller``'s key is waiting."""
    query = text(
        "SELECT ID FROM information_schema.PROCESSLIST"
        " WHERE USER = :u AND INFO LIKE :insert AND INFO LIKE :caller"
    )
    params = {
        "u": SERVICE_USER,
        "insert": "%INSERT INTO idempotency_keys%",
        "caller": f"%{caller}%",
    }

    def waiting() -> int | None:
        with database.connect() as conn:
            found = conn.execute(query, params).scalar()
        return None if found is None else int(found)  # a connection id is never 0

    return eventually(waiting, timeout=5, message="the keyed request to wait for the key")


@pytest.mark.parametrize("operation", ["write", "delete"])
def test_a_statement_timeout_mid_transaction_leaves_neither_change_nor_key(
    store: RecordStore, database: Engine, scope: str, caller: str, operation: str
) -> None:
    store.write(scope, "a", b"before")
    before = records_of(database, scope)

    def change() -> object:
        budget = Bounds(deadline_ms=now_ms() + 300)
        if operation == "write":
            return store.write(scope, "a", b"after", budget, idempotency=keyed(caller))
        return store.delete(scope, "a", budget, idempotency=keyed(caller))

    held = KeyHeld(database, caller, "k1")
    try:
        with pytest.raises(StatementTimeout):
            change()
    finally:
        held.release()

    assert records_of(database, scope) == before
    assert key_rows(database, caller) == []
    # Nothing was recorded, so the retry is a first attempt, and applies.
    assert store.delete(scope, "a", idempotency=keyed(caller)) == 1


@pytest.mark.fault
def test_a_killed_connection_mid_transaction_leaves_neither_change_nor_key(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.write(scope, "a", b"before")
    before = records_of(database, scope)
    held = KeyHeld(database, caller, "k1")
    failures: list[BaseException] = []

    def write() -> None:
        budget = Bounds(deadline_ms=now_ms() + 2000)
        try:
            store.write(scope, "a", b"after", budget, idempotency=keyed(caller))
        except BaseException as exc:
            failures.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        victim = waiting_insert(database, caller)
        with database.connect() as conn:
            conn.execute(text(f"KILL CONNECTION {victim}"))
        writer.join()
    finally:
        held.release()

    assert len(failures) == 1
    assert isinstance(failures[0], DBAPIError)
    assert failures[0].connection_invalidated
    assert records_of(database, scope) == before
    assert key_rows(database, caller) == []


def test_unkeyed_changes_stay_single_statements_and_keyed_ones_a_short_transaction(
    settings: Settings, config: Config, scope: str, caller: str
) -> None:
    # One connection, whose own statement counter sees only this test's statements.
    engine = create_store_engine(settings.database_url, 1, config.database)
    store = RecordStore(engine, max_statement_ms=config.database.max_statement_ms)
    counter = text("SHOW SESSION STATUS LIKE 'Questions'")

    def statements(change: Callable[[], object]) -> int:
        with engine.connect() as conn:
            before = int(conn.execute(counter).one()[1])
        change()
        with engine.connect() as conn:
            # The second SHOW counts itself.
            return int(conn.execute(counter).one()[1]) - before - 1

    try:
        store.write(scope, "a", b"connect")
        assert statements(lambda: store.write(scope, "a", b"x")) == 1
        assert statements(lambda: store.write(scope, "a", b"x", expected_revision=2)) == 1
        # START TRANSACTION, the change, the key's INSERT, COMMIT.
        keyed_write = keyed(caller, "w")
        assert statements(lambda: store.write(scope, "a", b"x", idempotency=keyed_write)) == 4
        # A replay: the INSERT fails, the stored row is read, ROLLBACK.
        assert statements(lambda: store.write(scope, "a", b"x", idempotency=keyed_write)) == 5
        assert statements(lambda: store.delete(scope, "a", idempotency=keyed(caller, "d"))) == 4
    finally:
        engine.dispose()


def test_no_transaction_outlives_a_keyed_request(
    settings: Settings, config: Config, scope: str, caller: str
) -> None:
    # The pool skips its rollback on return, so every path must end the transaction.
    engine = create_store_engine(settings.database_url, 1, config.database)
    store = RecordStore(engine, max_statement_ms=config.database.max_statement_ms)
    requests: list[Callable[[], object]] = [
        lambda: store.write(scope, "a", b"x", idempotency=keyed(caller)),
        lambda: store.write(scope, "a", b"x", idempotency=keyed(caller)),
        lambda: store.write(scope, "a", b"y", idempotency=keyed(caller, request=b"other")),
        lambda: store.write(scope, "a", b"x", idempotency=keyed(caller, "m"), expected_revision=9),
        lambda: store.delete(scope, "none", idempotency=keyed(caller, "n")),
    ]
    try:
        for request in requests:
            with contextlib.suppress(IdempotencyConflict, RevisionMismatch):
                request()
            with engine.connect() as conn:
                assert conn.execute(text("SELECT @@in_transaction")).scalar() == 0
    finally:
        engine.dispose()


def test_purge_removes_only_expired_keys_and_at_most_limit(
    store: RecordStore, database: Engine, scope: str, caller: str
) -> None:
    store.write(scope, "a", b"x", idempotency=keyed(caller, "live"))
    with database.connect() as conn:
        conn.execute(
            text(
                "INSERT INTO idempotency_keys SELECT :c, CONCAT('old-', seq), :f, 1, 1, 0,"
                " UTC_TIMESTAMP(6) - INTERVAL seq SECOND FROM seq_1_to_7"
            ),
            {"c": caller, "f": bytes(32)},
        )

    # Whatever else has expired (left by other tests) goes too, in the same batches.
    purged = [store.purge_idempotency(3)]
    while purged[-1] == 3:
        purged.append(store.purge_idempotency(3))
    assert purged[0] == 3
    assert all(n <= 3 for n in purged)
    assert sum(purged) >= 7
    assert [r.idem_key for r in key_rows(database, caller)] == ["live"]
    with pytest.raises(ValueError, match="limit"):
        store.purge_idempotency(0)


def test_a_short_retention_expires_keys_for_the_purge(
    store_engine: Engine, config: Config, database: Engine, scope: str, caller: str
) -> None:
    brief = RecordStore(
        store_engine,
        max_statement_ms=config.database.max_statement_ms,
        idempotency_retention_s=0,
    )
    brief.write(scope, "a", b"x", idempotency=keyed(caller))
    time.sleep(0.01)
    while brief.purge_idempotency(100) == 100:
        pass
    assert key_rows(database, caller) == []
    # Purged: the key is free again, and the write applies anew.
    assert brief.write(scope, "a", b"x", idempotency=keyed(caller)).revision == 2


def test_idempotency_values_are_checked() -> None:
    with pytest.raises(ValueError, match="fingerprint"):
        Idempotency("c", "k", b"short")
    with pytest.raises(ValueError, match="key"):
        Idempotency("c", "", bytes(32))
    with pytest.raises(ValueError, match="caller"):
        Idempotency("c" * 65, "k", bytes(32))
