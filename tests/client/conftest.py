from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import sqlite_url


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """The client's behaviour does not depend on the engine: one SQLite file, which
    a restarted server opens again."""
    return sqlite_url(tmp_path)
