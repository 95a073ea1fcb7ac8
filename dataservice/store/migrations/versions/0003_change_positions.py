"""Create the change_positions table: where the change stream has got to.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "change_positions",
        sa.Column("stream", sa.String(64, collation="ascii_bin"), primary_key=True),
        sa.Column("log_file", sa.String(255), nullable=False),
        sa.Column("log_pos", sa.BigInteger, nullable=False),
        sa.Column("fencing_token", sa.BigInteger, nullable=False),
        sa.Column("updated_at", DATETIME(fsp=6), nullable=False),
        mysql_engine="InnoDB",
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("change_positions")
