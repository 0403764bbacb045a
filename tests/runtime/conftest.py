from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leasehold._server.clock import SystemClock
from leasehold._server.jobs.repository import JobRepository
from tests.support import REPOSITORY_ENGINES, make_sqlite_repository, repository_on


@pytest.fixture(params=REPOSITORY_ENGINES)
async def live_repository(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobRepository]:
    """A repository on each engine (SQLite, PostgreSQL, in memory) on the system
    clock, for runtime tests. Tests that move time by hand use the `repository`
    fixture (tests/conftest.py), which is on the `clock` fixture's manual clock."""
    repo = await repository_on(request.param, request, tmp_path, SystemClock())
    try:
        yield repo
    finally:
        await repo.close()


@pytest.fixture
async def sqlite_live_repository(tmp_path: Path) -> AsyncIterator[JobRepository]:
    """SQLite only, for a test that injects SQLite's own errors."""
    repo = await make_sqlite_repository(tmp_path, SystemClock())
    try:
        yield repo
    finally:
        await repo.close()
