"""Shared pieces of the process-level reliability experiments (kill -9 trials,
concurrent claimers, clock jumps): direct, read-only looks at the database on
either engine, and a strict reader of a job's event log that turns it into the
history of its attempts.

The reader is the heart of both experiments' "no job ran under two valid leases"
claim: a job's log must alternate `job.started {attempt: k}` with exactly one
closing event for that attempt, so a claim that handed the job to a second worker
while the first still held it shows up as two `job.started` in a row (or as a
closing event for an attempt that was never started) and fails the parse.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from leasehold._server.jobs.sql.engines import flavour_of, parse_database_url
from tests import database_reads
from tests.system.helpers import sqlite_path

# Events that end an attempt, and whether they end the job too.
CLOSING_EVENTS = {
    "job.succeeded": True,
    "job.failed": True,
    "job.cancelled": True,
    "job.retry_scheduled": False,
    "job.lease_expired": False,
    "job.released": False,
}
TERMINAL_EVENTS = frozenset(name for name, terminal in CLOSING_EVENTS.items() if terminal)


@dataclass(frozen=True)
class LoggedEvent:
    """One row of `job_events`, times in seconds since the epoch."""

    sequence: int
    type: str
    payload: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class Attempt:
    """One attempt as the event log tells it: who closed it and when."""

    number: int
    started_at: float
    closed_by: str
    closed_at: float


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection: it never checkpoints or deletes the WAL on close, so
    looking at a crashed file leaves it exactly as the crash left it for the next
    server to recover."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        conn.row_factory = sqlite3.Row
        yield conn
    finally:
        conn.close()


def integrity_check(path: Path) -> str:
    """`PRAGMA integrity_check` of a SQLite file ('ok' when sound)."""
    with read_only(path) as conn:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    return "\n".join(str(row[0]) for row in rows)


def is_postgres(database_url: str) -> bool:
    return flavour_of(parse_database_url(database_url)) == "postgresql"


def storage_check(database_url: str) -> str:
    """The engine's own check of its storage ('ok' when sound). SQLite: `PRAGMA
    integrity_check` of the file (a crash mid-write must not have torn a page).
    PostgreSQL: amcheck's `bt_index_check(index, heapallindexed => true)` over
    every B-tree index of the schema, which also proves every row is in every
    index (so the unique resource-key and sequence indexes really hold); the
    extension ships with PostgreSQL. A client's crash cannot tear PostgreSQL's
    pages, but a server bug could leave a duplicate behind a unique index that
    a plain query would not notice."""
    if not is_postgres(database_url):
        return integrity_check(sqlite_path(database_url))
    # One transaction, never committed: the extension is gone again afterwards,
    # so the check leaves the database as it found it.
    engine = sa.create_engine(database_reads.sync_url(database_url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS amcheck")
            indexes = conn.exec_driver_sql(
                "SELECT c.relname, bt_index_check(c.oid, true) IS NULL FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indexrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " JOIN pg_am a ON a.oid = c.relam"
                " WHERE n.nspname = current_schema() AND a.amname = 'btree'"
            ).all()
    finally:
        engine.dispose()
    # bt_index_check raises on the first corruption it finds; returning at all is "ok".
    assert indexes, "no index was checked"
    return "ok"


def job_rows(database_url: str) -> dict[str, dict[str, Any]]:
    """Every job row, lease columns included, keyed by id."""
    found = database_reads.rows(
        database_url,
        "SELECT id, status, attempt, max_attempts, lease_owner, lease_token, lease_expires_at,"
        " last_event_sequence FROM jobs",
    )
    return {row["id"]: row for row in found}


def event_logs(database_url: str) -> dict[str, list[LoggedEvent]]:
    """Every job's event log, in sequence order, read in one query."""
    logs: dict[str, list[LoggedEvent]] = defaultdict(list)
    found = database_reads.rows(
        database_url,
        "SELECT job_id, sequence, type, payload, created_at FROM job_events ORDER BY job_id, sequence",
    )
    for row in found:
        logs[row["job_id"]].append(
            LoggedEvent(
                sequence=int(row["sequence"]),
                type=row["type"],
                payload=dict(database_reads.json_column(row["payload"])),
                created_at=int(row["created_at"]) / 1_000_000,
            )
        )
    return dict(logs)


def consistency_problems(rows: dict[str, dict[str, Any]], logs: dict[str, list[LoggedEvent]]) -> list[str]:
    """What the job rows and the event logs disagree on, at any moment between
    commits (a crash included): each row's `last_event_sequence` is the length of
    its gap-free log, no log belongs to a missing job, and a row holds a lease
    exactly when it is running. A commit that was torn in two (the row without
    its events, or the reverse) shows up here."""
    problems = [f"events of unknown job {job_id}" for job_id in set(logs) - set(rows)]
    for job_id, row in rows.items():
        sequences = [event.sequence for event in logs.get(job_id, [])]
        if sequences != list(range(1, len(sequences) + 1)):
            problems.append(f"{job_id}: log sequences {sequences}")
        if row["last_event_sequence"] != len(sequences):
            problems.append(f"{job_id}: last_event_sequence {row['last_event_sequence']} of {len(sequences)}")
        leased = row["lease_token"] is not None and row["lease_expires_at"] is not None
        if leased != (row["status"] == "running"):
            problems.append(f"{job_id}: status {row['status']} with lease token {row['lease_token']!r}")
    return problems


def attempt_history(job_id: str, events: list[LoggedEvent]) -> list[Attempt]:
    """Parse a job's log into its attempts, failing on anything that would mean
    two attempts overlapped or one was closed twice or never:

    - sequences are 1, 2, 3 … without gaps, and the first event is `job.queued`;
    - every `job.started {attempt: k}` is followed by exactly one closing event
      for attempt k (handler events may come between) before the next
      `job.started`; closing events that carry an attempt name k;
    - attempts count up by one, except after `job.released`, which hands the
      attempt back uncounted so the next start reuses its number;
    - at most one terminal event, and nothing after it;
    - a job of a graph is settled by its parents (`job.dependencies_met`, or
      `job.dependency_failed` then `job.cancelled`) before any attempt.
    """
    where = f"job {job_id}: {[(e.sequence, e.type, e.payload) for e in events]}"
    assert [e.sequence for e in events] == list(range(1, len(events) + 1)), f"sequence gap in {where}"
    assert events and events[0].type == "job.queued", f"log does not start with job.queued: {where}"
    attempts: list[Attempt] = []
    open_attempt: tuple[int, float] | None = None
    next_number = 1
    finished = False
    for event in events[1:]:
        assert not finished, f"event after the terminal event: {where}"
        if event.type == "job.started":
            assert open_attempt is None, f"attempt started while attempt {open_attempt[0]} held it: {where}"
            number = int(event.payload["attempt"])
            assert number == next_number, f"attempt {number} started, expected {next_number}: {where}"
            open_attempt = (number, event.created_at)
        elif event.type in ("job.dependencies_met", "job.dependency_failed"):
            # A job of a graph: its parents settle it before it ever starts.
            assert open_attempt is None and not attempts, f"{event.type} after an attempt began: {where}"
        elif event.type in CLOSING_EVENTS:
            if event.type == "job.cancelled" and open_attempt is None:
                finished = True  # cancelled while queued: no attempt to close
                continue
            assert open_attempt is not None, f"{event.type} closes no running attempt: {where}"
            number, started_at = open_attempt
            if "attempt" in event.payload:
                assert int(event.payload["attempt"]) == number, f"{event.type} names another attempt: {where}"
            attempts.append(Attempt(number, started_at, event.type, event.created_at))
            open_attempt = None
            next_number = number if event.type == "job.released" else number + 1
            finished = event.type in TERMINAL_EVENTS
        else:
            assert not event.type.startswith("job."), f"unexpected service event {event.type}: {where}"
            assert open_attempt is not None, f"handler event outside an attempt: {where}"
    return attempts


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (share in 0..1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(share * len(ordered))) - 1]


def wait_for_other_sessions_to_end(database_url: str, timeout: float = 30.0) -> int:
    """PostgreSQL: wait until no session but this one is connected to the
    database; returns how many there were at first (SQLite: nothing to wait
    for, 0). After a client's SIGKILL its server-side sessions live on until
    they read the closed socket, and a COMMIT the client had sent just before
    dying can still be carried out then: only once they are gone is the
    database in the state the crash left it, for good."""
    if not is_postgres(database_url):
        return 0
    statement = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    first = int(database_reads.scalar(database_url, statement))
    deadline = time.monotonic() + timeout
    while (left := int(database_reads.scalar(database_url, statement))) > 0:
        assert time.monotonic() < deadline, f"{left} sessions still connected after {timeout} s"
        time.sleep(0.02)
    return first
