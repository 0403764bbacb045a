"""Engine construction, per database flavour.

Writes go through a synchronous engine (the standard `sqlite3` driver) whose one
connection the group-commit writer holds on its own thread; reads go through
SQLAlchemy async over aiosqlite. Both open the same file with the same settings.

SQLite: WAL so readers never block the writer; synchronous=FULL so a commit that
was acknowledged survives power loss, not just a process crash; a busy timeout so
two processes on one file wait for each other instead of failing; no mmap (a
memory-mapped file turns an I/O error into a crash). Every connection runs in the
driver's autocommit mode: the writer opens its transactions itself with
BEGIN IMMEDIATE (taking the write lock up front, so a read that later upgrades
can't fail with SQLITE_BUSY regardless of the busy timeout), and a read is a
single statement that holds no transaction open between calls.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import event
from sqlalchemy.engine import Engine, create_engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

log = structlog.get_logger("leasehold.storage")

SQLITE_BUSY_TIMEOUT_MS = 5_000
# 3.51.3 fixes a WAL-reset race that can corrupt a file written and checkpointed
# by several connections at once.
SQLITE_SAFE_VERSION = (3, 51, 3)

# Names the write engine (in SQLAlchemy's logs, and for tests that aim faults at it).
WRITER_ENGINE_NAME = "leasehold-writer"

_SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys=ON",
    "PRAGMA mmap_size=0",
)


@dataclass(frozen=True)
class Engines:
    writer: Engine
    reader: AsyncEngine
    begin_statement: str

    async def dispose(self) -> None:
        self.writer.dispose()
        await self.reader.dispose()


def check_database_url(database_url: str) -> None:
    """Raise ValueError naming `database_url` unless this service can use it."""
    try:
        url = make_url(database_url)
    except Exception:
        raise ValueError(f"database_url: not a database URL: {database_url!r}") from None
    if url.get_backend_name() != "sqlite" or url.get_driver_name() != "aiosqlite":
        raise ValueError(
            f"database_url: unsupported database {url.drivername!r}; use sqlite+aiosqlite:///PATH"
        )
    if url.database in (None, "", ":memory:") or (url.database or "").startswith("file::memory:"):
        raise ValueError("database_url: SQLite needs a file path (an in-memory database is not durable)")


def create_engines(database_url: str) -> Engines:
    check_database_url(database_url)
    warn_if_sqlite_is_old()
    # Parameters stay out of error messages: they can hold job payloads, and
    # error messages reach logs.
    common: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "hide_parameters": True}
    # The writer opens its one connection itself and holds it: no pool needed.
    writer = create_engine(
        make_url(database_url).set(drivername="sqlite+pysqlite"),
        poolclass=NullPool,
        logging_name=WRITER_ENGINE_NAME,
        **common,
    )
    # Reads never leave a transaction open, so a returned connection needs no reset.
    reader = create_async_engine(
        database_url, pool_size=4, max_overflow=16, pool_reset_on_return=None, **common
    )
    for engine in (writer, reader):
        apply_sqlite_settings(engine)
    return Engines(writer=writer, reader=reader, begin_statement="BEGIN IMMEDIATE")


def apply_sqlite_settings(engine: AsyncEngine | Engine) -> None:
    """Give every new connection of `engine` the settings above."""
    sync_engine = engine.sync_engine if isinstance(engine, AsyncEngine) else engine
    event.listen(sync_engine, "connect", _apply_sqlite_pragmas)


def _apply_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        for pragma in _SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def warn_if_sqlite_is_old() -> None:
    if sqlite3.sqlite_version_info < SQLITE_SAFE_VERSION:
        log.warning(
            "storage.sqlite_outdated",
            sqlite_version=sqlite3.sqlite_version,
            recommended=".".join(map(str, SQLITE_SAFE_VERSION)),
            reason="older SQLite has a WAL-reset bug that can corrupt a file written "
            "and checkpointed by several connections at once",
        )
