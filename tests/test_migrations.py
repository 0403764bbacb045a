"""The alembic history yields exactly the declared schema on every engine, from
the same revisions, and round-trips."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.pool import NullPool

from leasehold._server import migrate
from leasehold._server.jobs.sql.engines import flavour_of, parse_database_url
from leasehold._server.jobs.sql.tables import metadata
from leasehold._server.migrate import POSTGRES_MIGRATION_LOCK
from tests.conftest import Postgres
from tests.support import ENGINES, sqlite_url
from tests.system.helpers import REPO_ROOT, child_env, cli_args, wait_until


def _engine(database_url: str) -> sa.Engine:
    url = parse_database_url(database_url)
    if flavour_of(url) == "sqlite":
        url = url.set(drivername="sqlite")
    return sa.create_engine(url, poolclass=NullPool)


@pytest.fixture(params=ENGINES)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database with no schema at all, on each engine."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    postgres = request.getfixturevalue("postgres")
    return str(postgres.cluster.url(postgres.cluster.create_database(prefix="empty")))


def _schema_diff(database_url: str) -> list[object]:
    engine = _engine(database_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def _tables(database_url: str) -> set[str]:
    engine = _engine(database_url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_head_on_an_empty_database_matches_the_models(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)

    assert _schema_diff(empty_database_url) == []


def test_partial_unique_index_is_in_place(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    engine = _engine(empty_database_url)
    try:
        indexes = {index["name"]: index for index in sa.inspect(engine).get_indexes("jobs")}
    finally:
        engine.dispose()

    root = indexes["uq_jobs_resource_root"]
    assert root["unique"]
    where = root.get("dialect_options", {})
    assert any("retry_of_job_id IS NULL" in str(value) for value in where.values()), root


def test_sqlite_journal_mode_is_wal(tmp_path: Path) -> None:
    migrate.upgrade(sqlite_url(tmp_path))
    engine = _engine(sqlite_url(tmp_path))
    try:
        with engine.connect() as conn:
            journal_mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
    finally:
        engine.dispose()

    assert journal_mode == "wal"


def test_downgrade_and_upgrade_round_trip(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)

    migrate.downgrade(empty_database_url, "base")
    assert _tables(empty_database_url) == {"alembic_version"}

    migrate.upgrade(empty_database_url)
    assert _schema_diff(empty_database_url) == []


def test_upgrade_is_idempotent(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    migrate.upgrade(empty_database_url)

    assert {"jobs", "job_events", "alembic_version"} <= _tables(empty_database_url)


def _start_migrates(database_url: str, count: int) -> list[subprocess.Popen[str]]:
    """`count` `leasehold migrate` processes on one database, started together."""
    return [
        subprocess.Popen(
            cli_args("migrate", "--database-url", database_url),
            cwd=REPO_ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(count)
    ]


def test_replicas_migrating_a_fresh_database_at_once_all_succeed(empty_database_url: str) -> None:
    """Several servers starting together on an empty database each run the
    migrations: they take turns, and all but the first find nothing to do."""
    migrations = _start_migrates(empty_database_url, 4)
    outputs = [process.communicate(timeout=120)[0] for process in migrations]

    assert [process.returncode for process in migrations] == [0] * 4, outputs
    assert _schema_diff(empty_database_url) == []


def test_postgres_migrations_wait_for_the_migration_lock(postgres: Postgres) -> None:
    """What makes concurrent `migrate`s take turns on PostgreSQL: each waits for
    the advisory lock before alembic reads the version table. While this test
    holds the lock, none gets anywhere; once it lets go, all finish."""
    cluster = postgres.cluster
    database = cluster.create_database(prefix="empty")
    url = cluster.url(database)
    with cluster.connect(database) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (POSTGRES_MIGRATION_LOCK,))
        migrations = _start_migrates(url, 3)

        def waiting() -> bool:
            row = holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
            return row is not None and row[0] == len(migrations)

        wait_until(waiting, 60, "every migrate to wait for the lock")
        assert [process.poll() for process in migrations] == [None] * len(migrations)
        assert _tables(url) == set()
        holder.execute("SELECT pg_advisory_unlock(%s)", (POSTGRES_MIGRATION_LOCK,))
        outputs = [process.communicate(timeout=120)[0] for process in migrations]

    assert [process.returncode for process in migrations] == [0] * len(migrations), outputs
    assert _schema_diff(url) == []
