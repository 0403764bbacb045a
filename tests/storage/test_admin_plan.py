"""AdminService's reads and bulk batches stay index walks: on 20,000 jobs of
which most finished more than an hour ago, every statement GetQueueStats,
ListAllJobs and one batch of BulkCancel / BulkRetry send is planned by each
database without a full scan of the jobs table (the statements really sent,
captured, as test_claim_plan does). Finished jobs are read by
ix_jobs_status_completed_at, a bulk batch by an index led by its status."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import event, text

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.admin import AdminFilter
from leasehold._server.jobs.records import JobFilter, JobStatus, NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from tests.storage.test_claim_plan import JOBS, OWNERS, _full_scans, _migrated, _plan, url  # noqa: F401

HOUR_US = 3_600_000_000


def _only(status: JobStatus, **fields: Any) -> AdminFilter:
    owner = fields.pop("owner_id", "")
    return AdminFilter(JobFilter(statuses=frozenset({status}), **fields), owner)


async def test_admin_statements_walk_indexes(url: str) -> None:  # noqa: F811
    await _migrated(url)
    engines = create_engines(url)
    clock = ManualClock()
    repository = SqlJobRepository(engines, clock)
    try:
        for start in range(0, JOBS, 1000):
            await repository.enqueue_batch(
                [
                    NewJob(owner_id=f"owner-{index % OWNERS:04d}", kind=f"kind.{index % 3}", payload={})
                    for index in range(start, start + 1000)
                ]
            )
        flavour = engines.dialect.name
        with engines.writer.begin() as conn:
            # Nine in ten finished two hours ago; of the rest, half finished (failed)
            # within the hour, a few run, the others stay queued.
            conn.execute(
                text(
                    "UPDATE jobs SET status = 'succeeded', completed_at = created_at - :two_hours"
                    " WHERE seq % 10 <> 0"
                ),
                {"two_hours": 2 * HOUR_US},
            )
            conn.execute(
                text("UPDATE jobs SET status = 'failed', completed_at = created_at WHERE seq % 20 = 0")
            )
            conn.execute(
                text(
                    "UPDATE jobs SET status = 'running', lease_expires_at = created_at + :two_hours"
                    " WHERE seq % 100 = 10"
                ),
                {"two_hours": 2 * HOUR_US},
            )
            if flavour == "postgresql":
                conn.exec_driver_sql("ANALYZE jobs")
        await repository.set_kind_paused("kind.2", True)
        sent: list[tuple[str, Any]] = []

        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
            if "jobs" in statement and statement.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH")):
                sent.append((statement, parameters))

        engines_watched = (engines.writer, engines.reader.sync_engine)
        for engine in engines_watched:
            event.listen(engine, "before_cursor_execute", capture)
        try:
            stats = await repository.queue_stats()
            for job_filter in (
                AdminFilter(),
                AdminFilter(owner_id="owner-0007"),
                _only(JobStatus.RUNNING),
                _only(JobStatus.QUEUED, kind="kind.1"),
            ):
                await repository.list_all_jobs(job_filter, 50, None)
            cancelled = await repository.bulk_cancel(
                _only(JobStatus.QUEUED, kind="kind.0"), None, 250, 30, False
            )
            retried = await repository.bulk_retry(_only(JobStatus.FAILED), None, 250, False)
        finally:
            for engine in engines_watched:
                event.remove(engine, "before_cursor_execute", capture)
        assert sum(kind.queued for kind in stats.kinds) == JOBS // 20 - JOBS // 100
        assert sum(kind.failed_last_hour for kind in stats.kinds) == JOBS // 20
        assert sum(kind.succeeded_last_hour for kind in stats.kinds) == 0
        assert [kind.kind for kind in stats.kinds if kind.paused] == ["kind.2"]
        assert cancelled.matched == len(cancelled.changed) == 250
        assert retried.matched == len(retried.changed) == 250

        plans = []
        with engines.writer.connect() as conn:
            for statement, parameters in sent:
                plans.append((statement, _plan(conn, flavour, statement, parameters)))
        for statement, plan in plans:
            if "WHERE 1 = 1 ORDER BY jobs.seq DESC" in statement:
                # Listing every job newest first: SQLite's walk of its rowid
                # order from the end, stopped by the LIMIT (a page), is no scan.
                continue
            assert not _full_scans(flavour, plan), "\n".join([statement, *plan])
        finished = [plan for statement, plan in plans if "completed_at >=" in statement]
        assert finished and all(
            any("ix_jobs_status_completed_at" in line for line in plan) for plan in finished
        )
        batches = [
            plan
            for statement, plan in plans
            if "ORDER BY jobs.seq DESC" in statement and "FOR UPDATE" in statement.upper()
        ]
        if flavour == "postgresql":
            assert len(batches) == 2
            for plan in batches:
                # A range of the one status's jobs (the planner picks which
                # status-led index), never the whole table.
                assert any(re.search(r"ix_jobs_status_\w+", line) for line in plan), "\n".join(plan)
    finally:
        await repository.close()
