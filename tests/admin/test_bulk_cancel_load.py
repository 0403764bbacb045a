"""BulkCancel of 20,000 queued jobs on PostgreSQL while a remote worker goes on
claiming another kind: a dry run counts them and changes nothing, the real run
cancels every one through the state machine (its job.cancelled event with
it), and claims make progress throughout. Claim latency with and without the
bulk running is printed (the figures the README quotes); nothing
here asserts a time."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import pytest

from leasehold.v1 import admin_pb2, jobs_pb2, worker_pb2
from tests.admin.helpers import Stubs, admin_server, credentials, stubs
from tests.conftest import Postgres
from tests.database_reads import rows

pytestmark = pytest.mark.slow

BULK = 20_000
SUPPLY = 6_000  # report.x jobs the claimer takes, one Claim at a time
BATCH = 1_000


async def _enqueue(s: Stubs, metadata: tuple[tuple[str, str], ...], kind: str, count: int) -> None:
    for start in range(0, count, BATCH):
        items = [jobs_pb2.EnqueueRequest(kind=kind) for _ in range(min(BATCH, count - start))]
        await s.jobs.BatchEnqueue(jobs_pb2.BatchEnqueueRequest(requests=items), metadata=metadata)


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] * 1000


async def test_bulk_cancel_of_20000_queued_jobs_while_claims_go_on(
    postgres: Postgres, tmp_path: Path
) -> None:
    creds = credentials(tmp_path)
    async with admin_server(postgres.fresh_database_url(), creds, lease_seconds=300) as app, stubs(app) as s:
        url = app.settings.database_url
        await _enqueue(s, creds.owner("alice"), "media.resize", BULK // 2)
        await _enqueue(s, creds.owner("bob"), "media.resize", BULK // 2)
        await _enqueue(s, creds.owner("bob"), "report.x", SUPPLY)
        worker = s.worker
        claim = worker_pb2.ClaimRequest(worker_id="load", kinds=["report.x"], wait_seconds=0)

        async def claimer(stop: asyncio.Event, latencies: list[float]) -> None:
            while not stop.is_set():
                began = time.perf_counter()
                claimed = await worker.Claim(claim, metadata=creds.worker)
                latencies.append(time.perf_counter() - began)
                assert len(claimed.jobs) == 1

        async def claims_while(work: asyncio.Future[object] | None, count: int) -> list[float]:
            latencies: list[float] = []
            stop = asyncio.Event()
            task = asyncio.create_task(claimer(stop, latencies))
            if work is None:
                while len(latencies) < count:
                    await asyncio.sleep(0.01)
            else:
                await work
            stop.set()
            await task
            return latencies

        media = admin_pb2.JobFilter(kind="media.resize")
        dry = await s.admin.BulkCancel(
            admin_pb2.BulkCancelRequest(filter=media, dry_run=True), metadata=creds.admin
        )
        assert (dry.matched, dry.dry_run) == (BULK, True)
        [still] = rows(
            url, "SELECT count(*) AS n FROM jobs WHERE kind = 'media.resize' AND status = 'queued'"
        )
        assert still["n"] == BULK

        baseline = await claims_while(None, 500)
        bulk_began = time.perf_counter()
        bulk = asyncio.ensure_future(
            s.admin.BulkCancel(admin_pb2.BulkCancelRequest(filter=media), metadata=creds.admin)
        )
        during = await claims_while(bulk, 0)
        bulk_seconds = time.perf_counter() - bulk_began
        assert bulk.result().matched == BULK

        [cancelled] = rows(
            url,
            "SELECT count(*) AS n FROM jobs j JOIN job_events e"
            " ON e.job_id = j.id AND e.type = 'job.cancelled'"
            " WHERE j.kind = 'media.resize' AND j.status = 'cancelled'",
        )
        assert cancelled["n"] == BULK
        [left] = rows(
            url, "SELECT count(*) AS n FROM jobs WHERE kind = 'media.resize' AND status <> 'cancelled'"
        )
        assert left["n"] == 0
        assert len(during) > 10, "claims made progress while the bulk ran"
        print(
            f"\nbulk_cancel: {BULK} jobs in {bulk_seconds:.2f} s; claim p99 {p99(baseline):.2f} ms alone "
            f"({len(baseline)} claims), {p99(during):.2f} ms during the bulk ({len(during)} claims): "
            f"{p99(during) / p99(baseline):.2f}x"
        )
