from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import sqlite_url
from tests.system.helpers import Leasehold


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return sqlite_url(tmp_path)


@pytest.fixture
def processes() -> Iterator[Callable[[Leasehold], Leasehold]]:
    """Track every `leasehold` process a test starts; SIGKILL any still alive at the end."""
    started: list[Leasehold] = []

    def track(process: Leasehold) -> Leasehold:
        started.append(process)
        return process

    yield track
    for process in started:
        process.kill()
