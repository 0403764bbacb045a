"""Alembic environment.

The database URL comes from `config.attributes["database_url"]` (set by
`server.migrate`), so no URL is ever written into a config file. Migrations run
on the synchronous driver of the same database, outside any event loop.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

from leasehold._server.jobs.sql.engines import flavour_of, parse_database_url
from leasehold._server.jobs.sql.sqlite import apply_sqlite_settings
from leasehold._server.jobs.sql.tables import metadata
from leasehold._server.migrate import POSTGRES_MIGRATION_LOCK

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


def _run_sqlite(url: str) -> None:
    """Migrate holding SQLite's write lock from before alembic reads the version
    table: two servers starting on a fresh file would otherwise both see an empty
    schema and both create it. SQLite's DDL is transactional, so the upgrade is
    all or nothing."""
    engine = create_engine(make_url(url).set(drivername="sqlite"), isolation_level="AUTOCOMMIT")
    apply_sqlite_settings(engine)
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                # Alembic sees a transaction already open and leaves it to us.
                _run(connection)
            except BaseException:
                connection.exec_driver_sql("ROLLBACK")
                raise
            connection.exec_driver_sql("COMMIT")
    finally:
        engine.dispose()


def _run_postgresql(url: URL) -> None:
    """Migrate inside one transaction that first takes an advisory lock: replicas
    starting together on a fresh database take turns, and each one after the
    first finds the schema at head. PostgreSQL's DDL is transactional, so the
    upgrade is all or nothing."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection, connection.begin():
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(%s)", (POSTGRES_MIGRATION_LOCK,))
            # Alembic sees a transaction already open and leaves it to us.
            _run(connection)
    finally:
        engine.dispose()


def main() -> None:
    if context.is_offline_mode():
        raise RuntimeError("offline (SQL script) migrations are not supported")
    url = config.attributes.get("database_url")
    if not url:
        raise RuntimeError("no database URL given to alembic")
    parsed = parse_database_url(url)
    if flavour_of(parsed) == "postgresql":
        _run_postgresql(parsed)
    else:
        _run_sqlite(url)


main()
