"""GetStats and ListWorkers read index ranges (DESIGN §19): on 20,000 jobs of
200 owners, every statement an owner's counts and the remote workers' leases
send is planned by each database without a full scan of the jobs table (the
statements really sent, captured, as test_claim_plan does). An owner's counts
come from ix_jobs_owner_id_kind_status alone: SQLite covers them with it, and
PostgreSQL reads it index-only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import event, text

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import owner_stats
from leasehold._server.jobs.owner_stats import JobCounts
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.routing import KindPatterns
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from tests.storage.test_claim_plan import JOBS, OWNERS, _full_scans, _migrated, _plan, url  # noqa: F401

HOUR_US = 3_600_000_000
OWNER = "owner-0009"  # of the jobs left running or queued
KINDS = 7


async def test_an_owners_counts_and_the_workers_leases_walk_indexes(
    url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _migrated(url)
    engines = create_engines(url)
    clock = ManualClock()
    repository = SqlJobRepository(engines, clock)
    try:
        for start in range(0, JOBS, 1000):
            await repository.enqueue_batch(
                [
                    NewJob(owner_id=f"owner-{index % OWNERS:04d}", kind=f"kind.{index % KINDS}", payload={})
                    for index in range(start, start + 1000)
                ]
            )
        flavour = engines.dialect.name
        with engines.writer.begin() as conn:
            # Nine in ten finished; of the rest, one in ten runs under a live lease.
            conn.execute(
                text("UPDATE jobs SET status = 'succeeded', completed_at = created_at WHERE seq % 10 <> 0")
            )
            conn.execute(
                text(
                    "UPDATE jobs SET status = 'running', lease_owner = 'w-' || (seq % 3),"
                    " lease_expires_at = created_at + :hour WHERE seq % 100 = 10"
                ),
                {"hour": HOUR_US},
            )
        if flavour == "postgresql":
            with engines.writer.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE jobs")
        # Fewer kind rows than the owner has: the totals then take a count of their own.
        monkeypatch.setattr(owner_stats, "KIND_ROWS", 3)
        sent: list[tuple[str, Any]] = []

        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
            if "jobs" in statement:
                sent.append((statement, parameters))

        event.listen(engines.reader.sync_engine, "before_cursor_execute", capture)
        try:
            stats = await repository.owner_stats(OWNER)
            holders = await repository.lease_holders(KindPatterns.parse(["kind.*"]), ["w-9"])
        finally:
            event.remove(engines.reader.sync_engine, "before_cursor_execute", capture)
        with engines.writer.connect() as conn:
            counted = conn.execute(
                text("SELECT status, count(*) FROM jobs WHERE owner_id = :owner GROUP BY status"),
                {"owner": OWNER},
            ).all()
        assert stats.total == JobCounts(**{status: jobs for status, jobs in counted})
        assert sum(getattr(stats.total, status) for status, _ in counted) == JOBS // OWNERS
        assert sum(holder.jobs_held for holder in holders) == JOBS // 100
        assert [holder.worker_id for holder in holders] == ["w-0", "w-1", "w-2"]

        assert len(sent) == 3
        with engines.writer.connect() as conn:
            plans = [
                (statement, _plan(conn, flavour, statement, parameters)) for statement, parameters in sent
            ]
        for statement, plan in plans:
            assert not _full_scans(flavour, plan), "\n".join([statement, *plan])
        counts = [plan for statement, plan in plans if "owner_id" in statement]
        assert len(counts) == 2
        index_only = (
            r"USING COVERING INDEX ix_jobs_owner_id_kind_status"
            if flavour == "sqlite"
            else r"Index Only Scan using ix_jobs_owner_id_kind_status"
        )
        for plan in counts:
            assert any(re.search(index_only, line) for line in plan), "\n".join(plan)
        [leases] = [plan for statement, plan in plans if "lease_expires_at" in statement]
        assert any(re.search(r"ix_jobs_status_\w+", line) for line in leases), "\n".join(leases)
    finally:
        await repository.close()
