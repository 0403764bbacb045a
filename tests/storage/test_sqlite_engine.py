"""SQLite-specific behaviour of the storage engine: settings and fault handling."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from leasehold._server import migrate
from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import StorageFull, StorageUnavailable
from leasehold._server.jobs.records import JobFilter, NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
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

    event.listen(engines.writer, "connect", restrict)
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


async def test_a_busy_writer_leaves_the_lock_free_for_another_process_now_and_then(tmp_path: Path) -> None:
    """SQLite does not queue writers: another process waiting for the write lock
    polls for it (every 100 ms once it has waited a while). A writer that starts
    its next transaction the moment it commits would keep that process out until
    its busy timeout fails it. Under continuous load the lock must therefore be
    seen free for longer than one such poll at least once in a few seconds."""
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    repository = SqlJobRepository(create_engines(url), ManualClock())
    stop = threading.Event()
    free_runs: list[float] = []

    def watch_the_lock() -> None:
        # Another connection, as another process would have; it never waits.
        conn = sqlite3.connect(tmp_path / "leasehold.db", timeout=0, isolation_level=None)
        run_began: float | None = None
        last_free = 0.0
        try:
            while not stop.is_set():
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("ROLLBACK")
                except sqlite3.OperationalError:  # locked: the writer holds it
                    if run_began is not None:
                        free_runs.append(last_free - run_began)
                    run_began = None
                else:
                    last_free = time.monotonic()
                    run_began = last_free if run_began is None else run_began
                time.sleep(0.005)
        finally:
            conn.close()

    async def produce() -> None:
        while not stop.is_set():
            await repository.enqueue(_job())

    watcher = threading.Thread(target=watch_the_lock)
    try:
        producers = [asyncio.create_task(produce()) for _ in range(32)]
        await asyncio.sleep(0.3)  # the load is running before anyone watches
        watcher.start()
        await asyncio.sleep(3.0)
        stop.set()
        await asyncio.gather(*producers)
    finally:
        stop.set()
        if watcher.is_alive():
            await asyncio.to_thread(watcher.join)
        await repository.close()

    assert max(free_runs, default=0.0) >= 0.1, sorted(free_runs)[-5:]
