"""Holding one replica inside its open transaction, to make an interleaving
of two replicas on one PostgreSQL database rather than hope for it.

A `Hold` stops the first writer thread whose call of a `SqlRows` method
matches, right after its statement ran (so with every lock the statement took),
until the test releases it; `blocked_behind` then waits until PostgreSQL
reports the other replica's call blocked behind that session
(`pg_blocking_pids`). Two `SqlJobRepository` instances on one database are two
replicas, each with its own writer thread and connection.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.sql.rows import SqlRows
from tests.conftest import Postgres

# Bounds on waiting for a signal; never a measure of anything.
SIGNAL_TIMEOUT = 20.0


@dataclass
class Hold:
    """Stops the first writer thread whose call of a `SqlRows` method matches,
    right after the statement ran, inside its still open transaction (so with
    every lock it took), until `release()`. Knows that session's backend pid,
    for `pg_blocking_pids`."""

    matches: Callable[..., bool]
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    backend_pid: int | None = None
    _taken: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, rows: SqlRows, *args: Any) -> None:
        with self._lock:
            if self._taken or not self.matches(*args):
                return
            self._taken = True
        self.backend_pid = rows._conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        self.reached.set()
        if not self.go.wait(SIGNAL_TIMEOUT * 2):
            raise RuntimeError("the test never released its hold")

    async def wait_reached(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, SIGNAL_TIMEOUT), "the held call never got there"

    def release(self) -> None:
        self.go.set()


async def blocked_behind(postgres: Postgres, holder_pid: int | None, call: asyncio.Future[Any]) -> bool:
    """Wait until a session is blocked behind `holder_pid` (True), or `call` is
    done without ever blocking (False: what a mutant does)."""
    assert holder_pid is not None
    deadline = time.monotonic() + SIGNAL_TIMEOUT
    with postgres.cluster.connect() as conn:
        while time.monotonic() < deadline:
            found = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (holder_pid,)
            ).fetchone()
            if found is not None and found[0] > 0:
                return True
            if call.done():
                return False
            await asyncio.sleep(0.005)
    raise AssertionError(f"no session blocked behind {holder_pid} and the call did not end")


@dataclass
class Replicas:
    a: SqlJobRepository
    b: SqlJobRepository
    url: str
