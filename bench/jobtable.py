"""The bench's own look at Leasehold's `jobs` table, on SQLite or PostgreSQL alike.

The serve-process figures need three things from the database that no API offers: how many jobs
have succeeded (to know when to stop waiting), the server's own stamps of the first claim and
the last completion (the figure), and a way to make pre-seeded jobs due at one chosen instant
(the start gate of bench.figures.serve_drain). Timestamps are integer microseconds since the
Unix epoch (server.jobs.sql.tables.UtcTimestamp) on both engines, so the same statements serve
both; only the parameter marker differs.

One connection per measurement, in autocommit mode, so a poll holds no transaction open (on
SQLite a reader never blocks the writer in WAL mode; on PostgreSQL it holds no snapshot).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.postgres import PgDatabase

# Far enough ahead that no run reaches it: "not due" for a job that is waiting for the gate.
NOT_YET_SECONDS = 30 * 86_400.0


def micros(wall: float) -> int:
    """`time.time()` seconds as the table's integer microseconds."""
    return int(wall * 1_000_000)


class JobTable:
    def __init__(self, database: Path | PgDatabase) -> None:
        self._conn: Any
        if isinstance(database, PgDatabase):
            self.engine = "postgresql"
            self._conn = psycopg.connect(database.conninfo, autocommit=True)
            self._mark = "%s"
        else:
            self.engine = "sqlite"
            self._conn = sqlite3.connect(database, timeout=10, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout=10000")
            self._mark = "?"

    def _one(self, statement: str, *args: Any) -> Any:
        return self._conn.execute(statement.replace("?", self._mark), args).fetchone()

    def status_count(self, status: str) -> int:
        return int(self._one("SELECT count(*) FROM jobs WHERE status = ?", status)[0])

    def status_counts(self) -> dict[str, int]:
        """How many jobs are in each status (for a message that says where a drain got stuck)."""
        rows = self._conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
        return {str(status): int(count) for status, count in rows}

    def lease_owners(self, status: str) -> dict[str, int]:
        """How many jobs in `status` each worker id holds a lease on."""
        rows = self._conn.execute(
            "SELECT lease_owner, count(*) FROM jobs WHERE status = ? GROUP BY lease_owner".replace(
                "?", self._mark
            ),
            (status,),
        ).fetchall()
        return {str(owner): int(count) for owner, count in rows}

    def max_attempt(self) -> int:
        """The most attempts any job has had (1: every job ran exactly once)."""
        return int(self._one("SELECT coalesce(max(attempt), 0) FROM jobs")[0])

    def succeeded_window(self) -> tuple[int, float | None, float | None]:
        """(succeeded jobs, the earliest `started_at` and the latest `completed_at` among them,
        as wall-clock seconds): the first claim and the last completion, as the server stamped
        them inside its own transactions."""
        count, first, last = self._one(
            "SELECT count(*), min(started_at), max(completed_at) FROM jobs WHERE status = ?", "succeeded"
        )
        return (
            int(count),
            None if first is None else int(first) / 1e6,
            None if last is None else int(last) / 1e6,
        )

    def stamps(self) -> dict[str, tuple[int | None, int | None, int]]:
        """Every job's (`started_at`, `completed_at`, `attempt`), by id: the server's own
        integer-microsecond stamps of its last claim and of its ending."""
        rows = self._conn.execute("SELECT id, started_at, completed_at, attempt FROM jobs").fetchall()
        return {
            str(job_id): (
                None if started is None else int(started),
                None if completed is None else int(completed),
                int(attempt),
            )
            for job_id, started, completed, attempt in rows
        }

    def start_delays(self) -> dict[str, float]:
        """Each started job's `started_at` minus its `created_at`, in seconds, by id: the
        server's own stamps of the Enqueue's commit and of the claim that started it."""
        rows = self._conn.execute(
            "SELECT id, started_at - created_at FROM jobs WHERE started_at IS NOT NULL"
        ).fetchall()
        return {str(job_id): int(delay) / 1e6 for job_id, delay in rows}

    def event_count(self, event_type: str) -> int:
        """How many events of `event_type` the jobs' logs hold."""
        return int(self._one("SELECT count(*) FROM job_events WHERE type = ?", event_type)[0])

    def make_due(self, wall: float) -> int:
        """Every queued job becomes due at `wall` (time.time() seconds), in one statement;
        returns how many. `updated_at` is left alone on purpose: the server re-anchors queued
        jobs whose `updated_at` lies in the future (it takes that for a clock step)."""
        cursor = self._conn.execute(
            "UPDATE jobs SET available_at = ? WHERE status = ?".replace("?", self._mark),
            (micros(wall), "queued"),
        )
        return int(cursor.rowcount)

    def hold_back(self) -> int:
        """Every queued job becomes due only in a month: seeded work waits for make_due()."""
        return self.make_due(time.time() + NOT_YET_SECONDS)

    def vacuum(self) -> None:
        """PostgreSQL: clear the dead row versions a whole-table UPDATE leaves and refresh the
        planner's statistics, so the drain starts on a table as tidy as a freshly seeded one.
        SQLite updates rows in place: nothing to do."""
        if self.engine == "postgresql":
            self._conn.execute("VACUUM (ANALYZE) jobs")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> JobTable:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
