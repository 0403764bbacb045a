"""Shared pieces of the process-level reliability experiments (kill -9 trials and
concurrent claimers): direct, read-only looks at the SQLite file, and a strict
reader of a job's event log that turns it into the history of its attempts.

The reader is the heart of both experiments' "no job ran under two valid leases"
claim: a job's log must alternate `job.started {attempt: k}` with exactly one
closing event for that attempt, so a claim that handed the job to a second worker
while the first still held it shows up as two `job.started` in a row (or as a
closing event for an attempt that was never started) and fails the parse.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """`PRAGMA integrity_check` of the file ('ok' when sound)."""
    with read_only(path) as conn:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
    return "\n".join(str(row[0]) for row in rows)


def job_rows(path: Path) -> dict[str, dict[str, Any]]:
    """Every job row, lease columns included, keyed by id."""
    with read_only(path) as conn:
        rows = conn.execute(
            "SELECT id, status, attempt, max_attempts, lease_owner, lease_token, lease_expires_at,"
            " last_event_sequence FROM jobs"
        ).fetchall()
    return {row["id"]: dict(row) for row in rows}


def event_logs(path: Path) -> dict[str, list[LoggedEvent]]:
    """Every job's event log, in sequence order, read in one query."""
    logs: dict[str, list[LoggedEvent]] = defaultdict(list)
    with read_only(path) as conn:
        rows = conn.execute(
            "SELECT job_id, sequence, type, payload, created_at FROM job_events ORDER BY job_id, sequence"
        ).fetchall()
    for row in rows:
        payload = row["payload"]
        logs[row["job_id"]].append(
            LoggedEvent(
                sequence=int(row["sequence"]),
                type=row["type"],
                payload=json.loads(payload) if isinstance(payload, str) else dict(payload),
                created_at=int(row["created_at"]) / 1_000_000,
            )
        )
    return dict(logs)


def attempt_history(job_id: str, events: list[LoggedEvent]) -> list[Attempt]:
    """Parse a job's log into its attempts, failing on anything that would mean
    two attempts overlapped or one was closed twice or never:

    - sequences are 1, 2, 3 … without gaps, and the first event is `job.queued`;
    - every `job.started {attempt: k}` is followed by exactly one closing event
      for attempt k (handler events may come between) before the next
      `job.started`; closing events that carry an attempt name k;
    - attempts count up by one, except after `job.released`, which hands the
      attempt back uncounted so the next start reuses its number;
    - at most one terminal event, and nothing after it.
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
