"""The MySQL/MariaDB record store: schema, engine discipline and bounded statements."""

from dataservice.store.engine import create_store_engine, ensure_database
from dataservice.store.records import RecordStore, StoredRecord

__all__ = ["RecordStore", "StoredRecord", "create_store_engine", "ensure_database"]
