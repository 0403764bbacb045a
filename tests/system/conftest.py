from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import sqlite_url


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return sqlite_url(tmp_path)
