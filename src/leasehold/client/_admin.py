"""`AdminClient`: AdminService, for a caller with the admin role."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from leasehold.client._pages import every_item
from leasehold.client._session import Session
from leasehold.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2

JobStatuses = Iterable[jobs_pb2.JobStatus]


def job_filter(
    statuses: JobStatuses = (),
    kind: str = "",
    owner_id: str = "",
    resource_type: str = "",
    resource_id: str = "",
) -> admin_pb2.JobFilter:
    return admin_pb2.JobFilter(
        statuses=list(statuses),
        kind=kind,
        owner_id=owner_id,
        resource_type=resource_type,
        resource_id=resource_id,
    )


class AdminClient:
    """Made by `Client.admin`: the same channel, credentials and retry rules."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._stub = admin_pb2_grpc.AdminServiceStub(session.channel)

    async def get_queue_stats(self) -> admin_pb2.GetQueueStatsResponse:
        response: admin_pb2.GetQueueStatsResponse = await self._session.read(
            self._stub.GetQueueStats, admin_pb2.GetQueueStatsRequest()
        )
        return response

    async def workers(self) -> admin_pb2.ListWorkersResponse:
        """The remote workers the server knows of (ListWorkers): each one's
        kinds, the jobs it holds and when it was last seen."""
        response: admin_pb2.ListWorkersResponse = await self._session.read(
            self._stub.ListWorkers, admin_pb2.ListWorkersRequest()
        )
        return response

    async def list_all_jobs_page(
        self,
        *,
        page_token: str = "",
        statuses: JobStatuses = (),
        kind: str = "",
        owner_id: str = "",
        resource_type: str = "",
        resource_id: str = "",
        page_size: int = 0,
    ) -> admin_pb2.ListAllJobsResponse:
        request = admin_pb2.ListAllJobsRequest(
            page_token=page_token,
            page_size=page_size,
            filter=job_filter(statuses, kind, owner_id, resource_type, resource_id),
        )
        response: admin_pb2.ListAllJobsResponse = await self._session.read(self._stub.ListAllJobs, request)
        return response

    async def list_all_jobs(
        self,
        *,
        statuses: JobStatuses = (),
        kind: str = "",
        owner_id: str = "",
        resource_type: str = "",
        resource_id: str = "",
        page_size: int = 0,
    ) -> AsyncIterator[jobs_pb2.Job]:
        wanted = list(statuses)  # taken once: an iterator would be empty by the second page
        async for job in every_item(
            lambda token: self.list_all_jobs_page(
                page_token=token,
                statuses=wanted,
                kind=kind,
                owner_id=owner_id,
                resource_type=resource_type,
                resource_id=resource_id,
                page_size=page_size,
            ),
            lambda page: page.jobs,
        ):
            yield job

    async def bulk_cancel(
        self,
        *,
        statuses: JobStatuses = (),
        kind: str = "",
        owner_id: str = "",
        resource_type: str = "",
        resource_id: str = "",
        dry_run: bool,
        confirm_all: bool = False,
    ) -> int:
        """Cancel what the filter matches (or count it, with dry_run); returns the
        number matched. A filter naming no kind, owner or resource matches every
        owner's jobs: acting on it needs confirm_all=True. Retried after
        UNAVAILABLE: cancelling twice is cancelling once."""
        request = admin_pb2.BulkCancelRequest(
            filter=job_filter(statuses, kind, owner_id, resource_type, resource_id),
            dry_run=dry_run,
            confirm_all=confirm_all,
        )
        response: admin_pb2.BulkCancelResponse = await self._session.long_write(
            self._stub.BulkCancel, request
        )
        return response.matched

    async def bulk_retry(
        self,
        *,
        statuses: JobStatuses = (),
        kind: str = "",
        owner_id: str = "",
        resource_type: str = "",
        resource_id: str = "",
        dry_run: bool,
        confirm_all: bool = False,
    ) -> int:
        """Retry what the filter matches (or count it, with dry_run). Retried after
        UNAVAILABLE: the server skips a job that already has a retry, so a repeat
        adds none twice (its count then covers only what was left)."""
        request = admin_pb2.BulkRetryRequest(
            filter=job_filter(statuses, kind, owner_id, resource_type, resource_id),
            dry_run=dry_run,
            confirm_all=confirm_all,
        )
        response: admin_pb2.BulkRetryResponse = await self._session.long_write(self._stub.BulkRetry, request)
        return response.matched

    async def pause_kind(self, kind: str) -> None:
        await self._session.write(self._stub.PauseKind, admin_pb2.PauseKindRequest(kind=kind))

    async def resume_kind(self, kind: str) -> None:
        await self._session.write(self._stub.ResumeKind, admin_pb2.ResumeKindRequest(kind=kind))
