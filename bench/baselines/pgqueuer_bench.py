"""The pgqueuer baseline: pgqueuer (on asyncpg, LISTEN/NOTIFY) draining N pre-enqueued no-op jobs
on the run's PostgreSQL cluster, timed exactly like Leasehold's serve-process drains
(bench.figures.serve_drain) so the two divide honestly.

* Template, once per run: pgqueuer's schema (`Queries.install()`, durable tables) and N
  `bench.noop` jobs through pgqueuer's batch enqueue (1,000 per call), each deferred by a month
  (`execute_after`) so that a consumer finds nothing due; then VACUUM (ANALYZE).
* Per round: a copy of the template; one consumer process, pgqueuer's own runner
  (`pgqueuer.run`, what `pgq run` calls; see bench.baselines.pgqueuer_app) with batch size B
  (pgqueuer's default, 10) and no concurrency limit (also its default); the start gate
  (bench.gate) makes every job due at T0 once it is up.
* Figure: N / (last completion - first claim), both pgqueuer's own stamps in `pgqueuer_log`:
  the earliest `created` of a `picked` row (its dequeue logs each pick, stamped NOW() of the
  dequeue transaction) and the latest `created` of a `successful` row (its completion buffer
  moves finished jobs to the log, stamped NOW() of that transaction). The bench polls the log
  every 100 ms only to know when to look.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench import gate
from bench.baselines.pgqueuer_app import DSN_ENV, NOOP, READY_ENV
from bench.common import BenchError, Measurement, tail, wait_until
from bench.jobtable import NOT_YET_SECONDS
from bench.postgres import BenchPostgres, PgDatabase
from bench.procs import interrupt, run_child, spawn

ENQUEUE_BATCH = 1_000
CHANNEL = "ch_pgqueuer"  # pgqueuer's default NOTIFY channel (no prefix)
START_TIMEOUT = 60.0


# ----- run inside a child process -----------------------------------------------------------------


async def seed(dsn: str, count: int) -> dict[str, Any]:
    """Install pgqueuer's schema and enqueue `count` deferred no-op jobs."""
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    began = time.monotonic()
    connection = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        later = timedelta(seconds=NOT_YET_SECONDS)
        for start in range(0, count, ENQUEUE_BATCH):
            n = min(ENQUEUE_BATCH, count - start)
            await queries.enqueue([NOOP] * n, [None] * n, [0] * n, [later] * n)
        await connection.execute("VACUUM (ANALYZE)")
    finally:
        await connection.close()
    return {"jobs": count, "seconds": time.monotonic() - began}


# ----- orchestration (in the bench process) -------------------------------------------------------


def template(postgres: BenchPostgres, directory: Path, count: int) -> str:
    def make(database: PgDatabase) -> None:
        run_child(
            directory,
            f"seed-pgqueuer-{count}",
            "bench.baselines.pgqueuer_bench:seed",
            {"dsn": database.dsn, "count": count},
            timeout=600,
        )

    return postgres.template(f"pgqueuer-noop-{count}", make)


class _Log:
    """pgqueuer's tables, seen from the bench."""

    def __init__(self, database: PgDatabase) -> None:
        self._conn = psycopg.connect(database.conninfo, autocommit=True)

    def make_due(self, wall: float) -> int:
        """The UPDATE, then (same transaction) the notification pgqueuer's own trigger sends for
        a row change: its trigger is statement-level and compares OLD with NEW, which are NULL
        there, so it stays silent for an UPDATE. Told of the change, the consumer looks again
        and sleeps until the earliest `execute_after`; untold, it would sleep out its 30 s
        dequeue timeout first (the figure would not change: it starts at the first claim)."""
        with self._conn.transaction():
            cursor = self._conn.execute(
                "UPDATE pgqueuer SET execute_after = to_timestamp(%s) WHERE status = 'queued'", (wall,)
            )
            self._conn.execute(
                "SELECT pg_notify(%s, json_build_object('channel', %s::text, 'operation', 'update',"
                " 'sent_at', NOW(), 'table', 'pgqueuer', 'type', 'table_changed_event')::text)",
                (CHANNEL, CHANNEL),
            )
        return int(cursor.rowcount)

    def vacuum(self) -> None:
        self._conn.execute("VACUUM (ANALYZE) pgqueuer")

    def window(self) -> tuple[int, int, float | None, float | None]:
        """(successful, failed, first pick, last success), stamps as epoch seconds."""
        row = self._conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'successful'),"
            " count(*) FILTER (WHERE status IN ('exception', 'failed')),"
            " extract(epoch FROM min(created) FILTER (WHERE status = 'picked')),"
            " extract(epoch FROM max(created) FILTER (WHERE status = 'successful'))"
            " FROM pgqueuer_log"
        ).fetchone()
        assert row is not None
        done, failed, first, last = row
        return (
            int(done),
            int(failed),
            None if first is None else float(first),
            None if last is None else float(last),
        )

    def close(self) -> None:
        self._conn.close()


def drain(directory: Path, database: PgDatabase, count: int, batch_size: int, timeout: float) -> Measurement:
    """Drain `database` (a fresh copy of the template holding `count` deferred jobs)."""
    ready = directory / "pgqueuer.ready"
    log_path = directory / "pgqueuer-drain.log"
    args = [sys.executable, "-m", "bench.baselines.pgqueuer_app", "--batch-size", str(batch_size)]
    consumer = spawn(args, log_path, {DSN_ENV: database.dsn, READY_ENV: str(ready)})
    log = _Log(database)
    try:

        def running() -> bool:
            if consumer.poll() is not None:
                raise BenchError(
                    f"the pgqueuer consumer exited with {consumer.returncode}:\n{tail(log_path)}"
                )
            return True

        wait_until(lambda: running() and ready.exists(), START_TIMEOUT, "the pgqueuer consumer to start")
        due = gate.release(log.make_due, log.vacuum, count)
        wait_until(
            lambda: running() and log.window()[0] >= count, timeout, "pgqueuer to drain its queue", 0.1
        )
        done, failed, first, last = log.window()
    finally:
        log.close()
        interrupt(consumer)
    if done != count or failed or first is None or last is None:
        raise BenchError(f"pgqueuer drain: {done} of {count} jobs succeeded, {failed} failed")
    seconds = last - first
    params = {
        "jobs": count,
        "batch_size": batch_size,
        "max_concurrent_tasks": "unlimited",
        "driver": "asyncpg",
        "processes": 1,
        "seconds": round(seconds, 3),
        "first_claim_after_due_ms": round((first - due) * 1000, 1),
    }
    return Measurement("baseline.pgqueuer.drain", count / seconds, "jobs/s", "baseline", params)
