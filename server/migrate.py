"""Apply the alembic migrations shipped inside the package."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config

# The key of the PostgreSQL advisory lock under which migrations run, so that
# replicas migrating one database at once take turns. Any constant will do, as
# long as nothing else on the database uses it.
POSTGRES_MIGRATION_LOCK = 0x1EA5E401D


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("leasehold._server.migrations")))
    config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Bring the schema to `revision`. Blocking: call it outside the event loop."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)
