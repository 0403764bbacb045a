"""Driver errors become the domain's storage errors whichever way they arrive:
wrapped by SQLAlchemy, or straight from sqlite3 (the writer's savepoints)."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy.exc import OperationalError

from server.jobs.errors import StorageFull, StorageUnavailable
from server.jobs.sql.errors import translate_storage_error


def _sqlite_error(name: str) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(name.lower())
    error.sqlite_errorname = name  # type: ignore[attr-defined]
    return error


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("SQLITE_FULL", StorageFull),
        ("SQLITE_BUSY", StorageUnavailable),
        ("SQLITE_IOERR_WRITE", StorageUnavailable),
        ("SQLITE_READONLY", StorageUnavailable),
    ],
)
def test_storage_conditions_are_translated_wrapped_or_raw(name: str, expected: type[Exception]) -> None:
    raw = _sqlite_error(name)
    wrapped = OperationalError("COMMIT", None, raw)

    assert isinstance(translate_storage_error(raw), expected)
    assert isinstance(translate_storage_error(wrapped), expected)


def test_other_errors_pass_through_unchanged() -> None:
    constraint = sqlite3.IntegrityError("UNIQUE constraint failed")
    bug = KeyError("x")

    assert translate_storage_error(constraint) is constraint
    assert translate_storage_error(bug) is bug
