"""Injected database faults (experiment 8), and how a client rides them out: a seeded share of the write
transactions' COMMITs fail as the engine would report them. SQLite: a busy
database or an I/O error. PostgreSQL: a lock not available, the server shutting
the session down, a connection that broke (no SQLSTATE), or a deadlock (which
the writer answers by running the whole batch again, so a rolled-back batch
must leave nothing behind that its rerun would then duplicate).

The fault is raised instead of the COMMIT statement, so the transaction is left
open and uncommitted exactly as after a real failed commit; the service must roll
it back and answer a retryable status. Nothing here touches the service's code:
the hook is a SQLAlchemy event listener on the `Engine` class, so it reaches the
engines a `leasehold serve` subprocess creates too. A subprocess loads it with
`--handlers tests.reliability.faults`, configured by environment:

    LEASEHOLD_TEST_COMMIT_FAULT_RATE   share of COMMITs that fail (0..1)
    LEASEHOLD_TEST_COMMIT_FAULT_SEED   seed for the choice of which ones

Only the service's write engine is affected, so migrations at start-up run clean.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from leasehold._server.jobs.sql.engines import WRITER_ENGINE_NAME
from leasehold.worker import HandlerRegistry

RATE_ENV = "LEASEHOLD_TEST_COMMIT_FAULT_RATE"
SEED_ENV = "LEASEHOLD_TEST_COMMIT_FAULT_SEED"

T = TypeVar("T")

# (sqlite_errorcode, sqlite_errorname, message) of the faults injected on SQLite.
_SQLITE_FAULTS = (
    (5, "SQLITE_BUSY", "database is locked"),
    (778, "SQLITE_IOERR_WRITE", "disk I/O error"),
)
# (SQLSTATE or None, message) of those injected on PostgreSQL, as psycopg raises them.
_POSTGRES_FAULTS = (
    ("55P03", 'could not obtain lock on row in relation "jobs"'),
    ("57P01", "terminating connection due to administrator command"),
    (None, "server closed the connection unexpectedly"),
    ("40P01", "deadlock detected"),
)


def _sqlite_error(choice: random.Random) -> Exception:
    code, name, message = choice.choice(_SQLITE_FAULTS)
    error = sqlite3.OperationalError(message)
    error.sqlite_errorcode = code  # type: ignore[attr-defined]
    error.sqlite_errorname = name  # type: ignore[attr-defined]
    return error


def _postgres_error(choice: random.Random) -> Exception:
    import psycopg  # noqa: PLC0415 - the PostgreSQL driver is an optional extra

    state, message = choice.choice(_POSTGRES_FAULTS)
    # psycopg's class for a SQLSTATE carries it as `.sqlstate`, as a server error would.
    cls = psycopg.OperationalError if state is None else psycopg.errors.lookup(state)
    return cls(message)


# Set on a writer connection whose open transaction sent `CommitFaults.only_after`.
_SENT_MARK = "commit_faults.sent"


@dataclass
class CommitFaults:
    """Fails a seeded `rate` of COMMITs; counts what it did. With `only_after`,
    only COMMITs of transactions that sent a statement starting so are counted
    and may fail: which writes share a commit depends on timing, and a rate over
    every commit can miss the writes an experiment is about."""

    rate: float
    seed: int
    only_after: str | None = None
    commits: int = 0
    injected: int = 0
    # What was injected, by SQLite error name or PostgreSQL SQLSTATE.
    kinds: Counter[str] = field(default_factory=Counter)
    _random: random.Random = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def before_cursor_execute(
        self, conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool
    ) -> None:
        if conn.engine.logging_name != WRITER_ENGINE_NAME:
            return
        if self.only_after is not None and statement.lstrip().startswith(self.only_after):
            conn.info[_SENT_MARK] = True
        # The writer's COMMIT, alone or after the NOTIFYs it carries on PostgreSQL.
        if not statement.rstrip().upper().endswith("COMMIT"):
            return
        if self.only_after is not None and not conn.info.pop(_SENT_MARK, False):
            return
        with self._lock:
            self.commits += 1
            if self._random.random() >= self.rate:
                return
            self.injected += 1
            if conn.engine.dialect.name == "postgresql":
                original = _postgres_error(self._random)
                kind = getattr(original, "sqlstate", None) or "no SQLSTATE"
            else:
                original = _sqlite_error(self._random)
                kind = original.sqlite_errorname  # type: ignore[attr-defined]
            self.kinds[kind] += 1
        raise OperationalError(statement, parameters, original)


@contextmanager
def commit_faults(rate: float, seed: int, only_after: str | None = None) -> Iterator[CommitFaults]:
    """Inject faults into every engine in this process while the block runs."""
    faults = CommitFaults(rate, seed, only_after)
    event.listen(Engine, "before_cursor_execute", faults.before_cursor_execute)
    event.listen(Engine, "rollback", _forget_sent)
    try:
        yield faults
    finally:
        event.remove(Engine, "before_cursor_execute", faults.before_cursor_execute)
        event.remove(Engine, "rollback", _forget_sent)


def _forget_sent(conn: Any) -> None:
    conn.info.pop(_SENT_MARK, None)


def register(_registry: HandlerRegistry) -> None:
    """`--handlers tests.reliability.faults`: arm the injection for the whole
    process life, from the environment. Registers no kinds."""
    rate = float(os.environ.get(RATE_ENV, "0"))
    if rate > 0:
        faults = CommitFaults(rate, int(os.environ.get(SEED_ENV, "0")))
        event.listen(Engine, "before_cursor_execute", faults.before_cursor_execute)


async def retry_unavailable(
    call: Callable[[], Awaitable[T]],
    statuses: Counter[str] | None = None,
    tries: int = 30,
    pause_seconds: float = 0.01,
) -> T:
    """What a well-behaved client of a retryable status does: run the RPC `call`,
    again after UNAVAILABLE and only after it, up to `tries` times (the last
    UNAVAILABLE is raised). Every status seen is counted in `statuses`, so an
    experiment can show which ones the faults produced."""
    counted: Counter[str] = Counter() if statuses is None else statuses
    for attempt in range(1, tries + 1):
        try:
            result = await call()
        except grpc.aio.AioRpcError as err:
            counted[err.code().name] += 1
            if err.code() is not grpc.StatusCode.UNAVAILABLE or attempt == tries:
                raise
            await asyncio.sleep(pause_seconds)
            continue
        counted["OK"] += 1
        return result
    raise AssertionError("tries must be at least 1")
