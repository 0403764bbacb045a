"""The operations an owner calls: enqueue, cancel and retry, each also under a
request id (`idempotency`), so that a call sent twice acts once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from leasehold._server.jobs import idempotency
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import (
    JobNotFound,
    RequestIdReused,
    RequestResultDeleted,
    RetryNotAllowed,
)
from leasehold._server.jobs.idempotency import Answer, KeyedAnswer, RequestKey
from leasehold._server.jobs.operations import feed
from leasehold._server.jobs.operations.base import Many, enqueue_events
from leasehold._server.jobs.operations.graphs import GraphOperations
from leasehold._server.jobs.operations.rows import Rows
from leasehold._server.jobs.records import (
    Job,
    JobStatus,
    JobSubject,
    NewJob,
)


class OwnerOperations(GraphOperations):
    """Enqueue, cancel and retry, with or without a request id."""

    # ----- serving an owner -----------------------------------------------------------------

    async def enqueue(self, new_job: NewJob) -> tuple[Job, bool]:
        if not (new_job.resource_id or new_job.depends_on):
            # Nothing to look up first: every such enqueue of a batch is one
            # INSERT. (A job with parents is written alone: its parents are
            # looked up as its own owner's, never among other callers'.)
            return await self._write_many(Many("enqueue", self._enqueue_many), new_job)
        (answer,) = await self._write(lambda rows: self._enqueue_rows(rows, [new_job]))
        return answer

    def _enqueue_many(self, rows: Rows, new_jobs: list[NewJob]) -> list[tuple[Job, bool] | Exception]:
        return list(self._enqueue_rows(rows, new_jobs))

    async def enqueue_batch(self, new_jobs: Sequence[NewJob]) -> list[tuple[Job, bool]]:
        batch = list(new_jobs)
        return await self._write(lambda rows: self._enqueue_rows(rows, batch, in_batch=True))

    def _enqueue_rows(
        self,
        rows: Rows,
        new_jobs: Sequence[NewJob],
        now: datetime | None = None,
        in_batch: bool = False,
    ) -> list[tuple[Job, bool]]:
        """Items without a resource id queue up for one insert; each resource's
        item is inserted alone (the resource's one root job decides), after the
        rows queued before it, so jobs are stored in request order. A resource
        named again later in the batch is answered from its first answer: that
        is its most recent job."""
        now = rows.now() if now is None else now
        if any(job.depends_on or job.depends_on_items for job in new_jobs):
            return self._enqueue_graph(rows, new_jobs, now, in_batch)
        answers: list[tuple[Job, bool]] = []
        unkeyed: list[dict[str, Any]] = []
        created: list[str] = []
        by_resource: dict[tuple[str, str, str], Job] = {}
        for new_job in new_jobs:
            row = sm.queued_row(sm.new_job_values(new_job), now)
            if not new_job.resource_id:
                unkeyed.append(row)
                created.append(row["id"])
                answers.append((sm.job_of(row), True))
                continue
            key = (new_job.owner_id, new_job.resource_type, new_job.resource_id)
            if key in by_resource:
                answers.append((by_resource[key], False))
                continue
            if unkeyed:
                rows.insert_jobs(unkeyed)
                unkeyed = []
            if rows.insert_root(row):
                job, is_new = sm.job_of(row), True
                created.append(job.id)
            else:
                job, is_new = sm.job_of(rows.latest_for_resource(*key)), False
            by_resource[key] = job
            answers.append((job, is_new))
        if unkeyed:
            rows.insert_jobs(unkeyed)
        if created:
            subjects = {
                job.id: JobSubject(job.owner_id, job.kind, job.resource_type, job.resource_id)
                for job, is_new in answers
                if is_new
            }
            rows.insert_events(
                [event for job_id in created for event in enqueue_events(job_id, now)], subjects
            )
            rows.announce_work()
        return answers

    async def cancel(
        self, owner_id: str, job_id: str, grace_seconds: float = sm.DEFAULT_CANCEL_GRACE_SECONDS
    ) -> Job:
        def op(rows: Rows) -> Job:
            now = rows.now()
            current = rows.owned_job(owner_id, job_id)
            if current is None:
                raise JobNotFound(job_id)
            transition = sm.owner_cancel(
                JobStatus(current["status"]), current["cancel_requested_at"] is not None
            )
            if transition is None:
                return sm.job_of(current)
            inputs = sm.Inputs(now=now, grace_until=now + timedelta(seconds=grace_seconds))
            changed = rows.transition_owned(transition, owner_id, job_id, inputs)
            self._written(rows, transition, [changed], now)
            return sm.job_of(changed)

        return await self._write(op)

    async def retry(self, owner_id: str, job_id: str) -> Job:
        return await self._write(lambda rows: self._retry_rows(rows, owner_id, job_id))

    def _retry_rows(self, rows: Rows, owner_id: str, job_id: str) -> Job:
        now = rows.now()
        source = rows.retry_source(owner_id, job_id)
        if source is None:
            raise JobNotFound(job_id)
        if not sm.can_retry(JobStatus(source["status"])):
            raise RetryNotAllowed(job_id, source["status"])
        (row,) = self._new_retries(rows, [source], now)
        return sm.job_of(row)

    # ----- idempotent calls (request ids) -------------------------------------------------

    async def enqueue_once(self, new_jobs: Sequence[NewJob], key: RequestKey) -> KeyedAnswer:
        batch = list(new_jobs)
        if len(batch) == 1 and not (batch[0].resource_id or batch[0].depends_on):
            # The commonest idempotent call (a client sends a request id with
            # every Enqueue): its answer is known before anything is written,
            # so such calls of a batch share their statements, as plain ones do.
            return await self._write_many(Many("enqueue_once", self._enqueue_once_rows), (batch[0], key))
        in_batch = key.method is not idempotency.Method.ENQUEUE
        return await self._write(
            lambda rows: self._once(rows, key, lambda: self._enqueue_rows(rows, batch, in_batch=in_batch))
        )

    async def retry_once(self, owner_id: str, job_id: str, key: RequestKey) -> KeyedAnswer:
        return await self._write(
            lambda rows: self._once(rows, key, lambda: [(self._retry_rows(rows, owner_id, job_id), True)])
        )

    def _once(self, rows: Rows, key: RequestKey, act: Callable[[], list[Answer]]) -> KeyedAnswer:
        """Take the key, then act and record the answer; or, when the key is
        taken, answer from its record. All in one unit of work: a call that
        fails leaves neither jobs nor a key behind."""
        if not rows.take_request_keys([(key, [])], rows.now()):
            return self._replay(rows, key)
        answers = act()
        rows.set_request_response(key, idempotency.record(answers))
        return KeyedAnswer(answers, repeated=False)

    @staticmethod
    def _replay(rows: Rows, key: RequestKey) -> KeyedAnswer:
        method, fingerprint, response = rows.request_record(key)
        named = rows.jobs_named(key.owner_id, idempotency.recorded_job_ids(response))
        return idempotency.replay(
            key, method, fingerprint, response, {row["id"]: sm.job_of(row) for row in named}
        )

    def _enqueue_once_rows(
        self, rows: Rows, items: list[tuple[NewJob, RequestKey]]
    ) -> list[KeyedAnswer | Exception]:
        """Single new jobs without a resource key, each under its request id:
        every key goes in with its final answer (the job id is drawn here, and
        such a job is always created); the jobs whose keys went in are inserted
        together; every other call is a repeat, answered from its key's record
        once those jobs are in."""
        now = rows.now()
        firsts: dict[tuple[str, str], tuple[dict[str, Any], Job]] = {}
        keys: list[tuple[RequestKey, list[dict[str, Any]]]] = []
        for new_job, key in items:
            ident = (key.owner_id, key.request_id)
            if ident not in firsts:
                row = sm.queued_row(sm.new_job_values(new_job), now)
                job = sm.job_of(row)
                firsts[ident] = (row, job)
                keys.append((key, idempotency.record([(job, True)])))
        taken = rows.take_request_keys(keys, now)
        created = [row for ident, (row, _) in firsts.items() if ident in taken]
        if created:
            rows.insert_jobs(created)
            rows.insert_events(
                [event for row in created for event in enqueue_events(row["id"], now)],
                feed.subjects_of(created),
            )
            rows.announce_work()
        answers: list[KeyedAnswer | Exception] = []
        for _, key in items:
            ident = (key.owner_id, key.request_id)
            if ident in taken:
                taken.discard(ident)  # the first call with the key; any later one is a repeat
                answers.append(KeyedAnswer([(firsts[ident][1], True)], repeated=False))
                continue
            try:
                answers.append(self._replay(rows, key))
            except (RequestIdReused, RequestResultDeleted) as exc:
                answers.append(exc)
        return answers
