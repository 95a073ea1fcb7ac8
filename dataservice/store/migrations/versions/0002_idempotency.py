"""Create the idempotency_keys table.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import BINARY, DATETIME, TINYINT

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("caller", sa.String(64, collation="ascii_bin"), primary_key=True),
        sa.Column("idem_key", sa.String(128, collation="ascii_bin"), primary_key=True),
        sa.Column("fingerprint", BINARY(32), nullable=False),
        sa.Column("outcome", TINYINT, nullable=False),
        sa.Column("revision", sa.BigInteger, nullable=True),
        sa.Column("created", sa.Boolean, nullable=False),
        sa.Column("expires_at", DATETIME(fsp=6), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"])


def downgrade() -> None:
    op.drop_table("idempotency_keys")
