"""The tables. Migrations under ``migrations/versions`` create them; this module
describes them for the statements in ``records.py`` and ``idempotency.py``."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, MetaData, String, Table
from sqlalchemy.dialects.mysql import BINARY, DATETIME, MEDIUMBLOB, TINYINT

metadata = MetaData()

records = Table(
    "records",
    metadata,
    # ASCII with a binary collation: ids compare byte for byte, which keeps list
    # order stable and makes the primary key compact (1 byte per character).
    Column("scope", String(64, collation="ascii_bin"), primary_key=True),
    Column("object_id", String(128, collation="ascii_bin"), primary_key=True),
    Column("revision", BigInteger, nullable=False),
    Column("payload", MEDIUMBLOB, nullable=False),
    Column("created_at", DATETIME(fsp=6), nullable=False),
    Column("updated_at", DATETIME(fsp=6), nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# The outcome of each keyed mutation, committed in the mutation's own
# transaction, so that a retry with the same key is answered from here.
idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("caller", String(64, collation="ascii_bin"), primary_key=True),
    Column("idem_key", String(128, collation="ascii_bin"), primary_key=True),
    # sha256 of the request: the same key with a different request is a conflict.
    Column("fingerprint", BINARY(32), nullable=False),
    Column("outcome", TINYINT, nullable=False),
    Column("revision", BigInteger, nullable=True),
    Column("created", Boolean, nullable=False),
    Column("expires_at", DATETIME(fsp=6), nullable=False),
    # Purging scans expired rows in this order and stops at its limit.
    Index("ix_idempotency_keys_expires_at", "expires_at"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)

# Where the change stream has got to in the binlog: saved only after the
# invalidations it covers, and only by the holder of the newest fencing token.
change_positions = Table(
    "change_positions",
    metadata,
    Column("stream", String(64, collation="ascii_bin"), primary_key=True),
    Column("log_file", String(255), nullable=False),
    Column("log_pos", BigInteger, nullable=False),
    Column("fencing_token", BigInteger, nullable=False),
    Column("updated_at", DATETIME(fsp=6), nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)
