"""Schema migrations (Alembic), run by ``dataservice db upgrade``."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig

from dataservice.config.model import DatabaseConfig
from dataservice.store.engine import ensure_database

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # '%' is ConfigParser's interpolation character; URL-encoded passwords carry it.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, config: DatabaseConfig, revision: str = "head") -> bool:
    """Create the database if missing, then migrate it. Returns True if it was created."""
    created = ensure_database(url, config)
    command.upgrade(alembic_config(url), revision)
    return created
