"""Alembic environment: runs migrations over the app's async engine.

The database URL comes from `config.attributes["database_url"]` (set by
`server.migrate`) so no URL is ever written into a config file.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.engine import make_url
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
    if make_url(url).get_backend_name() == "sqlite":
        await _run_sqlite(url)
        return
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


async def _run_sqlite(url: str) -> None:
    """Migrate holding SQLite's write lock from before alembic reads the version
    table: two servers starting on a fresh file would otherwise both see an empty
    schema and both create it. SQLite's DDL is transactional, so the upgrade is
    all or nothing."""
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    apply_sqlite_settings(engine)
    try:
        async with engine.connect() as connection:
            await connection.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                # Alembic sees a transaction already open and leaves it to us.
                await connection.run_sync(_run)
            except BaseException:
                await connection.exec_driver_sql("ROLLBACK")
                raise
            await connection.exec_driver_sql("COMMIT")
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
