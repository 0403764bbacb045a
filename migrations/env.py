"""Alembic environment: runs migrations over the app's async engine.

The database URL comes from `config.attributes["database_url"]` (set by
`server.migrate`) so no URL is ever written into a config file.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from server.jobs.sql.engines import apply_sqlite_settings
from server.jobs.sql.tables import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_online(url: str) -> None:
    engine = create_async_engine(url)
    if engine.dialect.name == "sqlite":
        apply_sqlite_settings(engine)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


def main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL given to alembic")
    asyncio.run(_run_online(url))


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported")
main()
