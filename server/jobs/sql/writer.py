"""Group commit: one task owns the write connection and commits queued operations
in batches.

Through SQLAlchemy async and aiosqlite every statement is a thread hop, so one
transaction per operation caps throughput at a few hundred writes a second. Here
callers hand in an operation (an async function of a `WriteTx`); the writer runs
everything that has queued up since its last commit inside one transaction, each
operation under its own savepoint so a failing one does not sink its neighbours,
commits once, and only then resolves each caller's future and announces the
changes. An acknowledged write is therefore always a committed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from server.jobs.errors import StorageClosed, StorageFull, StorageUnavailable
from server.jobs.notifications import ChangeHub
from server.jobs.sql.errors import translate_storage_error

T = TypeVar("T")

log = structlog.get_logger("leasehold.storage")

# SQLite does not queue writers: one that finds the write lock taken sleeps and
# polls again (every 100 ms once it has waited a while) until its busy timeout.
# A writer that begins its next batch the moment it commits can therefore keep
# another process's writer out past that timeout. So after holding the lock for
# MAX_HOLD_SECONDS of back-to-back batches, the writer leaves it free for longer
# than one poll. Work arriving meanwhile joins the next batch.
MAX_HOLD_SECONDS = 1.0
LOCK_GAP_SECONDS = 0.15


@dataclass
class WriteTx:
    """What an operation gets: the connection inside the open transaction, and a
    place to say what to announce once the transaction commits."""

    conn: AsyncConnection
    work_changed: bool = False
    jobs_with_new_events: set[str] = field(default_factory=set)

    def announce_work(self) -> None:
        self.work_changed = True

    def announce_events(self, job_id: str) -> None:
        self.jobs_with_new_events.add(job_id)


WriteOp = Callable[[WriteTx], Awaitable[T]]


@dataclass
class _Pending:
    op: WriteOp[Any]
    future: asyncio.Future[Any]


class GroupCommitWriter:
    def __init__(
        self,
        engine: AsyncEngine,
        changes: ChangeHub,
        begin_statement: str,
        max_batch: int = 256,
    ) -> None:
        self._engine = engine
        self._changes = changes
        self._begin_statement = begin_statement
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._conn: AsyncConnection | None = None
        self._closed = False

    async def run(self, op: WriteOp[T]) -> T:
        """Run `op` in the next batch; returns after its transaction committed."""
        if self._closed:
            raise StorageClosed("storage is shutting down")
        if self._task is None or self._task.done():
            # First use, or the loop died of a bug: a fresh loop serves the queue.
            self._task = asyncio.create_task(self._loop(), name="leasehold-writer")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(op, future))
        return await future

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._queue.put_nowait(None)
            await self._task
            self._task = None
        await self._drop_connection()

    async def _loop(self) -> None:
        stopping = False
        streak_began: float | None = None  # first of the current back-to-back batches
        while not stopping:
            idle_from = time.monotonic()
            first = await self._queue.get()
            now = time.monotonic()
            if streak_began is None or now - idle_from >= LOCK_GAP_SECONDS:
                streak_began = now
            elif now - streak_began >= MAX_HOLD_SECONDS:
                await asyncio.sleep(LOCK_GAP_SECONDS)
                streak_began = time.monotonic()
            if first is None:
                break
            batch = [first]
            while len(batch) < self._max_batch and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            await self._commit_batch(batch)

    async def _commit_batch(self, batch: list[_Pending]) -> None:
        live = [item for item in batch if not item.future.done()]
        if not live:
            return
        try:
            conn = await self._connection()
            await conn.exec_driver_sql(self._begin_statement)
        except Exception as exc:  # the database refused to start a transaction
            await self._drop_connection()
            self._fail(live, exc)
            return

        succeeded: list[tuple[_Pending, WriteTx, Any]] = []
        refused: list[tuple[_Pending, Exception]] = []
        use_savepoints = len(live) > 1
        for item in live:
            tx = WriteTx(conn)
            try:
                if use_savepoints:
                    await conn.exec_driver_sql("SAVEPOINT op")
                result = await item.op(tx)
                if use_savepoints:
                    await conn.exec_driver_sql("RELEASE SAVEPOINT op")
            except Exception as exc:
                if use_savepoints and await self._rollback_savepoint(conn):
                    refused.append((item, exc))
                    continue
                # No savepoint to fall back to: the whole transaction goes.
                await self._rollback()
                self._fail(live, exc, culprit=item)
                return
            succeeded.append((item, tx, result))

        try:
            await conn.exec_driver_sql("COMMIT")
        except Exception as exc:
            await self._rollback()
            self._fail(live, exc)
            return

        for item, error in refused:
            _settle(item.future, error=translate_storage_error(error))
        work_changed = False
        jobs_with_events: set[str] = set()
        for item, committed, result in succeeded:
            work_changed |= committed.work_changed
            jobs_with_events |= committed.jobs_with_new_events
            _settle(item.future, result=result)
        if work_changed:
            self._changes.publish_work()
        if jobs_with_events:
            self._changes.publish_events(jobs_with_events)

    async def _rollback_savepoint(self, conn: AsyncConnection) -> bool:
        try:
            await conn.exec_driver_sql("ROLLBACK TO SAVEPOINT op")
            await conn.exec_driver_sql("RELEASE SAVEPOINT op")
            return True
        except Exception:
            # Some errors (disk full, I/O) make SQLite roll back the whole
            # transaction, taking the savepoint with it.
            return False

    def _fail(self, items: list[_Pending], exc: Exception, culprit: _Pending | None = None) -> None:
        """Settle every caller of a batch that did not commit. The operation that
        caused it gets its own error; its neighbours get the storage error, or a
        retryable one when the cause was that operation alone."""
        error = translate_storage_error(exc)
        if error is not exc:
            log.warning("storage.write_failed", error=str(error))
        neighbours_error = (
            error
            if isinstance(error, StorageUnavailable | StorageFull)
            else StorageUnavailable("write batch aborted; retry")
        )
        for item in items:
            _settle(item.future, error=error if item is culprit or culprit is None else neighbours_error)

    async def _rollback(self) -> None:
        if self._conn is None:
            return
        try:
            await self._conn.exec_driver_sql("ROLLBACK")
        except Exception:
            # Either nothing was open (SQLite rolled back by itself) or the
            # connection is broken; a fresh connection settles both.
            await self._drop_connection()

    async def _connection(self) -> AsyncConnection:
        if self._conn is None:
            self._conn = await self._engine.connect()
        return self._conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.invalidate()
            with contextlib.suppress(Exception):
                await conn.close()


def _settle(future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
