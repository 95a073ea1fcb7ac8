"""The tables. Migrations under ``migrations/versions`` create them; this module
describes them for the statements in ``records.py``."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, MetaData, String, Table
from sqlalchemy.dialects.mysql import DATETIME, MEDIUMBLOB

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
