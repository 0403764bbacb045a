"""Driver errors become the domain's storage errors whichever way they arrive:
wrapped by SQLAlchemy, or straight from the driver (the writer's savepoints),
from sqlite3 or from psycopg."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from leasehold._server.jobs.errors import StorageFull, StorageUnavailable
from leasehold._server.jobs.sql.errors import is_write_conflict, translate_storage_error


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


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (psycopg.errors.DiskFull("could not extend file"), StorageFull),
        (
            psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
            StorageUnavailable,
        ),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), StorageUnavailable),
        (psycopg.errors.DeadlockDetected("deadlock detected"), StorageUnavailable),
        (psycopg.errors.ReadOnlySqlTransaction("read-only transaction"), StorageUnavailable),
        (psycopg.OperationalError("connection refused"), StorageUnavailable),
    ],
)
def test_postgres_conditions_are_translated_wrapped_or_raw(
    error: psycopg.Error, expected: type[Exception]
) -> None:
    wrapped = OperationalError("COMMIT", None, error)

    assert isinstance(translate_storage_error(error), expected)
    assert isinstance(translate_storage_error(wrapped), expected)


def test_only_lock_conflicts_are_worth_running_the_batch_again() -> None:
    assert is_write_conflict(psycopg.errors.DeadlockDetected("deadlock detected"))
    assert is_write_conflict(OperationalError("UPDATE", None, psycopg.errors.SerializationFailure("x")))
    assert not is_write_conflict(psycopg.errors.UniqueViolation("duplicate key"))
    assert not is_write_conflict(_sqlite_error("SQLITE_BUSY"))


def test_postgres_constraint_errors_pass_through_unchanged() -> None:
    duplicate = psycopg.errors.UniqueViolation("duplicate key value")

    assert translate_storage_error(duplicate) is duplicate
