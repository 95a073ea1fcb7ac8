"""The MySQL/MariaDB record store: schema, engine discipline and bounded statements."""

from dataservice.store.engine import create_store_engine, ensure_database
from dataservice.store.idempotency import Idempotency, IdempotencyConflict
from dataservice.store.records import (
    Budget,
    DeleteRaced,
    RecordStore,
    RevisionMismatch,
    StoredRecord,
    WriteOutcome,
)

__all__ = [
    "Budget",
    "DeleteRaced",
    "Idempotency",
    "IdempotencyConflict",
    "RecordStore",
    "RevisionMismatch",
    "StoredRecord",
    "WriteOutcome",
    "create_store_engine",
    "ensure_database",
]
