"""`leasehold.v1.AdminService` over grpc.aio: the operator's view across every
owner (DESIGN §14).

Its call gate admits only the admin role (app.py), before anything is read.
What the service reads and changes is the repository's; the walk of a bulk
action is `admin.walk`, one short transaction per batch.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

import grpc
import structlog

from leasehold._server.api import admin_validation, validation
from leasehold._server.api.cached_read import STATS_CACHE_SECONDS, CachedRead
from leasehold._server.api.call_gate import CallGate
from leasehold._server.api.convert import job_to_proto, timestamp
from leasehold._server.api.method_handlers import decode, generic_handler
from leasehold._server.api.page_token import PageTokenCodec
from leasehold._server.api.rpc_outcomes import RpcObserver, unobserved
from leasehold._server.clock import Clock
from leasehold._server.jobs import admin
from leasehold._server.jobs.errors import KindNotServed
from leasehold._server.jobs.records import JobStatus, PageCursor
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import ServedKinds
from leasehold._server.jobs.state_machine import (
    CANCELLABLE_STATUSES,
    DEFAULT_CANCEL_GRACE_SECONDS,
    RETRYABLE_STATUSES,
)
from leasehold._server.remote.roster import WorkerList
from leasehold._server.runtime.retention import rest_after
from leasehold.v1 import admin_pb2

SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"]
ADMIN_SERVICE_NAME = SERVICE.full_name  # "leasehold.v1.AdminService"

# Whom an admin's page tokens are signed for: no owner id can hold a NUL, so
# a token an owner's List issued is never one ListAllJobs accepts, nor the reverse.
TOKEN_SIGNER = "\0admin"

log = structlog.get_logger("leasehold.admin")

# How long a bulk action rests after each batch.
BULK_REST = functools.partial(rest_after, share=admin.BULK_SHARE)


class AdminServiceServicer:
    def __init__(
        self,
        repository: JobRepository,
        page_tokens: PageTokenCodec,
        clock: Clock,
        serves: ServedKinds,
        cancel_grace_seconds: float = DEFAULT_CANCEL_GRACE_SECONDS,
        stats_cache_seconds: float = STATS_CACHE_SECONDS,
        workers: Callable[[], Awaitable[WorkerList]] | None = None,
    ) -> None:
        """`serves(kind)`: whether a handler or remote pattern serves the kind
        (BulkRetry of one kind refuses, as Retry does, a kind nobody runs);
        `workers()`: the remote workers this replica knows of (`roster.WorkerRoster`)."""
        self._repository = repository
        self._workers = workers or _no_workers
        self._page_tokens = page_tokens
        self._serves = serves
        self._cancel_grace_seconds = cancel_grace_seconds
        self.stats = CachedRead(repository.queue_stats, clock, stats_cache_seconds)

    async def get_queue_stats(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> admin_pb2.GetQueueStatsResponse:
        decode(admin_pb2.GetQueueStatsRequest, data)
        return stats_to_proto(await self.stats.get())

    async def list_all_jobs(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListAllJobsResponse:
        request = decode(admin_pb2.ListAllJobsRequest, data)
        size = validation.page_size(request.page_size)
        job_filter = admin_validation.job_filter(request.filter, frozenset(JobStatus))
        scope = admin_validation.filter_scope(job_filter)
        after = None
        if request.page_token:
            after = PageCursor(self._page_tokens.decode_position(TOKEN_SIGNER, scope, request.page_token))
        page = await self._repository.list_all_jobs(job_filter, size, after)
        token = ""
        if page.next_cursor is not None:
            token = self._page_tokens.encode_position(TOKEN_SIGNER, scope, page.next_cursor.job_id)
        return admin_pb2.ListAllJobsResponse(
            jobs=[job_to_proto(job) for job in page.jobs], next_page_token=token
        )

    async def bulk_cancel(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> admin_pb2.BulkCancelResponse:
        request = decode(admin_pb2.BulkCancelRequest, data)
        job_filter = admin_validation.job_filter(request.filter, CANCELLABLE_STATUSES)
        admin_validation.confirmed(job_filter, request.dry_run, request.confirm_all)
        grace = self._cancel_grace_seconds

        async def batch(status_filter: admin.AdminFilter, below: int | None) -> admin.BulkBatch:
            return await self._repository.bulk_cancel(
                status_filter, below, admin.BULK_BATCH, grace, request.dry_run
            )

        matched = await self._each_status(job_filter, CANCELLABLE_STATUSES, batch, request.dry_run)
        log.info("admin.bulk_cancel", matched=matched, dry_run=request.dry_run)
        return admin_pb2.BulkCancelResponse(matched=matched, dry_run=request.dry_run)

    async def bulk_retry(self, data: bytes, context: grpc.aio.ServicerContext) -> admin_pb2.BulkRetryResponse:
        request = decode(admin_pb2.BulkRetryRequest, data)
        job_filter = admin_validation.job_filter(request.filter, RETRYABLE_STATUSES)
        admin_validation.confirmed(job_filter, request.dry_run, request.confirm_all)
        if job_filter.jobs.kind and not self._serves(job_filter.jobs.kind):
            raise KindNotServed(job_filter.jobs.kind, self._serves.refusal(job_filter.jobs.kind))

        async def batch(status_filter: admin.AdminFilter, below: int | None) -> admin.BulkBatch:
            return await self._repository.bulk_retry(status_filter, below, admin.BULK_BATCH, request.dry_run)

        matched = await self._each_status(job_filter, RETRYABLE_STATUSES, batch, request.dry_run)
        log.info("admin.bulk_retry", matched=matched, dry_run=request.dry_run)
        return admin_pb2.BulkRetryResponse(matched=matched, dry_run=request.dry_run)

    async def pause_kind(self, data: bytes, context: grpc.aio.ServicerContext) -> admin_pb2.PauseKindResponse:
        request = decode(admin_pb2.PauseKindRequest, data)
        kind = admin_validation.kind(request.kind)
        paused = await self._repository.set_kind_paused(kind, True)
        log.info("admin.kind_paused", kind=kind)
        return admin_pb2.PauseKindResponse(kind=kind, paused=paused)

    async def resume_kind(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ResumeKindResponse:
        request = decode(admin_pb2.ResumeKindRequest, data)
        kind = admin_validation.kind(request.kind)
        paused = await self._repository.set_kind_paused(kind, False)
        log.info("admin.kind_resumed", kind=kind)
        return admin_pb2.ResumeKindResponse(kind=kind, paused=paused)

    async def list_workers(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> admin_pb2.ListWorkersResponse:
        decode(admin_pb2.ListWorkersRequest, data)
        found = await self._workers()
        return admin_pb2.ListWorkersResponse(
            workers=[
                admin_pb2.RemoteWorker(
                    worker_id=worker.worker_id,
                    kinds=worker.kinds,
                    jobs_held=worker.jobs_held,
                    last_seen_at=timestamp(worker.last_seen_at),
                    claiming=worker.claiming,
                )
                for worker in found.workers
            ],
            truncated=found.truncated,
        )

    async def _each_status(
        self, job_filter: admin.AdminFilter, allowed: frozenset[JobStatus], batch: BatchOf, dry_run: bool
    ) -> int:
        """Walk one status at a time, so each batch is a range of one status's
        jobs (`ix_jobs_status_seq`); no status asked means every allowed one.
        Every walk stays below the jobs there were when the call began, so a
        job made meanwhile (a retry this call made, failed already) is never
        part of it. A dry run only reads, without locks: it does not rest."""
        below = await self._repository.newest_position()
        matched = 0
        for status in sorted(job_filter.jobs.statuses or allowed):
            one = admin.with_statuses(job_filter, frozenset({status}))
            matched += await admin.walk(functools.partial(batch, one), None if dry_run else BULK_REST, below)
        return matched

    def generic_handler(
        self, gate: CallGate, rpc_finished: RpcObserver = unobserved
    ) -> grpc.GenericRpcHandler:
        """Every RPC AdminService declares, behind `gate` (the admin role)."""
        return generic_handler(SERVICE, self, gate, rpc_finished)


BatchOf = Callable[[admin.AdminFilter, int | None], Awaitable[admin.BulkBatch]]


async def _no_workers() -> WorkerList:
    """A servicer made without a WorkerService beside it knows of no worker."""
    return WorkerList(workers=[], truncated=False)


def stats_to_proto(stats: admin.QueueStats) -> admin_pb2.GetQueueStatsResponse:
    return admin_pb2.GetQueueStatsResponse(
        kinds=[
            admin_pb2.KindStats(
                kind=kind.kind,
                queued=kind.queued,
                running=kind.running,
                succeeded_last_hour=kind.succeeded_last_hour,
                failed_last_hour=kind.failed_last_hour,
                cancelled_last_hour=kind.cancelled_last_hour,
                oldest_queued_due_at=timestamp(kind.oldest_queued_due_at),
                paused=kind.paused,
            )
            for kind in stats.kinds
        ],
        running_by_owner=[
            admin_pb2.OwnerRunning(owner_id=owner, running=running)
            for owner, running in stats.running_by_owner
        ],
        finished_per_minute=[
            admin_pb2.MinuteThroughput(
                minute=timestamp(minute.minute),
                succeeded=minute.succeeded,
                failed=minute.failed,
                cancelled=minute.cancelled,
            )
            for minute in stats.finished_per_minute
        ],
        oldest_queued_due_at=timestamp(stats.oldest_queued_due_at),
        oldest_queued_job_id=stats.oldest_queued_job_id or "",
        computed_at=timestamp(stats.computed_at),
        truncated=stats.truncated,
    )
