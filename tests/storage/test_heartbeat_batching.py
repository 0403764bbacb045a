"""Heartbeats from many workers are written together: every lease that reaches
the writer's batch is renewed by one statement, never one per job (on both
databases)."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import event

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import NewJob
from tests.support import OWNER, make_repository

LEASE = 30.0
WORKERS = 5
LEASES_EACH = 20


async def test_the_heartbeats_of_many_workers_are_one_statement_per_batch(
    database_url: str, clock: ManualClock
) -> None:
    repository = await make_repository(database_url, clock)
    try:
        for _ in range(WORKERS * LEASES_EACH):
            await repository.enqueue(NewJob(owner_id=OWNER, kind="example.echo", payload={}))
        claimed = (await repository.claim("w", WORKERS * LEASES_EACH, LEASE)).jobs
        leases = [c.lease for c in claimed]
        heartbeats: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.lstrip().upper().startswith("UPDATE JOBS SET LEASE_EXPIRES_AT"):
                heartbeats.append(statement)

        writer_engine = repository._engines.writer
        event.listen(writer_engine, "before_cursor_execute", count)
        try:
            clock.advance(5)
            # Five workers' Heartbeat calls arriving at once, twenty leases each.
            answers = await asyncio.gather(
                *(
                    repository.heartbeat(leases[i * LEASES_EACH : (i + 1) * LEASES_EACH], LEASE)
                    for i in range(WORKERS)
                )
            )
        finally:
            event.remove(writer_engine, "before_cursor_execute", count)
    finally:
        await repository.close()

    assert all(renewal is not None for answer in answers for renewal in answer)
    # However the calls fell into the writer's batches, never one statement per
    # lease, nor even one per call.
    assert 1 <= len(heartbeats) < WORKERS, len(heartbeats)
