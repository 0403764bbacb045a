"""SQLite-specific behaviour of the storage engine: settings and fault handling."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from server import migrate
from server.clock import ManualClock
from server.jobs.errors import StorageFull, StorageUnavailable
from server.jobs.records import JobFilter, NewJob
from server.jobs.sql.engines import create_engines
from server.jobs.sql.repository import SqlJobRepository
from tests.support import OWNER, sqlite_url


def _job() -> NewJob:
    return NewJob(owner_id=OWNER, kind="example.echo", payload={"text": "x" * 2000})


async def _repository_with_writer_pragma(tmp_path: Path, pragma: str) -> SqlJobRepository:
    """A repository whose write connection runs `pragma` on connect: a real SQLite
    fault (read-only, full) without needing a special filesystem."""
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    engines = create_engines(url)

    def restrict(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(pragma)
        cursor.close()

    event.listen(engines.writer.sync_engine, "connect", restrict)
    return SqlJobRepository(engines, ManualClock())


async def test_connections_use_wal_full_sync_busy_timeout_and_no_mmap(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    engines = create_engines(url)
    try:
        async with engines.reader.connect() as conn:
            settings = {
                name: (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar()
                for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys", "mmap_size")
            }
    finally:
        await engines.dispose()

    assert settings == {
        "journal_mode": "wal",
        "synchronous": 2,  # FULL
        "busy_timeout": 5000,
        "foreign_keys": 1,
        "mmap_size": 0,
    }


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite+aiosqlite://", "file path"),
        ("sqlite+aiosqlite:///:memory:", "file path"),
        ("mysql+aiomysql://db/leasehold", "unsupported database"),
    ],
)
def test_unusable_database_urls_are_refused_by_name(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"database_url: .*{message}"):
        create_engines(url)


async def test_a_read_only_database_refuses_writes_clearly_and_still_reads(tmp_path: Path) -> None:
    repository = await _repository_with_writer_pragma(tmp_path, "PRAGMA query_only=ON")
    try:
        with pytest.raises(StorageUnavailable, match="read-only"):
            await repository.enqueue(_job())
        page = await repository.list_jobs(OWNER, JobFilter(), 10, None)
    finally:
        await repository.close()

    assert page.jobs == []


async def test_a_full_database_refuses_writes_and_keeps_what_was_acknowledged(
    tmp_path: Path,
) -> None:
    repository = await _repository_with_writer_pragma(tmp_path, "PRAGMA max_page_count=12")
    acknowledged = []
    try:
        with pytest.raises(StorageFull, match="full"):
            for _ in range(200):
                job, _ = await repository.enqueue(_job())
                acknowledged.append(job.id)
        page = await repository.list_jobs(OWNER, JobFilter(), 500, None)
    finally:
        await repository.close()

    assert acknowledged, "the database should hold a few jobs before it fills up"
    assert sorted(job.id for job in page.jobs) == sorted(acknowledged)
