"""Alembic environment: runs the migrations against the configured database."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from dataservice.store.schema import metadata

url = context.config.get_main_option("sqlalchemy.url")
if url is None:
    raise RuntimeError("sqlalchemy.url must be set by dataservice.migrate")

engine = create_engine(url, poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
