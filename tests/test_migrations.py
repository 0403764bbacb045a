"""The alembic history yields exactly the declared schema, and round-trips."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from server import migrate
from server.jobs.sql.tables import metadata
from tests.support import sqlite_url


def _sync_url(path: Path) -> str:
    return f"sqlite:///{path}"


def _schema_diff(path: Path) -> list[object]:
    engine = sa.create_engine(_sync_url(path))
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def _tables(path: Path) -> set[str]:
    engine = sa.create_engine(_sync_url(path))
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_head_on_an_empty_database_matches_the_models(tmp_path: Path) -> None:
    migrate.upgrade(sqlite_url(tmp_path))

    assert _schema_diff(tmp_path / "leasehold.db") == []


def test_partial_unique_index_and_journal_mode_are_in_place(tmp_path: Path) -> None:
    migrate.upgrade(sqlite_url(tmp_path))
    engine = sa.create_engine(_sync_url(tmp_path / "leasehold.db"))
    try:
        with engine.connect() as conn:
            index_sql = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'uq_jobs_resource_root'"
            ).scalar_one()
            journal_mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
    finally:
        engine.dispose()

    assert "UNIQUE" in index_sql and "retry_of_job_id IS NULL" in index_sql
    assert journal_mode == "wal"


def test_downgrade_and_upgrade_round_trip(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    db = tmp_path / "leasehold.db"
    migrate.upgrade(url)

    migrate.downgrade(url, "base")
    assert _tables(db) == {"alembic_version"}

    migrate.upgrade(url)
    assert _schema_diff(db) == []


def test_upgrade_is_idempotent(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    migrate.upgrade(url)
    migrate.upgrade(url)

    assert {"jobs", "job_events", "alembic_version"} <= _tables(tmp_path / "leasehold.db")
