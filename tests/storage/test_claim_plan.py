"""The claim stays an index walk (DESIGN §11): every statement a claim runs, on
a queue of 20,000 jobs over 200 owners, is planned by each database without a
full scan of the jobs table. The statements are the ones the claim really
sent, captured on the writer's connection, so a change to the claim that loses
its index fails here, with the plan in the message."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from leasehold._server import migrate
from leasehold._server.clock import ManualClock, SystemClock
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.steering import Steering
from leasehold._server.runtime.retention import RETENTION_BATCH
from tests.conftest import Postgres
from tests.contract.test_schedules import schedule
from tests.support import ENGINES, sqlite_url

OWNERS = 200
JOBS = 20_000


@pytest.fixture(params=ENGINES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    postgres: Postgres = request.getfixturevalue("postgres")
    return postgres.fresh_database_url()


def _plan(conn: Any, flavour: str, statement: str, parameters: Any) -> list[str]:
    if flavour == "sqlite":
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
        return [row[-1] for row in rows]
    return [row[0] for row in conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).all()]


def _full_scans(flavour: str, plan: list[str]) -> list[str]:
    if flavour == "sqlite":
        # Only the jobs table counts ("SCAN owners" walks the recursive query's own rows).
        return [line for line in plan if re.match(r"SCAN (jobs|candidate)\b", line) and " USING " not in line]
    return [line for line in plan if "Seq Scan on jobs" in line]


@pytest.mark.parametrize(
    "rules",
    [Steering(), Steering(kind_limits={"pdf.render": 2}, owner_limit=5)],
    ids=["plain", "with-limits"],
)
async def test_every_statement_of_a_claim_walks_an_index(url: str, rules: Steering) -> None:
    await _migrated(url)
    engines = create_engines(url)
    clock = ManualClock(datetime.now(UTC))
    repository = SqlJobRepository(engines, clock, steering_rules=rules)
    try:
        for start in range(0, JOBS, 1000):
            await repository.enqueue_batch(
                [
                    NewJob(
                        owner_id=f"owner-{index % OWNERS:04d}",
                        kind="pdf.render" if index % 7 == 0 else "example.echo",
                        payload={},
                        priority=1 + index % 5,
                    )
                    for index in range(start, start + 1000)
                ]
            )
        await repository.claim("warm-up", 16, 30)  # the first claim also re-anchors the clock
        # Work for the first measured claim's recovery: leases that expire, and an
        # attempt that outlives its deadline (900 s) on a lease still held.
        await repository.claim("held", 1, 3600)
        clock.advance(901)  # past the default 900 s timeout, and every lease but the hour's
        flavour = engines.dialect.name
        with engines.writer.connect() as conn:
            if flavour == "postgresql":
                conn.exec_driver_sql("ANALYZE jobs")
        sent: list[tuple[str, Any]] = []

        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
            if "jobs" in statement and statement.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH")):
                sent.append((statement, parameters))

        event.listen(engines.writer, "before_cursor_execute", capture)
        try:
            claimed = await repository.claim("w1", 16, 30)
            # More slots than priority 1 has owners (a fifth of them): some
            # owners' heads are read again, after their first.
            deeper = await repository.claim("w2", OWNERS // 5 + 16, 30)
        finally:
            event.remove(engines.writer, "before_cursor_execute", capture)
        assert len(claimed.jobs) == 16
        assert len(deeper.jobs) == OWNERS // 5 + 16
        assert sorted(job.lease_expired for job in claimed.recovered) == [False] + [True] * 16

        kinds_of_statement = {statement.split()[0].upper() for statement, _ in sent}
        assert {"SELECT", "UPDATE", "WITH"} <= kinds_of_statement
        with engines.writer.connect() as conn:
            for statement, parameters in sent:
                plan = _plan(conn, flavour, statement, parameters)
                assert not _full_scans(flavour, plan), "\n".join([statement, *plan])
            owners_plan = next(
                _plan(conn, flavour, statement, parameters)
                for statement, parameters in sent
                if statement.lstrip().upper().startswith("WITH")
            )
            # The first and last owner with due work, per priority: seeks at the ends of
            # the claim order's index. SQLite once answered it from ix_jobs_status_available_at,
            # reading every due job and sorting them, each claim (no full scan, yet a claim's
            # cost grew with the backlog).
            edges_plan = next(
                _plan(conn, flavour, statement, parameters)
                for statement, parameters in sent
                if " AS first1" in statement
            )
        assert any("ix_jobs_claim_order" in line for line in owners_plan), owners_plan
        assert any("ix_jobs_claim_order" in line for line in edges_plan), edges_plan
        assert not any("ix_jobs_status_available_at" in line for line in edges_plan), edges_plan
        assert not any("TEMP B-TREE" in line for line in edges_plan), edges_plan
    finally:
        await repository.close()


async def test_a_claim_with_nothing_to_recover_sends_only_its_probe_its_read_and_its_update(url: str) -> None:
    """Every statement is a round trip on PostgreSQL. The probe also asks
    whether the recovery has work, so a claim with none sends no recovery
    statements (it sent two, one per recovery, on every claim before); and
    one that recovers sends them."""
    await _migrated(url)
    engines = create_engines(url)
    clock = ManualClock(datetime.now(UTC))
    repository = SqlJobRepository(engines, clock)
    try:
        await repository.enqueue_batch([NewJob(owner_id="o", kind="k", payload={}) for _ in range(10)])
        await repository.claim("warm-up", 1, 30)
        sent: list[str] = []

        def capture(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
            if "jobs" in statement:
                sent.append(statement.lstrip().split()[0].upper())

        event.listen(engines.writer, "before_cursor_execute", capture)
        try:
            quiet = await repository.claim("w1", 4, 30)
            quiet_statements, sent[:] = list(sent), []
            clock.advance(31)  # both claims' leases expire
            recovering = await repository.claim("w2", 4, 30)
        finally:
            event.remove(engines.writer, "before_cursor_execute", capture)
        assert len(quiet.jobs) == 4 and not quiet.recovered
        assert quiet_statements == ["SELECT", "SELECT", "UPDATE"]
        assert len(recovering.recovered) == 5
        # The probe, the expired leases' recovery, the probe again (the recovery
        # queued jobs), the heads and the claim; nothing was overdue.
        assert sent == ["SELECT", "UPDATE", "SELECT", "SELECT", "UPDATE"]
    finally:
        await repository.close()


async def _migrated(url: str) -> None:
    import asyncio

    await asyncio.to_thread(migrate.upgrade, url)


async def test_retention_and_the_schedule_timer_walk_indexes(url: str) -> None:
    """A sweep's statements and the timer's due scan, on 20,000 jobs of which
    half have finished: none scans the jobs table, the sweep finds expired jobs
    by ix_jobs_status_completed_at, and its delete looks a batch up by id."""
    await _migrated(url)
    engines = create_engines(url)
    clock = SystemClock()
    repository = SqlJobRepository(engines, clock)
    try:
        for start in range(0, JOBS, 1000):
            await repository.enqueue_batch(
                [
                    NewJob(
                        owner_id=f"owner-{index % OWNERS:04d}",
                        kind="example.echo",
                        payload={},
                        resource_type="doc" if index % 3 == 0 else "",
                        resource_id=f"d{index}" if index % 3 == 0 else "",
                    )
                    for index in range(start, start + 1000)
                ]
            )
        flavour = engines.dialect.name
        with engines.writer.begin() as conn:
            conn.execute(
                text("UPDATE jobs SET status = 'succeeded', completed_at = created_at WHERE seq % 2 = 0")
            )
            # Of the finished jobs without a key, only the first few expired.
            conn.execute(
                text(
                    "UPDATE jobs SET completed_at = created_at + 864000000000"
                    " WHERE status = 'succeeded' AND resource_id = '' AND seq > 200"
                )
            )
            if flavour == "postgresql":
                conn.exec_driver_sql("ANALYZE jobs")
        await repository.create_schedule(schedule(cron="* * * * *"))
        sent: list[tuple[str, Any]] = []

        def capture(
            _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool
        ) -> None:
            if statement.lstrip().upper().startswith(("SELECT", "DELETE", "UPDATE")):
                # A statement run for many rows is planned as for its first.
                sent.append((statement, parameters[0] if executemany else parameters))

        event.listen(engines.writer, "before_cursor_execute", capture)
        try:
            # One batch of a sweep's size runs both statements: the jobs without a key that
            # expired are fewer than a batch, and those with one fill the rest of it.
            deleted = await repository.delete_expired(clock.now() + timedelta(days=1), RETENTION_BATCH)
            await repository.fire_due_schedules()
        finally:
            event.remove(engines.writer, "before_cursor_execute", capture)
        assert deleted == RETENTION_BATCH
        assert {statement.split()[0].upper() for statement, _ in sent} >= {"SELECT", "DELETE"}
        with engines.writer.connect() as conn:
            plans = [
                (statement, _plan(conn, flavour, statement, parameters)) for statement, parameters in sent
            ]
        for statement, plan in plans:
            assert not _full_scans(flavour, plan), "\n".join([statement, *plan])
        expired_plans = [plan for statement, plan in plans if "completed_at <" in statement]
        assert len(expired_plans) == 2  # the jobs without a resource key, then those with one
        for plan in expired_plans:
            assert any("ix_jobs_status_completed_at" in line for line in plan), plan
        # The delete looks its batch up by id. Its status re-check once made SQLite walk
        # ix_jobs_status_completed_at over every finished job instead, each batch.
        [delete_jobs] = [plan for statement, plan in plans if re.match(r"\s*DELETE FROM jobs\b", statement)]
        assert any(
            re.search(r"sqlite_autoindex_jobs_1 \(id=\?\)|uq_jobs_id", line) for line in delete_jobs
        ), delete_jobs
        assert not any("ix_jobs_status" in line for line in delete_jobs), delete_jobs
    finally:
        await repository.close()


async def test_the_metrics_queue_read_walks_an_index(url: str) -> None:
    """The queue the metrics read (`queued_by_kind`), on 20,000 jobs of which
    nine in ten have finished: an index range of the due queued jobs, never a
    walk of every job kept, and the right counts."""
    await _migrated(url)
    engines = create_engines(url)
    repository = SqlJobRepository(engines, SystemClock())
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
            conn.execute(
                text("UPDATE jobs SET status = 'succeeded', completed_at = created_at WHERE seq % 10 <> 0")
            )
            if flavour == "postgresql":
                conn.exec_driver_sql("ANALYZE jobs")
        sent: list[tuple[str, Any]] = []

        def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
            sent.append((statement, parameters))

        event.listen(engines.reader.sync_engine, "before_cursor_execute", capture)
        try:
            queued = await repository.queued_by_kind()
        finally:
            event.remove(engines.reader.sync_engine, "before_cursor_execute", capture)
        assert sum(kind.depth for kind in queued) == JOBS // 10
        assert sorted(kind.kind for kind in queued) == ["kind.0", "kind.1", "kind.2"]
        [(statement, parameters)] = [(s, p) for s, p in sent if "jobs" in s]
        with engines.writer.connect() as conn:
            plan = _plan(conn, flavour, statement, parameters)
        assert not _full_scans(flavour, plan), "\n".join([statement, *plan])
        assert any(re.search(r"ix_jobs_\w+", line) for line in plan), "\n".join(plan)
    finally:
        await repository.close()
