"""Translate driver errors into the domain's storage errors.

Only conditions an operator can act on become `StorageFull`/`StorageUnavailable`;
anything else (a constraint we did not expect, a bug) propagates unchanged so it is
seen as the internal error it is.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from server.jobs.errors import StorageFull, StorageUnavailable

_FULL = {"SQLITE_FULL"}
_READ_ONLY_PREFIX = "SQLITE_READONLY"
_UNAVAILABLE_PREFIXES = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_PROTOCOL")


def translate_storage_error(exc: BaseException) -> BaseException:
    """The domain error for `exc` (SQLAlchemy's wrapper, or the sqlite3 driver's own
    error), or `exc` itself when it is not a storage condition."""
    if isinstance(exc, PoolTimeout):
        return StorageUnavailable("no database connection free in time; retry later")
    if isinstance(exc, sqlite3.Error):
        original: BaseException | None = exc
    elif isinstance(exc, DBAPIError):
        original = exc.orig
    else:
        return exc
    name = getattr(original, "sqlite_errorname", "") or ""
    if name in _FULL:
        return StorageFull("database or disk is full; free space and retry")
    if name.startswith(_READ_ONLY_PREFIX):
        return StorageUnavailable("database is read-only; writes are refused until it is writable")
    if name.startswith(_UNAVAILABLE_PREFIXES):
        return StorageUnavailable(f"database unavailable ({name}); retry later")
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return StorageUnavailable("database connection lost; retry later")
    return exc
