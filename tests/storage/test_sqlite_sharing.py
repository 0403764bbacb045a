"""The SQLite WAL-reset warning fires where the bug can bite: once this process
sees another one commit to its file, and never for a `serve` alone on its file."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from leasehold._server import migrate
from leasehold._server.clock import SystemClock
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.sql import sqlite_safety
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from tests.storage.feed_looks import SOON, count_looks, until
from tests.support import OWNER, sqlite_url

WARNING = "storage.sqlite_wal_reset_bug"


@pytest.fixture
def affected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the linked SQLite has the bug, whatever this machine links."""
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 40, 1))


async def test_a_process_alone_on_its_file_never_warns(tmp_path: Path, affected: None) -> None:
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    with capture_logs() as logs:
        ours = SqlJobRepository(create_engines(url), SystemClock(), other_writers_poll_seconds=0.02)
        looks = count_looks(ours)
        try:
            for _ in range(3):
                await ours.enqueue(NewJob(OWNER, "example.echo", {}))
                await ours.claim("w", 1, 30)
                seen = looks()
                await until(lambda seen=seen: looks() >= seen + 2)  # the data version looked at since
        finally:
            await ours.close()

    assert [r for r in logs if r["event"] == WARNING] == []


async def test_another_process_writing_the_file_is_warned_about_once_with_the_remedy(
    tmp_path: Path, affected: None
) -> None:
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    with capture_logs() as logs:
        ours = SqlJobRepository(create_engines(url), SystemClock(), other_writers_poll_seconds=0.02)
        theirs = SqlJobRepository(create_engines(url), SystemClock())
        looks = count_looks(ours)
        try:
            await ours.claim("w", 1, 30)  # starts this process's look at the file
            await until(lambda: looks() >= 1)  # a baseline: later commits from elsewhere are news
            for _ in range(3):
                await theirs.enqueue(NewJob(OWNER, "example.echo", {}))
            await until(lambda: any(r["event"] == WARNING for r in logs))
            seen = looks()
            await until(lambda: looks() >= seen + 2)  # more looks: it warned once, not per look
        finally:
            await theirs.close()
            await ours.close()

    (warned,) = [r for r in logs if r["event"] == WARNING]
    assert warned["log_level"] == "warning" and warned["sqlite_version"] == "3.40.1"
    assert "upgrade the SQLite" in warned["message"]


async def test_a_fixed_sqlite_is_not_warned_about_even_when_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", sqlite_safety.FIXED)
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    with capture_logs() as logs:
        ours = SqlJobRepository(create_engines(url), SystemClock(), other_writers_poll_seconds=0.02)
        theirs = SqlJobRepository(create_engines(url), SystemClock())
        looks = count_looks(ours)
        try:
            await ours.claim("w", 1, 30)
            await until(lambda: looks() >= 2)  # past the first look, which announces a change anyway
            with ours.changes.watch_work() as work:
                work.clear()
                await theirs.enqueue(NewJob(OWNER, "example.echo", {}))
                await asyncio.wait_for(work.wait(), SOON)  # it did see the other's commit
        finally:
            await theirs.close()
            await ours.close()

    assert [r for r in logs if r["event"] == WARNING] == []
