"""Retention (`serve --retention`): claim latency while a large deletion runs, against the same
claims with nothing else running, on SQLite (`retention`) and on PostgreSQL (`pg_retention`).

A template holds `expired` succeeded jobs (three events each) that finished 30 days ago, and a
queue of `queued` `bench.hold` jobs behind them (bench.seed.seed_expired_jobs). Each round copies
it twice (a file copy, or `CREATE DATABASE ... TEMPLATE` on the run's cluster, seeded once and
vacuumed) and runs one child process on each copy. Both open it with `SqlJobRepository` and, one
at a time like claim_cost's pairs, await `claim(worker, limit=1, lease 30 s)` then `succeed`,
timing the claim alone: `warmup` untimed pairs first.

* idle: `claims` timed claims, nothing else running;
* during retention: `RetentionSweeper(repository, clock, 7 days).sweep()` starts in the same
  process on the same repository and deletes every expired job (batch by batch, resting so
  that deleting takes `RETENTION_SHARE` of the time), while the claim loop goes on until the
  sweep returns. Only claims
  that started after the sweep started and returned before it ended are counted. The sweep must
  delete exactly `expired` jobs and leave none of them, nor any of their events, behind.

The target divides the p99 during retention by the idle p99 of the same round. The during
figure's params also say how the claims met the delete batches (each batch's `delete_expired`
call is timed from the event loop): how many claims overlapped one, and which share of all
(the p99 holds while that share stays under 1%), and the p99 of those that did and of those
that did not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import create_engine, text

from bench.common import BenchError, Measurement, latency_summary, percentile, sqlite_url
from bench.context import RoundContext, RoundItem
from bench.postgres import PgDatabase, vacuum_analyze
from bench.procs import run_child
from bench.seed import EXPIRED_KIND, sync_url
from leasehold._server.clock import SystemClock
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.logs import configure_logging
from leasehold._server.runtime.retention import RETENTION_BATCH, RETENTION_SHARE, RetentionSweeper

WARMUP = 20
WORKER = "bench-claimer"
QUEUED_KIND = "bench.hold"
RETENTION_SECONDS = 7 * 86_400.0
DEADLINE_SECONDS = 900.0


class _TimedDeletes(SqlJobRepository):
    """The repository, with every `delete_expired` call's span (perf_counter) written down."""

    batches: list[tuple[float, float]]

    async def delete_expired(self, finished_before: datetime, limit: int) -> int:
        began = time.perf_counter()
        try:
            return await super().delete_expired(finished_before, limit)
        finally:
            self.batches.append((began, time.perf_counter()))


def _left_behind(database_url: str) -> tuple[int, int]:
    """(expired jobs, events whose job is gone) still in the database."""
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as conn:
            jobs = conn.execute(text("SELECT count(*) FROM jobs WHERE kind = :kind"), {"kind": EXPIRED_KIND})
            events = conn.execute(
                text("SELECT count(*) FROM job_events WHERE job_id NOT IN (SELECT id FROM jobs)")
            )
            return int(jobs.scalar_one()), int(events.scalar_one())
    finally:
        engine.dispose()


async def claim_latencies(
    database_url: str, claims: int, warmup: int, sweep: bool, expired: int, batch: int = RETENTION_BATCH
) -> dict[str, Any]:
    """Run in a child process: time claim(limit=1) calls, idle (`claims` of them) or for as long
    as a retention sweep runs (`sweep`), which must delete exactly `expired` jobs."""
    configure_logging("warning")
    repo = _TimedDeletes(create_engines(database_url), SystemClock())
    repo.batches = []
    spans: list[tuple[float, float]] = []

    async def pair() -> tuple[float, float]:
        began = time.perf_counter()
        result = await repo.claim(WORKER, 1, 30)
        ended = time.perf_counter()
        if len(result.jobs) != 1:
            raise BenchError("claim found no job: the queue ran dry (raise retention_queued)")
        await repo.succeed(result.jobs[0].lease)
        return began, ended

    try:
        for _ in range(warmup):
            await pair()
        if not sweep:
            for _ in range(claims):
                spans.append(await pair())
            return {"latencies_ms": [(end - start) * 1000 for start, end in spans]}
        sweeper = RetentionSweeper(repo, SystemClock(), RETENTION_SECONDS, batch=batch)

        async def timed_sweep() -> tuple[int, float, float]:
            began = time.perf_counter()
            deleted = await sweeper.sweep()
            return deleted, began, time.perf_counter()

        async with asyncio.timeout(DEADLINE_SECONDS):
            task = asyncio.create_task(timed_sweep())
            await asyncio.sleep(0)  # let the sweep take its first step
            while not task.done():
                spans.append(await pair())
            deleted, sweep_began, sweep_ended = await task
    finally:
        await repo.close()
    if deleted != expired:
        raise BenchError(f"the sweep deleted {deleted} jobs, not the {expired} expired ones")
    left = await asyncio.to_thread(_left_behind, database_url)
    if left != (0, 0):
        raise BenchError(f"the sweep left {left[0]} expired jobs and {left[1]} orphaned events behind")
    during = [(start, end) for start, end in spans if start >= sweep_began and end <= sweep_ended]

    def overlaps(start: float, end: float) -> bool:
        return any(b_start < end and start < b_end for b_start, b_end in repo.batches)

    hit = [(end - start) * 1000 for start, end in during if overlaps(start, end)]
    clear = [(end - start) * 1000 for start, end in during if not overlaps(start, end)]
    return {
        "latencies_ms": [(end - start) * 1000 for start, end in during],
        "deleted": deleted,
        "sweep_seconds": sweep_ended - sweep_began,
        "batch_ms": [(end - start) * 1000 for start, end in repo.batches],
        "overlapping_ms": hit,
        "clear_ms": clear,
    }


def _p99(values: list[float]) -> float | None:
    return round(percentile(values, 99), 3) if values else None


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    template = ctx.templates.expired_jobs(sizes.retention_expired, QUEUED_KIND, sizes.retention_queued)
    yield from _measure(
        ctx, "leasehold.retention", lambda name: sqlite_url(ctx.copy(template, f"retention-{name}.db"))
    )


def run_postgres(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    expired, queued = sizes.retention_expired, sizes.retention_queued
    key = f"pg-expired-{expired}-{queued}"

    def make(database: PgDatabase) -> None:
        run_child(
            ctx.directory,
            f"seed-{key}",
            "bench.seed:seed_expired_jobs",
            {"database_url": database.url, "expired": expired, "queued_kind": QUEUED_KIND, "queued": queued},
            timeout=3600,
        )
        vacuum_analyze(database)

    template = ctx.postgres.template(key, make)
    yield from _measure(
        ctx,
        "leasehold.pg.retention",
        lambda name: ctx.postgres.database(f"retention_{name}", template=template).url,
    )


def _measure(ctx: RoundContext, prefix: str, fresh_copy: Callable[[str], str]) -> Iterator[RoundItem]:
    """Both runs of a round, each on a fresh copy of the template (`fresh_copy(name)` gives its
    database URL), and the figures `prefix`.idle_claim.p99, `prefix`.claim.p99 and
    `prefix`.sweep."""
    sizes = ctx.sizes
    expired, queued = sizes.retention_expired, sizes.retention_queued
    params: dict[str, Any] = {"expired": expired, "queued": queued, "warmup_claims": WARMUP}
    idle = run_child(
        ctx.directory,
        "retention-idle",
        "bench.figures.retention:claim_latencies",
        {
            "database_url": fresh_copy("idle"),
            "claims": sizes.retention_idle_claims,
            "warmup": WARMUP,
            "sweep": False,
            "expired": expired,
        },
        DEADLINE_SECONDS + 60,
    )
    summary = latency_summary(ms / 1000 for ms in idle["latencies_ms"])
    yield Measurement(
        f"{prefix}.idle_claim.p99",
        summary["p99"],
        "ms",
        "leasehold",
        {**params, "claims": sizes.retention_idle_claims, "p50_ms": round(summary["p50"], 3)},
    )
    during = run_child(
        ctx.directory,
        "retention-sweeping",
        "bench.figures.retention:claim_latencies",
        {
            "database_url": fresh_copy("sweeping"),
            "claims": 0,
            "warmup": WARMUP,
            "sweep": True,
            "expired": expired,
        },
        DEADLINE_SECONDS + 60,
    )
    latencies = during["latencies_ms"]
    if not latencies:
        raise BenchError("no claim both started and returned while the sweep ran")
    summary = latency_summary(ms / 1000 for ms in latencies)
    batches = during["batch_ms"]
    sweep_params = {
        **params,
        "batch": RETENTION_BATCH,
        "writer_share": RETENTION_SHARE,
        "deleted": during["deleted"],
        "sweep_seconds": round(during["sweep_seconds"], 3),
        "batches": len(batches),
        "batch_p50_ms": round(percentile(batches, 50), 3),
        "batch_max_ms": round(max(batches), 3),
    }
    yield Measurement(
        f"{prefix}.claim.p99",
        summary["p99"],
        "ms",
        "leasehold",
        {
            **sweep_params,
            "claims": len(latencies),
            "p50_ms": round(summary["p50"], 3),
            "max_ms": round(summary["max"], 3),
            "claims_overlapping_a_batch": len(during["overlapping_ms"]),
            "share_overlapping_a_batch": round(len(during["overlapping_ms"]) / len(latencies), 4),
            "overlapping_p99_ms": _p99(during["overlapping_ms"]),
            "clear_p99_ms": _p99(during["clear_ms"]),
        },
    )
    yield Measurement(f"{prefix}.sweep", during["sweep_seconds"], "s", "leasehold", sweep_params)
