"""Group commit: one thread owns the write connection and commits queued operations
in batches.

A statement is cheap for SQLite and expensive for Python's async database stack:
through SQLAlchemy async and aiosqlite every statement is several thread hops,
each waiting for a turn of a busy event loop. So writes do not go that way.
Callers hand in an operation (a plain function of a `WriteTx`); the writer takes
everything that has queued up since its last commit to its own thread in one hop,
runs it there inside one transaction over SQLAlchemy Core's synchronous API,
commits once, and only then, back on the event loop, resolves each caller's
future and announces the changes. An acknowledged write is therefore always a
committed one. A failing operation does not sink its neighbours: the batch is
rolled back and run again with each operation under its own savepoint, which
only such a batch pays for.

The commonest operations (a success, a heartbeat) also come as an `OpGroup`:
the same operation for many callers, which the writer runs as one statement
for all of them that queued together.

An operation may also wait for work (`run_on_next_work`): it runs inside the
next batch that makes work claimable, just before that batch commits. An idle
runtime's claim waits this way, so a job enqueued while a slot is free is
claimed in the enqueue's own commit, one commit from the call to its handler.

What differs between databases comes from the dialect: how a transaction
begins; the pacing between batches (SQLite leaves its one write lock free now
and then for other processes); which errors mean the batch lost a lock conflict
to another writer (on PostgreSQL two replicas' batches can lock the same jobs
in opposite orders; the database fails one, and the writer rolls its whole
batch back, releasing every lock it took so the other goes ahead, and runs it
again); and an `announce` hook that tells other replicas what a batch changed,
inside the same transaction, so they hear of it exactly when it commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from leasehold._server.jobs.errors import CommitOutcomeUnknown, StorageClosed, StorageFull, StorageUnavailable
from leasehold._server.jobs.notifications import ChangeHub, feed_key
from leasehold._server.jobs.reachability import Reachability
from leasehold._server.jobs.records import FeedEvent, JobEvent, JobSubject
from leasehold._server.jobs.sql.dialect import Announce, SqlDialect
from leasehold._server.jobs.sql.errors import is_connection_failure, translate_storage_error

T = TypeVar("T")
ItemT = TypeVar("ItemT")

log = structlog.get_logger("leasehold.storage")


class _Isolate(Exception):
    """An operation of a batch run without savepoints failed, and the batch was
    rolled back: run it again with one savepoint per operation, so only the
    failed one's writes are undone."""


class _Conflict(Exception):
    """The batch lost a lock conflict and was rolled back: run it again."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class WriteTx:
    """What an operation gets: the connection inside the open transaction, and a
    place to say what to announce once the transaction commits."""

    conn: Connection
    work_changed: bool = False
    new_events: list[JobEvent] = field(default_factory=list)
    # Whose the new events' jobs are, where the operation knew (`feed.seal`).
    subjects: dict[str, JobSubject] = field(default_factory=dict)

    def announce_work(self) -> None:
        self.work_changed = True

    def announce_events(
        self, events: list[JobEvent], subjects: Mapping[str, JobSubject] | None = None
    ) -> None:
        self.new_events.extend(events)
        if subjects:
            self.subjects.update(subjects)


WriteOp = Callable[[WriteTx], T]
Seal = Callable[[WriteTx, list[JobEvent], dict[str, JobSubject]], list[FeedEvent]]
# (whether work was made claimable, the committed events as the feed numbered them)
Tell = Callable[[bool, list[FeedEvent]], None]


@dataclass(frozen=True)
class OpGroup(Generic[ItemT, T]):
    """One operation that many callers may ask for at once. `run` gets the items
    of every caller in the batch and returns, for each, its result or the
    exception to raise to that caller (an answer, not a failure: the others'
    writes stand). If `run` itself raises, each item is run alone instead, so
    only its own caller sees the error."""

    name: str
    run: Callable[[WriteTx, list[ItemT]], list[T | Exception]]


@dataclass
class _Pending:
    op: WriteOp[Any] | None
    future: asyncio.Future[Any]
    group: OpGroup[Any, Any] | None = None
    item: Any = None


@dataclass
class _BatchOutcome:
    """What a batch did, handed from the writer thread back to the event loop."""

    results: list[tuple[_Pending, Any]] = field(default_factory=list)
    errors: list[tuple[_Pending, BaseException]] = field(default_factory=list)
    work_changed: bool = False
    # The batch's events, numbered in their owners' feeds.
    new_events: list[FeedEvent] = field(default_factory=list)
    # Operations waiting for work that this batch did not run (it made none, or
    # failed): they wait on for the next one.
    unused: list[_Pending] = field(default_factory=list)
    # Whether a writable database answered (a COMMIT went through), or could
    # not be reached; None when the batch says neither.
    reached: bool | None = None


class WaitingOp(Generic[T]):
    """An operation handed to `run_on_next_work`: wait on `result`, or
    `withdraw` it."""

    def __init__(self, writer: GroupCommitWriter, pending: _Pending) -> None:
        self._writer = writer
        self._pending = pending

    async def result(self) -> T:
        """What the operation returned, once the batch that ran it committed."""
        return await asyncio.shield(self._pending.future)  # type: ignore[no-any-return]

    async def withdraw(self) -> T | None:
        """Stop waiting. None if the operation had not run; if a batch already
        took it, that batch's outcome (its result, or its error) is returned,
        never dropped: what it wrote is committed or rolled back as one."""
        return await self._writer._withdraw(self._pending)


class GroupCommitWriter:
    def __init__(
        self,
        engine: Engine,
        changes: ChangeHub,
        dialect: SqlDialect,
        max_batch: int = 256,
        announce: Announce | None = None,
        seal: Seal = lambda tx, events, subjects: [],
        tell: Tell | None = None,
        reachability: Reachability | None = None,
    ) -> None:
        """`seal` numbers and writes a batch's events, after all of its
        operations and just before its COMMIT (`operations.feed.seal`).
        `tell` is called on the event loop after a COMMIT that made work or
        events, for transports that cannot ride in the transaction as
        `announce` does (the sibling bus)."""
        self._engine = engine
        self._seal = seal
        self._changes = changes
        self._dialect = dialect
        self._begin_statement = dialect.begin_statement
        self._pacing = dialect.pacing()
        self._announce = announce
        self._tell = tell
        self._reachability = reachability
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # Operations waiting for work (run_on_next_work), in arrival order, and
        # those a batch in the thread's hands holds.
        self._waiting: list[_Pending] = []
        self._in_flight: set[int] = set()
        self._withdrawn: set[int] = set()
        # The connection lives in, and is only ever touched by, this one thread.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leasehold-writer")
        self._conn: Connection | None = None
        # How many connections the writer has opened: a new one starts afresh
        # (a SQLite data version, say, is counted per connection).
        self.connections_opened = 0
        self._closed = False
        self._thread_released = False

    async def run(self, op: WriteOp[T]) -> T:
        """Run `op` in the next batch; returns after its transaction committed.

        `op` runs on the writer thread: it must only use `tx.conn` and its own
        arguments, never the event loop."""
        return await self._submit(_Pending(op, asyncio.get_running_loop().create_future()))

    async def run_grouped(self, group: OpGroup[ItemT, T], item: ItemT) -> T:
        """Run `group` for `item`, together with the other items of the same
        group in the next batch; returns after the transaction committed."""
        future = asyncio.get_running_loop().create_future()
        return await self._submit(_Pending(None, future, group, item))

    def run_on_next_work(self, op: WriteOp[T]) -> WaitingOp[T]:
        """Run `op` inside the next batch that makes work claimable (an enqueue,
        a retry, a lease given back), after that batch's own operations and in
        its transaction, so what `op` does commits with them."""
        if self._closed:
            raise StorageClosed("storage is shutting down")
        pending = _Pending(op, asyncio.get_running_loop().create_future())
        self._waiting.append(pending)
        return WaitingOp(self, pending)

    async def _withdraw(self, pending: _Pending) -> Any:
        if pending in self._waiting:
            self._waiting.remove(pending)
            return None
        if id(pending) in self._in_flight:
            self._withdrawn.add(id(pending))
        # Taken by a batch (or closed): its outcome decides.
        return await asyncio.shield(pending.future)

    async def _submit(self, pending: _Pending) -> Any:
        if self._closed:
            raise StorageClosed("storage is shutting down")
        if self._task is None or self._task.done():
            # First use, or the loop died of a bug: a fresh loop serves the queue.
            # Its own (empty) context: not the log context of the call that started it.
            self._task = asyncio.create_task(
                self._loop(), name="leasehold-writer", context=contextvars.Context()
            )
        self._queue.put_nowait(pending)
        return await pending.future

    async def on_connection(self, call: Callable[[Connection], T]) -> T:
        """Run `call` with the writer's connection, on the writer's thread, outside
        any transaction (between batches): for a dialect's cheap looks at the
        database, such as SQLite's data version."""
        if self._closed:
            raise StorageClosed("storage is shutting down")
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._call_on_connection, call)

    async def close(self) -> None:
        """Commit what is queued, then stop. Even if this call is cancelled, the
        writer finishes the batch in hand, answers its callers and lets go of
        the connection."""
        self._closed = True
        waiting, self._waiting = self._waiting, []
        for item in waiting:
            _settle(item.future, error=StorageClosed("storage is shutting down"))
        if self._task is None or self._task.done():
            await self._release_thread()
            return
        self._queue.put_nowait(None)
        await asyncio.shield(self._task)

    async def _loop(self) -> None:
        try:
            await self._serve_queue()
        finally:
            # Nobody is left waiting on a write that will never be made.
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not None:
                    _settle(item.future, error=StorageClosed("storage is shutting down"))
            if self._closed:
                for item in self._waiting:
                    _settle(item.future, error=StorageClosed("storage is shutting down"))
                self._waiting.clear()
                await self._release_thread()

    async def _release_thread(self) -> None:
        if self._thread_released:
            return
        self._thread_released = True
        loop = asyncio.get_running_loop()
        await asyncio.shield(loop.run_in_executor(self._thread, self._drop_connection))
        self._thread.shutdown(wait=False)

    async def _serve_queue(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            idle_from = time.monotonic()
            first = await self._queue.get()
            try:
                await self._pacing.before_batch(time.monotonic() - idle_from)
            except asyncio.CancelledError:
                if first is not None:
                    _settle(first.future, error=StorageClosed("storage is shutting down"))
                raise
            if first is None:
                break
            batch = [first]
            while len(batch) < self._max_batch and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            live = [item for item in batch if not item.future.done()]
            if not live:
                continue
            began = time.monotonic()
            waiting, self._waiting = self._waiting, []
            self._in_flight.update(id(item) for item in waiting)
            committing = loop.run_in_executor(self._thread, self._commit_batch, live, waiting)
            try:
                outcome = await asyncio.shield(committing)
            except asyncio.CancelledError:
                # The batch is in the thread's hands and will be committed or not
                # regardless: wait for the outcome and answer its callers first.
                self._settle(await committing)
                raise
            self._pacing.after_batch(time.monotonic() - began)
            self._settle(outcome)

    def _settle(self, outcome: _BatchOutcome) -> None:
        if outcome.reached is not None and self._reachability is not None:
            self._reachability.report(outcome.reached)
        for item in outcome.unused:
            if id(item) in self._withdrawn or self._closed:
                _settle(item.future, result=None)
            else:
                self._waiting.append(item)
        self._in_flight.clear()
        self._withdrawn.clear()
        # Watchers first: their wake-ups go on the loop ahead of the callers',
        # so a batch's events are on their way out before any caller's answer
        # (a remote worker's is a gRPC send) takes the loop.
        if outcome.work_changed:
            self._changes.publish_work()
        if outcome.new_events:
            self._changes.publish_events(outcome.new_events)
        if self._tell is not None and (outcome.work_changed or outcome.new_events):
            self._tell(outcome.work_changed, outcome.new_events)
        for item, error in outcome.errors:
            _settle(item.future, error=error)
        for item, result in outcome.results:
            _settle(item.future, result=result)

    # ----- on the writer thread ------------------------------------------------------

    def _commit_batch(self, live: list[_Pending], waiting: list[_Pending]) -> _BatchOutcome:
        """A batch runs without savepoints first. A savepoint per operation
        costs two statements (on PostgreSQL, two round trips), and it only
        matters when an operation fails, which almost never happens. The rare
        batch where one fails is rolled back and run again with them."""
        attempts = self._dialect.conflict_attempts
        attempt, isolated = 1, False
        while True:
            try:
                return self._try_batch(live, waiting, isolated)
            except _Isolate:
                isolated = True
            except _Conflict as conflict:
                if attempt == attempts:
                    return self._failed(live, conflict.error, unused=waiting)
                log.info("storage.write_conflict", attempt=attempt, error=str(conflict.error))
                # The other side needs a moment to finish with the rows.
                time.sleep(random.uniform(0, 0.002 * attempt))
                attempt += 1

    def _try_batch(self, live: list[_Pending], waiting: list[_Pending], isolated: bool) -> _BatchOutcome:
        outcome = _BatchOutcome()
        try:
            conn = self._begin()
        except Exception as exc:  # the database refused to start a transaction
            return self._failed(live, exc, unused=waiting)

        succeeded: list[tuple[WriteTx, list[tuple[_Pending, Any]]]] = []
        refused: list[tuple[_Pending, Exception]] = []
        shared = len(live) > 1 or bool(waiting)
        use_savepoints = isolated and shared
        entries = deque(_entries(live))
        # Operations waiting for work run last, and only if the batch made some.
        to_wait = waiting
        while entries or to_wait:
            if not entries:
                if not any(tx.work_changed for tx, _ in succeeded):
                    break
                entries.extend([item] for item in to_wait)
                to_wait = []
                continue
            entry = entries.popleft()
            tx = WriteTx(conn)
            try:
                if use_savepoints:
                    _driver_sql(conn, "SAVEPOINT op")
                answers = _run_entry(tx, entry)
                if use_savepoints:
                    _driver_sql(conn, "RELEASE SAVEPOINT op")
            except Exception as exc:
                if self._dialect.is_write_conflict(exc):
                    # Earlier entries of this batch hold locks the other side
                    # waits for: only rolling all of it back lets that side on.
                    self._rollback()
                    raise _Conflict(exc) from exc
                if shared and not isolated:
                    self._rollback()
                    raise _Isolate from exc
                if use_savepoints and self._rollback_savepoint(conn):
                    if len(entry) > 1:  # a group: find whose item it was
                        entries.extendleft([item] for item in reversed(entry))
                    else:
                        refused.append((entry[0], exc))
                    continue
                # No savepoint to fall back to: the whole transaction goes.
                self._rollback()
                culprit = entry[0] if len(entry) == 1 else None
                return self._failed(live, exc, culprit=culprit, unused=waiting)
            succeeded.append((tx, answers))
        outcome.unused = to_wait

        events: list[JobEvent] = []
        subjects: dict[str, JobSubject] = {}
        for committed, _answers in succeeded:
            outcome.work_changed |= committed.work_changed
            events.extend(committed.new_events)
            subjects.update(committed.subjects)
        if events:
            try:
                outcome.new_events = self._seal(WriteTx(conn), events, subjects)
            except Exception as exc:
                self._rollback()
                if self._dialect.is_write_conflict(exc):
                    raise _Conflict(exc) from exc
                return self._failed(live, exc, unused=waiting)
        try:
            commit = "COMMIT"
            if self._announce is not None and (outcome.work_changed or events):
                job_ids = list(dict.fromkeys(event.job_id for event in events))
                owners = dict.fromkeys(numbered.subject.owner_id for numbered in outcome.new_events)
                commit = (
                    self._announce(outcome.work_changed, job_ids, [feed_key(owner) for owner in owners])
                    + commit
                )
            conn.exec_driver_sql(commit)
        except Exception as exc:
            self._rollback()
            if _is_disconnect(exc):
                return _outcome_unknown(live, waiting)
            return self._failed(live, exc, unused=waiting)
        outcome.reached = True

        outcome.errors = [(item, translate_storage_error(error)) for item, error in refused]
        for _committed, answers in succeeded:
            for item, answer in answers:
                if isinstance(answer, Exception):
                    outcome.errors.append((item, answer))
                else:
                    outcome.results.append((item, answer))
        return outcome

    def _begin(self) -> Connection:
        """Open the batch's transaction. A held connection found broken (the
        database restarted or dropped it since the last batch) is replaced at
        once, rather than failing a batch that has not touched anything yet."""
        for attempt in (1, 2):
            reused = self._conn is not None
            try:
                conn = self._connection()
                conn.exec_driver_sql(self._begin_statement)
                return conn
            except Exception as exc:
                self._drop_connection()
                if attempt == 2 or not reused or not _is_disconnect(exc):
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _rollback_savepoint(conn: Connection) -> bool:
        try:
            _driver_sql(conn, "ROLLBACK TO SAVEPOINT op")
            _driver_sql(conn, "RELEASE SAVEPOINT op")
            return True
        except Exception:
            # Some errors (disk full, I/O) make SQLite roll back the whole
            # transaction, taking the savepoint with it.
            return False

    @staticmethod
    def _failed(
        items: list[_Pending],
        exc: Exception,
        culprit: _Pending | None = None,
        unused: list[_Pending] | None = None,
    ) -> _BatchOutcome:
        """Every caller of a batch that did not commit gets an error. The operation
        that caused it gets its own; its neighbours get the storage error, or a
        retryable one when the cause was that operation alone. Operations waiting
        for work wait on (nothing of theirs was committed), unless one of them
        was the cause."""
        error = translate_storage_error(exc)
        if error is not exc:
            log.warning("storage.write_failed", error=str(error))
        neighbours_error = (
            error
            if isinstance(error, StorageUnavailable | StorageFull)
            else StorageUnavailable("write batch aborted; retry")
        )
        waiting = [item for item in unused or () if item is not culprit]
        blamed = [culprit] if culprit is not None and culprit not in items else []
        return _BatchOutcome(
            errors=[
                (item, error if item is culprit or culprit is None else neighbours_error)
                for item in (*items, *blamed)
            ],
            unused=waiting,
            reached=False if is_connection_failure(exc) else None,
        )

    def _rollback(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.exec_driver_sql("ROLLBACK")
        except Exception:
            # Either nothing was open (SQLite rolled back by itself) or the
            # connection is broken; a fresh connection settles both.
            self._drop_connection()

    def _call_on_connection(self, call: Callable[[Connection], T]) -> T:
        try:
            return call(self._connection())
        except Exception as exc:
            self._drop_connection()
            raise translate_storage_error(exc) from exc

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self._engine.connect()
            self.connections_opened += 1
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.invalidate()
            with contextlib.suppress(Exception):
                conn.close()


def _outcome_unknown(live: list[_Pending], waiting: list[_Pending]) -> _BatchOutcome:
    """The connection broke with the COMMIT on its way: the database may have
    applied the batch or not, and this side cannot tell. Its callers hear just
    that, never a guess either way. Operations waiting for work wait on: a
    claim that did commit holds its jobs until their leases lapse."""
    log.warning("storage.commit_outcome_unknown", operations=len(live))
    error = CommitOutcomeUnknown(
        "the database connection broke during COMMIT, so this write may or may not have been "
        "applied; send it again (with the same request_id it is applied once)"
    )
    return _BatchOutcome(errors=[(item, error) for item in live], unused=waiting, reached=False)


def _is_disconnect(exc: BaseException) -> bool:
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def _driver_sql(conn: Connection, statement: str) -> None:
    """A savepoint statement, straight to the driver: it takes no parameters and
    returns nothing, and SQLAlchemy's execution machinery would cost several
    times what SQLite spends on it. Errors are the driver's own, which
    `translate_storage_error` and `is_write_conflict` read just the same."""
    conn.connection.driver_connection.execute(statement)  # type: ignore[union-attr]


def _entries(batch: list[_Pending]) -> list[list[_Pending]]:
    """The batch as units of work, in queue order: each plain operation alone,
    and each group's items together at the place of the group's first item.
    Callers whose calls were queued together were concurrent, so any order
    among them is one they could have seen."""
    entries: list[list[_Pending]] = []
    groups: dict[str, list[_Pending]] = {}
    for item in batch:
        if item.group is None:
            entries.append([item])
        elif item.group.name in groups:
            groups[item.group.name].append(item)
        else:
            groups[item.group.name] = [item]
            entries.append(groups[item.group.name])
    return entries


def _run_entry(tx: WriteTx, entry: list[_Pending]) -> list[tuple[_Pending, Any]]:
    first = entry[0]
    if first.group is None:
        assert first.op is not None
        return [(first, first.op(tx))]
    answers = first.group.run(tx, [item.item for item in entry])
    return list(zip(entry, answers, strict=True))


def _settle(future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
