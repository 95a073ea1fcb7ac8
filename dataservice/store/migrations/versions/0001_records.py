"""Create the records table.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME, MEDIUMBLOB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "records",
        sa.Column("scope", sa.String(64, collation="ascii_bin"), primary_key=True),
        sa.Column("object_id", sa.String(128, collation="ascii_bin"), primary_key=True),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("payload", MEDIUMBLOB, nullable=False),
        sa.Column("created_at", DATETIME(fsp=6), nullable=False),
        sa.Column("updated_at", DATETIME(fsp=6), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("records")
