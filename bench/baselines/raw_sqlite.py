"""Baseline 2: raw `sqlite3` claim+complete pairs/s, the floor under any Python job queue on SQLite.

Set-up (not timed): a fresh file in WAL mode with synchronous=FULL, a `jobs` table shaped like
Leasehold's (integer `seq` primary key, text id, owner, kind, JSON payload text, status, attempt,
available_at, lease columns, timestamps as integer microseconds) with the same index idea
(status, available_at, seq) plus (status, lease_expires_at) and (owner_id, seq), and `queued`
queued rows inserted in one transaction.

The timed loop, on one connection in autocommit mode, `pairs` times (after `warmup` untimed pairs):

1. claim, one transaction: `BEGIN IMMEDIATE`; `UPDATE jobs SET status='running',
   attempt=attempt+1, lease_owner, lease_token (fresh uuid4 hex), lease_expires_at=now+30 s,
   updated_at, started_at=COALESCE(started_at, now) WHERE seq = (SELECT seq FROM jobs WHERE
   status='queued' AND available_at <= now ORDER BY available_at, seq LIMIT 1) RETURNING id,
   payload`; `COMMIT`;
2. complete, one autocommit statement (its own transaction): `UPDATE jobs SET
   status='succeeded', completed_at, updated_at, lease columns NULL WHERE id=? AND
   status='running' AND lease_token=?` (fenced by the token like Leasehold's).

No events are written (Leasehold writes `job.started` and `job.succeeded` rows too), no expired
leases are looked for: this is the least a claim and a completion can cost, two fsyncs a pair.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

SCHEMA = (
    "CREATE TABLE jobs (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, owner_id TEXT NOT NULL,"
    " kind TEXT NOT NULL, payload TEXT NOT NULL, status TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0,"
    " available_at INTEGER NOT NULL, lease_owner TEXT, lease_token TEXT, lease_expires_at INTEGER,"
    " created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, started_at INTEGER, completed_at INTEGER)",
    "CREATE INDEX ix_jobs_status_available_at ON jobs (status, available_at, seq)",
    "CREATE INDEX ix_jobs_status_lease_expires_at ON jobs (status, lease_expires_at)",
    "CREATE INDEX ix_jobs_owner_id_seq ON jobs (owner_id, seq)",
)
CLAIM = (
    "UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = ?, lease_token = ?,"
    " lease_expires_at = ?, updated_at = ?, started_at = COALESCE(started_at, ?)"
    " WHERE seq = (SELECT seq FROM jobs WHERE status = 'queued' AND available_at <= ?"
    " ORDER BY available_at, seq LIMIT 1) RETURNING id, payload"
)
COMPLETE = (
    "UPDATE jobs SET status = 'succeeded', completed_at = ?, updated_at = ?, lease_owner = NULL,"
    " lease_token = NULL, lease_expires_at = NULL WHERE id = ? AND status = 'running' AND lease_token = ?"
)


def _now_us() -> int:
    return time.time_ns() // 1000


def _connect(database: str) -> sqlite3.Connection:
    conn = sqlite3.connect(database, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


def _seed(conn: sqlite3.Connection, queued: int) -> None:
    for statement in SCHEMA:
        conn.execute(statement)
    now = _now_us()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO jobs (id, owner_id, kind, payload, status, available_at, created_at, updated_at)"
        " VALUES (?, 'bench-owner', 'bench.noop', ?, 'queued', ?, ?, ?)",
        ((f"job_{uuid.uuid4().hex}", f'{{"n": {i}}}', now, now, now) for i in range(queued)),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _pair(conn: sqlite3.Connection) -> None:
    now = _now_us()
    token = uuid.uuid4().hex
    conn.execute("BEGIN IMMEDIATE")
    row = conn.execute(CLAIM, ("bench-raw", token, now + 30_000_000, now, now, now)).fetchone()
    conn.execute("COMMIT")
    if row is None:
        raise RuntimeError("raw sqlite: the queue ran dry")
    done = _now_us()
    if conn.execute(COMPLETE, (done, done, row[0], token)).rowcount != 1:
        raise RuntimeError("raw sqlite: completion did not match its claim")


def claim_complete_pairs(database: str, queued: int, pairs: int, warmup: int) -> dict[str, Any]:
    """Run in a child process: seed, then time `pairs` claim+complete pairs."""
    if warmup + pairs > queued:
        raise ValueError("more pairs than queued jobs")
    conn = _connect(database)
    try:
        _seed(conn, queued)
        for _ in range(warmup):
            _pair(conn)
        began = time.perf_counter()
        for _ in range(pairs):
            _pair(conn)
        seconds = time.perf_counter() - began
    finally:
        conn.close()
    return {"pairs": pairs, "seconds": seconds, "rate": pairs / seconds}
