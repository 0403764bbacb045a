from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from leasehold._server.clock import SystemClock
from leasehold._server.jobs.repository import JobRepository
from tests.support import make_sqlite_repository


@pytest.fixture
async def live_repository(tmp_path: Path) -> AsyncIterator[JobRepository]:
    """A real SQLite repository on the system clock, for runtime tests."""
    repo = await make_sqlite_repository(tmp_path, SystemClock())
    try:
        yield repo
    finally:
        await repo.close()
