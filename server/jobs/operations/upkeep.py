"""What operators and the service's own upkeep do across every owner:
retention's deletes, bulk cancel and retry, pausing a kind."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.admin import AdminFilter, BulkBatch
from leasehold._server.jobs.operations.owner import OwnerOperations
from leasehold._server.jobs.operations.rows import Columns, Rows
from leasehold._server.jobs.records import (
    Job,
    JobStatus,
)


def _bulk_batch(batch: Sequence[Columns], changed: list[Job], matched: int | None = None) -> BulkBatch:
    """The walk goes on below the batch's last job until a batch finds none,
    never trusting a short batch to be the last: on PostgreSQL a row another
    transaction changed while this one waited for its lock drops out of the
    batch (it no longer matches), whether or not the LIMIT is made up."""
    return BulkBatch(
        matched=len(batch) if matched is None else matched,
        changed=changed,
        next_position=batch[-1]["seq"] if batch else None,
    )


class UpkeepOperations(OwnerOperations):
    """Retention, and AdminService's bulk actions and kind pauses."""

    async def delete_expired(self, finished_before: datetime, limit: int) -> int:
        def op(rows: Rows) -> int:
            doomed = rows.expired_job_ids(finished_before, limit)
            return rows.delete_jobs(doomed) if doomed else 0

        return await self._sweep(op)

    async def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        return await self._sweep(lambda rows: rows.forget_request_ids(created_before, limit))

    # ----- administration, across every owner ----------------------------------------------

    async def bulk_cancel(
        self, job_filter: AdminFilter, below: int | None, limit: int, grace_seconds: float, dry_run: bool
    ) -> BulkBatch:
        if dry_run:
            return _bulk_batch(await self._bulk_preview(job_filter, below, limit, unretried=False), [])

        def op(rows: Rows) -> BulkBatch:
            now = rows.now()
            batch = rows.bulk_batch(job_filter, below, limit, unretried=False, lock=True)
            chosen: dict[sm.Transition, list[Columns]] = {}
            for row in batch:
                transition = sm.owner_cancel(JobStatus(row["status"]), row["cancel_requested_at"] is not None)
                if transition is not None:
                    chosen.setdefault(transition, []).append(row)
            inputs = sm.Inputs(now=now, grace_until=now + timedelta(seconds=grace_seconds))
            changed: list[Job] = []
            for transition, members in chosen.items():
                done = rows.transition_batch(transition, members, inputs)
                self._written(rows, transition, done, now)
                changed.extend(sm.job_of(row) for row in done)
            return _bulk_batch(batch, changed)

        return await self._sweep(op)

    async def bulk_retry(
        self, job_filter: AdminFilter, below: int | None, limit: int, dry_run: bool
    ) -> BulkBatch:
        if dry_run:
            return _bulk_batch(await self._bulk_preview(job_filter, below, limit, unretried=True), [])

        def op(rows: Rows) -> BulkBatch:
            now = rows.now()
            sources = rows.bulk_batch(job_filter, below, limit, unretried=True, lock=True)
            # Asked again now that the sources are locked: on PostgreSQL a
            # concurrent BulkRetry that held them has committed its retries,
            # which the locked read's snapshot predates.
            retried = rows.retried_among([source["id"] for source in sources]) if sources else set()
            new = self._new_retries(
                rows,
                [
                    source
                    for source in sources
                    if sm.can_retry(JobStatus(source["status"])) and source["id"] not in retried
                ],
                now,
            )
            # What it retried, not what it walked past.
            return _bulk_batch(sources, [sm.job_of(row) for row in new], matched=len(new))

        return await self._sweep(op)

    async def set_kind_paused(self, kind: str, paused: bool) -> bool:
        def op(rows: Rows) -> bool:
            if paused:
                rows.pause_kind(kind, rows.now())
            elif rows.resume_kind(kind):
                # Its queued jobs are claimable again: waiting claimers, here and
                # on every replica, look now.
                rows.announce_work()
            return paused

        return await self._write(op)
