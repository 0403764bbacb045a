"""Translate driver errors into the domain's storage errors.

Only conditions an operator can act on become `StorageFull`/`StorageUnavailable`;
anything else (a constraint we did not expect, a bug) propagates unchanged so it is
seen as the internal error it is. Errors arrive wrapped by SQLAlchemy, or as the
driver's own (statements the writer sends straight to the driver).
"""

from __future__ import annotations

import sqlite3
import sys
from types import ModuleType

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from leasehold._server.jobs.errors import StorageFull, StorageUnavailable


def _psycopg() -> ModuleType | None:
    """The PostgreSQL driver, if this process has loaded it. Only a process that
    connected to PostgreSQL can hold one of its errors, and one on SQLite never
    loads it: not importing it here keeps it off every SQLite server's start."""
    return sys.modules.get("psycopg")


_FULL = {"SQLITE_FULL"}
_READ_ONLY_PREFIX = "SQLITE_READONLY"
_UNAVAILABLE_PREFIXES = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_PROTOCOL")

# PostgreSQL SQLSTATEs (https://www.postgresql.org/docs/current/errcodes-appendix.html).
_PG_CONFLICTS = {"40001", "40P01"}  # serialization failure, deadlock detected
_PG_FULL = {"53100"}  # disk full
_PG_UNAVAILABLE_CLASSES = ("08",)  # connection exceptions
_PG_UNAVAILABLE = {
    "25006",  # read-only transaction (a standby, or default_transaction_read_only)
    "53200",  # out of memory
    "53300",  # too many connections
    "55P03",  # lock not available
    "57014",  # query cancelled (statement_timeout)
    "57P01",  # admin shutdown
    "57P02",  # crash shutdown
    "57P03",  # cannot connect now (starting up, shutting down)
    *_PG_CONFLICTS,
}


def _driver_error(exc: BaseException) -> BaseException | None:
    if isinstance(exc, DBAPIError):
        return exc.orig
    psycopg = _psycopg()
    if isinstance(exc, sqlite3.Error) or (psycopg is not None and isinstance(exc, psycopg.Error)):
        return exc
    return None


def _sqlstate(original: BaseException | None) -> str:
    return getattr(original, "sqlstate", None) or ""


# What says no writable database answered: the connection failed or broke, the
# server is going down or starting up, or the host reached is a standby.
_PG_NOT_REACHED = {"25006", "57P01", "57P02", "57P03"}


def is_connection_failure(exc: BaseException) -> bool:
    """Whether `exc` says this process could not reach a writable database, as
    opposed to a database that answered and refused (busy, full, a conflict)."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    original = _driver_error(exc)
    psycopg = _psycopg()
    if psycopg is None or not isinstance(original, psycopg.Error):
        return False
    state = _sqlstate(original)
    if not state:
        return isinstance(original, psycopg.OperationalError)
    return state.startswith(_PG_UNAVAILABLE_CLASSES) or state in _PG_NOT_REACHED


def is_write_conflict(exc: BaseException) -> bool:
    """Whether `exc` says this transaction lost a lock conflict with another
    (a deadlock, a serialization failure): running it again can succeed."""
    return _sqlstate(_driver_error(exc)) in _PG_CONFLICTS


def translate_storage_error(exc: BaseException) -> BaseException:
    """The domain error for `exc`, or `exc` itself when it is not a storage
    condition."""
    if isinstance(exc, PoolTimeout):
        return StorageUnavailable("no database connection free in time; retry later")
    original = _driver_error(exc)
    if original is None:
        return exc
    name = getattr(original, "sqlite_errorname", "") or ""
    if name in _FULL:
        return StorageFull("database or disk is full; free space and retry")
    if name.startswith(_READ_ONLY_PREFIX):
        return StorageUnavailable("database is read-only; writes are refused until it is writable")
    if name.startswith(_UNAVAILABLE_PREFIXES):
        return StorageUnavailable(f"database unavailable ({name}); retry later")
    state = _sqlstate(original)
    if state in _PG_FULL:
        return StorageFull("database disk is full; free space and retry")
    if state in _PG_UNAVAILABLE or state.startswith(_PG_UNAVAILABLE_CLASSES):
        return StorageUnavailable(f"database unavailable (SQLSTATE {state}); retry later")
    psycopg = _psycopg()
    if psycopg is not None and isinstance(original, psycopg.OperationalError):
        # No SQLSTATE: the server could not be reached, or the connection broke.
        return StorageUnavailable("database connection failed; retry later")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return StorageUnavailable("database connection lost; retry later")
    return exc
