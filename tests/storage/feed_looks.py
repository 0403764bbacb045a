"""Counting the SQLite change feed's looks at `PRAGMA data_version`.

Tests of what the feed notices (another process's commits, the shared-file warning) must
let it look, sometimes more than once, before they act. A sleep only hopes it has: on a
loaded machine a 0.1 s sleep can end before the first look. These wait for looks instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from leasehold._server.jobs.sql.repository import SqlJobRepository

SOON = 15.0  # for what takes a few polls of a few hundredths of a second: generous, for load


def count_looks(repository: SqlJobRepository) -> Callable[[], int]:
    """Count from now on the looks of `repository`'s feed (SQLite's); returns the count's reader.
    Call it before the feed starts (the first claim starts it) to count the first look."""
    feed = repository._feed
    look = feed._others_committed  # type: ignore[attr-defined]
    count = 0

    def counted(conn: Any) -> bool:
        nonlocal count
        changed: bool = look(conn)
        count += 1
        return changed

    feed._others_committed = counted  # type: ignore[attr-defined]
    return lambda: count


async def until(condition: Callable[[], bool], timeout: float = SOON) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)
