"""AdminService.BulkCancel never holds up claims: claim latency while a bulk cancel walks
`bulk_cancel_jobs` queued jobs, against the same claims with nothing else running, on PostgreSQL
(`bulk_cancel`).

A template holds `bulk_cancel_jobs` queued `bench.bulk` jobs and a queue of `bench.hold` jobs
beside them (seeded once per run, vacuumed). Each round copies it twice and runs one child
process on each copy. Both open it with `SqlJobRepository` and, one at a time like retention's
pairs, await `claim(worker, limit=1, lease 30 s, kinds={bench.hold})` then `succeed`, timing the
claim alone, `warmup` untimed pairs first:

* idle: `bulk_cancel_idle_claims` timed claims, nothing else running;
* during the bulk: the same repository walks a bulk cancel of every `bench.bulk` job (the
  walk AdminService.BulkCancel makes: `admin.walk` over `bulk_cancel` batches of
  `admin.BULK_BATCH`), while the claim loop goes on until the walk returns. Only claims that
  started after the walk started and returned before it ended count. The walk must cancel
  exactly `bulk_cancel_jobs` jobs and leave none of them queued or without its job.cancelled
  event.

The target divides the p99 during the bulk by the idle p99 of the same round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import create_engine, text

from bench.common import BenchError, Measurement, latency_summary
from bench.context import RoundContext, RoundItem
from bench.postgres import PgDatabase, vacuum_analyze
from bench.procs import run_child
from bench.seed import _enqueue, _open, sync_url
from leasehold._server.clock import SystemClock
from leasehold._server.jobs import admin
from leasehold._server.jobs.records import JobFilter, JobStatus
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.logs import configure_logging

WARMUP = 20
WORKER = "bench-claimer"
BULK_KIND = "bench.bulk"
HOLD_KIND = "bench.hold"
DEADLINE_SECONDS = 900.0
CANCEL_GRACE_SECONDS = 30.0


async def seed(database_url: str, bulk: int, queued: int) -> dict[str, Any]:
    """`bulk` queued jobs to cancel, then `queued` jobs to claim, on a migrated database."""
    configure_logging("warning")
    began = time.monotonic()
    repo = await _open(database_url)
    try:
        await _enqueue(repo, BULK_KIND, bulk, owners=10)
        await _enqueue(repo, HOLD_KIND, queued)
    finally:
        await repo.close()
    return {"bulk": bulk, "queued": queued, "seconds": time.monotonic() - began}


def _left_behind(database_url: str) -> tuple[int, int]:
    """(bulk jobs not cancelled, cancelled bulk jobs without their job.cancelled event)."""
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as conn:
            uncancelled = conn.execute(
                text("SELECT count(*) FROM jobs WHERE kind = :kind AND status <> 'cancelled'"),
                {"kind": BULK_KIND},
            ).scalar_one()
            eventless = conn.execute(
                text(
                    "SELECT count(*) FROM jobs j WHERE j.kind = :kind AND NOT EXISTS"
                    " (SELECT 1 FROM job_events e WHERE e.job_id = j.id AND e.type = 'job.cancelled')"
                ),
                {"kind": BULK_KIND},
            ).scalar_one()
            return int(uncancelled), int(eventless)
    finally:
        engine.dispose()


async def claim_latencies(database_url: str, claims: int, warmup: int, bulk: int) -> dict[str, Any]:
    """Run in a child process: time claim(limit=1) calls, idle (`claims` of them), or for as
    long as a bulk cancel of `bulk` jobs runs (`bulk` > 0)."""
    configure_logging("warning")
    repo = SqlJobRepository(create_engines(database_url), SystemClock())
    hold = KindFilter(only=frozenset({HOLD_KIND}))
    spans: list[tuple[float, float]] = []

    async def pair() -> tuple[float, float]:
        began = time.perf_counter()
        result = await repo.claim(WORKER, 1, 30, hold)
        ended = time.perf_counter()
        if len(result.jobs) != 1:
            raise BenchError("claim found no job: the queue ran dry (raise bulk_cancel_queued)")
        await repo.succeed(result.jobs[0].lease)
        return began, ended

    queued_bulk = admin.AdminFilter(JobFilter(statuses=frozenset({JobStatus.QUEUED}), kind=BULK_KIND))

    async def timed_walk() -> tuple[int, float, float]:
        began = time.perf_counter()
        matched = await admin.walk(
            lambda below: repo.bulk_cancel(queued_bulk, below, admin.BULK_BATCH, CANCEL_GRACE_SECONDS, False)
        )
        return matched, began, time.perf_counter()

    try:
        for _ in range(warmup):
            await pair()
        if not bulk:
            for _ in range(claims):
                spans.append(await pair())
            return {"latencies_ms": [(end - start) * 1000 for start, end in spans]}
        async with asyncio.timeout(DEADLINE_SECONDS):
            task = asyncio.create_task(timed_walk())
            await asyncio.sleep(0)  # let the walk take its first step
            while not task.done():
                spans.append(await pair())
            matched, walk_began, walk_ended = await task
    finally:
        await repo.close()
    if matched != bulk:
        raise BenchError(f"the bulk cancel matched {matched} jobs, not the {bulk} queued ones")
    left = await asyncio.to_thread(_left_behind, database_url)
    if left != (0, 0):
        raise BenchError(f"the bulk cancel left {left[0]} jobs uncancelled and {left[1]} without their event")
    during = [(start, end) for start, end in spans if start >= walk_began and end <= walk_ended]
    return {
        "latencies_ms": [(end - start) * 1000 for start, end in during],
        "walk_seconds": walk_ended - walk_began,
    }


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    bulk, queued = sizes.bulk_cancel_jobs, sizes.bulk_cancel_queued
    key = f"pg-bulk-{bulk}-{queued}"

    def make(database: PgDatabase) -> None:
        run_child(
            ctx.directory,
            f"seed-{key}",
            "bench.figures.bulk_cancel:seed",
            {"database_url": database.url, "bulk": bulk, "queued": queued},
            timeout=3600,
        )
        vacuum_analyze(database)

    template = ctx.postgres.template(key, make)
    params: dict[str, Any] = {
        "bulk": bulk,
        "queued": queued,
        "warmup_claims": WARMUP,
        "batch": admin.BULK_BATCH,
    }
    idle = run_child(
        ctx.directory,
        "bulk-cancel-idle",
        "bench.figures.bulk_cancel:claim_latencies",
        {
            "database_url": ctx.postgres.database("bulk_idle", template=template).url,
            "claims": sizes.bulk_cancel_idle_claims,
            "warmup": WARMUP,
            "bulk": 0,
        },
        DEADLINE_SECONDS + 60,
    )
    summary = latency_summary(ms / 1000 for ms in idle["latencies_ms"])
    yield Measurement(
        "leasehold.pg.bulk_cancel.idle_claim.p99",
        summary["p99"],
        "ms",
        "leasehold",
        {**params, "claims": sizes.bulk_cancel_idle_claims, "p50_ms": round(summary["p50"], 3)},
    )
    during = run_child(
        ctx.directory,
        "bulk-cancel-during",
        "bench.figures.bulk_cancel:claim_latencies",
        {
            "database_url": ctx.postgres.database("bulk_during", template=template).url,
            "claims": 0,
            "warmup": WARMUP,
            "bulk": bulk,
        },
        DEADLINE_SECONDS + 60,
    )
    latencies = during["latencies_ms"]
    if not latencies:
        raise BenchError("no claim both started and returned while the bulk cancel ran")
    summary = latency_summary(ms / 1000 for ms in latencies)
    walk_params = {**params, "walk_seconds": round(during["walk_seconds"], 3)}
    yield Measurement(
        "leasehold.pg.bulk_cancel.claim.p99",
        summary["p99"],
        "ms",
        "leasehold",
        {
            **walk_params,
            "claims": len(latencies),
            "p50_ms": round(summary["p50"], 3),
            "max_ms": round(summary["max"], 3),
        },
    )
    yield Measurement("leasehold.pg.bulk_cancel.walk", during["walk_seconds"], "s", "leasehold", walk_params)
