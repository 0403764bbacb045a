"""SQLite: one file, one writer at a time, other processes noticed by polling.

Connections: the standard `sqlite3` driver for the writer and aiosqlite for
reads, both on the same file with the same settings: WAL so readers never
block the writer; synchronous=FULL so a commit that was acknowledged survives
power loss, not just a process crash; a busy timeout so two processes on one
file wait for each other instead of failing; no mmap (a memory-mapped file
turns an I/O error into a crash). Every connection runs in the driver's
autocommit mode: the writer opens its transactions itself with BEGIN IMMEDIATE
(taking the write lock up front, so a read that later upgrades can't fail with
SQLITE_BUSY regardless of the busy timeout), and a read is a single statement
that holds no transaction open between calls.

Statements: the writer holds the database's one write lock, so plain
statements are already atomic and no row locking is needed.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import and_, bindparam, event, insert, tuple_
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import StorageClosed, StorageFull, StorageUnavailable
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.records import Lease
from leasehold._server.jobs.sql import admin as sql_admin
from leasehold._server.jobs.sql import feed as feed_rows
from leasehold._server.jobs.sql import request_ids, sqlite_safety
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql.dialect import Announce, Engines, SqlDialect
from leasehold._server.jobs.sql.engines import WRITER_ENGINE_NAME
from leasehold._server.jobs.sql.tables import job_events, jobs, rate_buckets
from leasehold._server.jobs.sql.transitions import NOW, RETURNING, update_for

if TYPE_CHECKING:
    from leasehold._server.jobs.sql.writer import GroupCommitWriter

log = structlog.get_logger("leasehold.storage")

SQLITE_BUSY_TIMEOUT_MS = 5_000

_SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    "PRAGMA foreign_keys=ON",
    "PRAGMA mmap_size=0",
)

# ----- connections ----------------------------------------------------------------------


def check_url(url: URL) -> URL:
    if url.get_driver_name() != "aiosqlite":
        raise ValueError(
            f"database_url: unsupported database driver {url.drivername!r}; use sqlite+aiosqlite:///PATH"
        )
    if url.database in (None, "", ":memory:") or (url.database or "").startswith("file::memory:"):
        raise ValueError("database_url: SQLite needs a file path (an in-memory database is not durable)")
    return url


def create_engines(url: URL, pool_size: int) -> Engines:
    # Parameters stay out of error messages: they can hold job payloads, and
    # error messages reach logs.
    common: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", "hide_parameters": True}
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
    event.listen(writer, "connect", _register_functions)
    return Engines(dialect=DIALECT, writer=writer, reader=reader)


def _register_functions(dbapi_connection: Any, _record: Any) -> None:
    """The functions the transitions use that SQLite may lack (its math
    functions are a compile-time option), with PostgreSQL's meaning."""
    dbapi_connection.create_function("power", 2, _power, deterministic=True)
    dbapi_connection.create_function("strpos", 2, _strpos, deterministic=True)


def _power(base: float | None, exponent: float | None) -> float | None:
    if base is None or exponent is None:
        return None
    return math.pow(base, exponent)


def _strpos(text: str | None, part: str | None) -> int | None:
    """1-based position of `part` in `text`, 0 when absent (PostgreSQL's strpos)."""
    if text is None or part is None:
        return None
    return text.find(part) + 1


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


# ----- statements ---------------------------------------------------------------------------


# The claim filters on `id` alone: with a second condition on `status`,
# SQLite's planner walks every queued job through the status index instead of
# looking up the few ids. The claim chose queued rows inside this write
# transaction, and no other writer can change them before it commits.
_CLAIM_CHOSEN = update_for(
    sm.CLAIM,
    jobs.c.id.in_(bindparam("claim_ids", expanding=True)),
    returning=(*RETURNING, *sql.CLAIMED_EXTRA),
)


def _chosen_parameters(job_ids: list[str]) -> dict[str, Any]:
    return {"claim_ids": job_ids}


_UPSERT_BUCKET = sqlite_insert(rate_buckets).values(
    kind=bindparam("kind"), tokens=bindparam("tokens"), refilled_at=bindparam("refilled_at")
)
_UPSERT_BUCKET = _UPSERT_BUCKET.on_conflict_do_update(
    index_elements=[rate_buckets.c.kind],
    set_={"tokens": _UPSERT_BUCKET.excluded.tokens, "refilled_at": _UPSERT_BUCKET.excluded.refilled_at},
)


_RECOVER_EXPIRED = update_for(sm.RECOVER_EXPIRED_LEASE, sql.EXPIRED)
_END_OVERDUE = update_for(sm.END_OVERDUE, sql.OVERDUE)

# Many leases at once: `fences` holds (id, token, 'running') rows, `job_ids`
# their ids. The first condition is what makes SQLite look the rows up by id (a
# plain `status = ...` here would send it down the status index).
_FENCED_MANY = and_(
    jobs.c.id.in_(bindparam("job_ids", expanding=True)),
    tuple_(jobs.c.id, jobs.c.lease_token, jobs.c.status).in_(bindparam("fences", expanding=True)),
    jobs.c.lease_expires_at > NOW,
)
_MANY_LEASES = sql.many_leases(_FENCED_MANY)


def _lease_parameters(leases: Sequence[Lease], now: datetime) -> dict[str, Any]:
    return {
        "job_ids": [lease.job_id for lease in leases],
        "fences": [(lease.job_id, lease.token, sql.RUNNING) for lease in leases],
        "now": now,
    }


_INSERT_IF_NEW = sql.insert_if_new(sqlite_insert)
_INSERT_REQUEST_ID = request_ids.insert_if_new(sqlite_insert)
_INSERT_PAUSED_KIND = sql_admin.insert_paused_kind(sqlite_insert)

# executemany runs in C and costs a few microseconds a row.
_INSERTS = {"jobs": insert(jobs), "job_events": insert(job_events)}


def _bulk_insert(conn: Connection, table: str, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(_INSERTS[table], rows)


# ----- the writer's pacing --------------------------------------------------------------------

# SQLite does not queue writers: one that finds the write lock taken sleeps and
# polls again (every 100 ms once it has waited a while) until its busy timeout
# (5 s). A writer that begins its next batch the moment it commits can therefore
# keep another process's writer out past that timeout. So once the lock has been
# held most of the time (BUSY_SHARE) for MAX_HOLD_SECONDS, the writer leaves it
# free for longer than one poll; work arriving meanwhile joins the next batch.
# A writer that holds it less than that leaves gaps a poll will find. The hold is
# long enough that the pause costs a saturated single process little of its
# write time, and short enough that a waiting process gets in well within its
# timeout; a merely busy one (a job every few milliseconds) never pauses.
MAX_HOLD_SECONDS = 2.5
BUSY_SHARE = 0.5
LOCK_GAP_SECONDS = 0.15


class LockFairness:
    """Leaves the write lock free now and then for other processes (see above);
    the lock's share is judged per window of MAX_HOLD_SECONDS. The clock and the
    sleep are the process's own unless a test injects others."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._monotonic = monotonic
        self._sleep = sleep
        self._window_began = monotonic()
        self._held = 0.0

    async def before_batch(self, idle_seconds: float) -> None:
        now = self._monotonic()
        if idle_seconds >= LOCK_GAP_SECONDS:
            self._window_began, self._held = now, 0.0  # it was free long enough just now
        elif now - self._window_began >= MAX_HOLD_SECONDS:
            if self._held >= BUSY_SHARE * (now - self._window_began):
                await self._sleep(LOCK_GAP_SECONDS)
            self._window_began, self._held = self._monotonic(), 0.0

    def after_batch(self, held_seconds: float) -> None:
        self._held += held_seconds


# ----- other processes' commits ------------------------------------------------------------------


class DataVersionFeed:
    """One `PRAGMA data_version` per interval on the writer's connection: the
    number changes with every commit made through any connection but that one,
    so one cheap look tells whether another process wrote, however many
    watchers and workers there are.

    It is also how this process learns that the file is shared: the first commit
    seen from elsewhere is when the SQLite WAL-reset bug can bite, and if the
    linked SQLite has it, that is when it is warned about (once), with the
    remedy. A `serve` alone on its file never warns (see sqlite_safety.py)."""

    def __init__(self, changes: ChangeHub, writer: GroupCommitWriter, poll_seconds: float) -> None:
        self._changes = changes
        self._writer = writer
        self._poll_seconds = poll_seconds
        # (which of the writer's connections, its data version) at the last look.
        self._last: tuple[int, int] | None = None
        self._warned_shared = False

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            try:
                if await self._writer.on_connection(self._others_committed):
                    self._changes.publish_unknown_changes()
            except StorageClosed:
                return
            except (StorageUnavailable, StorageFull) as exc:
                log.warning("storage.other_writers_check_failed", error=str(exc))
            except Exception as exc:  # a bug, or a file gone bad: keep looking, loudly
                log.error("storage.other_writers_check_failed", error_class=type(exc).__name__, exc_info=exc)

    def _others_committed(self, conn: Connection) -> bool:
        """On the writer's thread. A new connection has a baseline of its own:
        its first look counts as a change."""
        version = conn.exec_driver_sql("PRAGMA data_version").scalar()
        current = (self._writer.connections_opened, int(version or 0))
        changed = current != self._last
        if changed and self._last is not None and self._last[0] == current[0]:
            self._file_is_shared()
        self._last = current
        return changed

    def _file_is_shared(self) -> None:
        if not self._warned_shared:
            self._warned_shared = True
            sqlite_safety.warn_if_exposed(sqlite_safety.Sharing.SHARED)


def _change_feed(
    engines: Engines, changes: ChangeHub, writer: GroupCommitWriter, origin: str, poll_seconds: float
) -> DataVersionFeed:
    return DataVersionFeed(changes, writer, poll_seconds)


def _no_announce(origin: str) -> Announce | None:
    return None  # other processes poll the file's data version instead


def _plans_are_not_cached(conn: Connection) -> None:
    """SQLite plans each statement as it prepares it, with what it knows then."""


def _one_writer_already(conn: Connection) -> None:
    """BEGIN IMMEDIATE took the database's one write lock: claims are one at a time."""


def _never_conflicts(exc: BaseException) -> bool:
    return False  # one writer at a time: no deadlocks to lose


DIALECT = SqlDialect(
    name="sqlite",
    begin_statement="BEGIN IMMEDIATE",
    check_url=check_url,
    create_engines=create_engines,
    claim_chosen=_CLAIM_CHOSEN,
    chosen_parameters=_chosen_parameters,
    locks_rows=False,
    lock_claims=_one_writer_already,
    plan_afresh=_plans_are_not_cached,
    upsert_bucket=_UPSERT_BUCKET,
    recover_expired=_RECOVER_EXPIRED,
    end_overdue=_END_OVERDUE,
    many_leases=_MANY_LEASES,
    lease_parameters=_lease_parameters,
    insert_if_new=_INSERT_IF_NEW,
    insert_request_id=_INSERT_REQUEST_ID,
    insert_paused_kind=_INSERT_PAUSED_KIND,
    advance_feed_heads=feed_rows.advance_heads(sqlite_insert),
    bulk_insert=_bulk_insert,
    pacing=LockFairness,
    is_write_conflict=_never_conflicts,
    conflict_attempts=1,
    announce=_no_announce,
    change_feed=_change_feed,
)
