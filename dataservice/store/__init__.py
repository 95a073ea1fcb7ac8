"""The MySQL/MariaDB record store: schema, engine discipline and bounded statements."""

from dataservice.store.engine import create_store_engine, ensure_database
from dataservice.store.group import GroupRaced, Mutation
from dataservice.store.idempotency import Idempotency, IdempotencyConflict
from dataservice.store.records import (
    DeleteRaced,
    RecordStore,
    RevisionMismatch,
    WriteOutcome,
)
from dataservice.store.sessions import Bounds

__all__ = [
    "Bounds",
    "DeleteRaced",
    "GroupRaced",
    "Idempotency",
    "IdempotencyConflict",
    "Mutation",
    "RecordStore",
    "RevisionMismatch",
    "WriteOutcome",
    "create_store_engine",
    "ensure_database",
]
