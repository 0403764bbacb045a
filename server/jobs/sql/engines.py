"""Engine construction, per database flavour.

Writes go through a synchronous engine whose one connection the group-commit
writer holds on its own thread; reads go through SQLAlchemy async with a pool.
SQLite: the standard `sqlite3` driver for the writer and aiosqlite for reads,
both on the same file with the same settings. PostgreSQL: psycopg 3 for both
(it has a synchronous and an asyncio API over one implementation, so the
writer thread keeps its cheap synchronous calls, and reads and LISTEN stay on
the event loop; asyncpg has no synchronous API).

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

import importlib.util
import sqlite3
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, create_engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from leasehold._server.jobs.sql import sqlite_safety

log = structlog.get_logger("leasehold.storage")

SQLITE_BUSY_TIMEOUT_MS = 5_000
# 3.51.3 fixes a WAL-reset race that can corrupt a file written and checkpointed
# by several connections at once.
SQLITE_SAFE_VERSION = (3, 51, 3)

# Names the write engine (in SQLAlchemy's logs, and for tests that aim faults at it).
WRITER_ENGINE_NAME = "leasehold-writer"

# Read connections per process, unless `--database-pool-size` says otherwise. The
# writer and (on PostgreSQL) the notification listener hold one more each.
DEFAULT_POOL_SIZE = 20
# libpq settings of every PostgreSQL connection, unless the URL gives its own.
# A server that is down or unreachable fails a new connection within 5 s; a
# connection whose peer went silent (a partition, a firewall dropping idle
# flows) is found dead within about 30 s, by TCP keepalives when it is idle
# (the listener) and by the unacknowledged-data timeout when a request is on
# the wire (the writer), instead of waiting forever.
POSTGRES_CONNECTION_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
# The writer's sessions: a statement that waits 5 s for a row lock gives up (its
# caller hears UNAVAILABLE) so that one job locked by a stalled replica cannot
# hold up every write of this one; and a session of ours that sits inside a
# transaction for a minute (this process frozen or swapped out mid-batch) is
# ended by the server, so its row locks do not hold up the other replicas.
WRITER_SESSION_OPTIONS = "-c lock_timeout=5s -c idle_in_transaction_session_timeout=60s"

Flavour = Literal["sqlite", "postgresql"]
SQLITE_URL_HINT = "sqlite+aiosqlite:///PATH"
POSTGRES_URL_HINT = "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"

_SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys=ON",
    "PRAGMA mmap_size=0",
)


@dataclass(frozen=True)
class Engines:
    flavour: Flavour
    writer: Engine
    reader: AsyncEngine
    begin_statement: str

    async def dispose(self) -> None:
        self.writer.dispose()
        await self.reader.dispose()


def parse_database_url(database_url: str) -> URL:
    """The URL this service will use for `database_url`, or ValueError naming the
    setting. `postgresql://` means psycopg 3."""
    try:
        url = make_url(database_url)
    except Exception:
        raise ValueError(f"database_url: not a database URL: {database_url!r}") from None
    backend, driver = url.get_backend_name(), url.get_driver_name()
    if backend == "sqlite" and driver == "aiosqlite":
        if url.database in (None, "", ":memory:") or (url.database or "").startswith("file::memory:"):
            raise ValueError("database_url: SQLite needs a file path (an in-memory database is not durable)")
        return url
    if backend == "postgresql" and ("+" not in url.drivername or driver == "psycopg"):
        if not url.database:
            raise ValueError(f"database_url: name the PostgreSQL database, as in {POSTGRES_URL_HINT}")
        if importlib.util.find_spec("psycopg") is None:
            raise ValueError(
                "database_url: PostgreSQL needs the psycopg driver; "
                "install it with pip install 'leasehold[postgres]'"
            )
        url = url.set(drivername="postgresql+psycopg")
        return url.update_query_dict(
            {k: v for k, v in POSTGRES_CONNECTION_DEFAULTS.items() if k not in url.query}
        )
    raise ValueError(
        f"database_url: unsupported database driver {url.drivername!r}; "
        f"use {SQLITE_URL_HINT} or {POSTGRES_URL_HINT}"
    )


def check_database_url(database_url: str) -> None:
    """Raise ValueError naming `database_url` unless this service can use it."""
    parse_database_url(database_url)


def flavour_of(url: URL) -> Flavour:
    return "postgresql" if url.get_backend_name() == "postgresql" else "sqlite"


def create_engines(database_url: str, pool_size: int = DEFAULT_POOL_SIZE) -> Engines:
    url = parse_database_url(database_url)
    # Parameters stay out of error messages: they can hold job payloads, and
    # error messages reach logs. Every connection is in autocommit mode: the
    # writer opens its transactions itself, and a read is one statement.
    common: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "hide_parameters": True}
    if flavour_of(url) == "postgresql":
        return _postgres_engines(url, pool_size, common)
    sqlite_safety.warn_if_exposed(sqlite_safety.Sharing.SHARED)
    # The writer opens its one connection itself and holds it: no pool needed.
    writer = create_engine(
        url.set(drivername="sqlite+pysqlite"), poolclass=NullPool, logging_name=WRITER_ENGINE_NAME, **common
    )
    # Reads never leave a transaction open, so a returned connection needs no reset.
    reader = create_async_engine(
        url,
        pool_size=min(4, pool_size),
        max_overflow=max(0, pool_size - 4),
        pool_reset_on_return=None,
        **common,
    )
    for engine in (writer, reader):
        apply_sqlite_settings(engine)
    return Engines(flavour="sqlite", writer=writer, reader=reader, begin_statement="BEGIN IMMEDIATE")


def _postgres_engines(url: URL, pool_size: int, common: dict[str, Any]) -> Engines:
    """Every statement here is written for READ COMMITTED: claims and lease
    recovery lock their rows with SKIP LOCKED, and every other write is fenced
    by a row lock on the job it changes. The writer names the level in each
    BEGIN, whatever the database's default.

    No pre-ping on checkout (a round trip per read): when a read finds its
    connection dead, SQLAlchemy discards every pooled connection older than
    that, and the read is tried once more on a fresh one."""
    options = " ".join(filter(None, [WRITER_SESSION_OPTIONS, str(url.query.get("options", ""))]))
    writer = create_engine(
        url.update_query_dict({"options": options}),
        poolclass=NullPool,
        logging_name=WRITER_ENGINE_NAME,
        **common,
    )
    reader = create_async_engine(
        url, pool_size=pool_size, max_overflow=0, pool_reset_on_return=None, **common
    )
    return Engines(
        flavour="postgresql",
        writer=writer,
        reader=reader,
        begin_statement="BEGIN ISOLATION LEVEL READ COMMITTED",
    )


def listener_connect_args(engines: Engines) -> dict[str, Any]:
    """Keyword arguments for `psycopg.AsyncConnection.connect` that reach the
    same PostgreSQL database as `engines` with the same settings, for a
    connection outside the pool."""
    reader = engines.reader
    _args, kwargs = reader.dialect.create_connect_args(reader.url)
    kwargs.pop("context", None)  # SQLAlchemy's type adapters; a LISTEN needs none
    return {**kwargs, "autocommit": True}


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
