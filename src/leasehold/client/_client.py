"""`Client`: JobService and ScheduleService for one owner's credentials."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import grpc

from leasehold.client._admin import AdminClient
from leasehold.client._connection import Tls, credential_metadata, open_channel
from leasehold.client._convert import ParentFailure, enqueue_request
from leasehold.client._feed import feed_filter, subscribe
from leasehold.client._pages import every_item
from leasehold.client._retry import RetryOptions
from leasehold.client._schedules import ScheduleCalls
from leasehold.client._session import Session
from leasehold.client._watch import watch_events
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

JobStatuses = Iterable[jobs_pb2.JobStatus]


def new_request_id() -> str:
    """The AIP-155 id that makes a retried write safe: one per call, reused on each
    of that call's tries."""
    return str(uuid.uuid4())


class Client(ScheduleCalls):
    """An async client of one Leasehold service, as one caller.

    `owner` sends `x-owner-id` (`serve --auth header`); `token` sends a bearer token
    (`--auth token` and `jwt`). `tls=True` uses the system roots; a `Tls` gives a
    private CA and/or a client certificate. Pass `channel` to share one channel
    between many clients: `close()` then leaves it open.
    """

    def __init__(
        self,
        target: str,
        *,
        owner: str | None = None,
        token: str | None = None,
        tls: bool | Tls | None = None,
        channel: grpc.aio.Channel | None = None,
        retry: RetryOptions | None = None,
    ) -> None:
        self._owns_channel = channel is None
        self._session = Session(
            target=target,
            channel=channel if channel is not None else open_channel(target, tls),
            metadata=credential_metadata(owner, token),
            retry=retry or RetryOptions(),
        )
        self._jobs = jobs_pb2_grpc.JobServiceStub(self._session.channel)
        super().__init__(self._session)

    async def close(self) -> None:
        if self._owns_channel:
            await self._session.channel.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def admin(self) -> AdminClient:
        """AdminService over the same channel and credentials (the admin role)."""
        return AdminClient(self._session)

    # ----- JobService ---------------------------------------------------------------

    async def enqueue(
        self,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        resource_type: str = "",
        resource_id: str = "",
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int = 0,
        timeout_seconds: int = 0,
        retry_policy: jobs_pb2.RetryPolicy | None = None,
        depends_on: Sequence[str] = (),
        on_parent_failure: ParentFailure | None = None,
        request_id: str | None = None,
    ) -> jobs_pb2.EnqueueResponse:
        """`depends_on`: ids of the caller's jobs this one waits for (at most
        100); it is claimed once they all succeeded, and `on_parent_failure`
        says what a parent's failure does: "cancel" (the default) ends it
        cancelled, "run" runs it once every parent has ended."""
        request = enqueue_request(
            kind,
            payload,
            resource_type=resource_type,
            resource_id=resource_id,
            run_at=run_at,
            priority=priority,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
            retry_policy=retry_policy,
            depends_on=depends_on,
            on_parent_failure=on_parent_failure,
        )
        request.request_id = request_id or new_request_id()
        response: jobs_pb2.EnqueueResponse = await self._session.write(self._jobs.Enqueue, request)
        return response

    async def batch_enqueue(
        self, requests: Sequence[jobs_pb2.EnqueueRequest], *, request_id: str | None = None
    ) -> builtins.list[jobs_pb2.EnqueueResponse]:
        """Every item in one transaction, all or nothing (`enqueue_request`
        makes one, with `ref=` and `depends_on_refs=` for a graph of jobs);
        the answers come in the items' order."""
        request = jobs_pb2.BatchEnqueueRequest(requests=requests, request_id=request_id or new_request_id())
        response: jobs_pb2.BatchEnqueueResponse = await self._session.write(self._jobs.BatchEnqueue, request)
        return list(response.responses)

    async def get(self, job_id: str) -> jobs_pb2.Job:
        response: jobs_pb2.GetResponse = await self._session.read(
            self._jobs.Get, jobs_pb2.GetRequest(job_id=job_id)
        )
        return response.job

    async def stats(self) -> jobs_pb2.GetStatsResponse:
        """How many of the caller's jobs stand in each status, in all and per
        kind (GetStats): every job, not a page of them."""
        response: jobs_pb2.GetStatsResponse = await self._session.read(
            self._jobs.GetStats, jobs_pb2.GetStatsRequest()
        )
        return response

    async def list_page(
        self,
        *,
        page_token: str = "",
        statuses: JobStatuses = (),
        kind: str = "",
        resource_type: str = "",
        resource_id: str = "",
        depends_on: str = "",
        page_size: int = 0,
    ) -> jobs_pb2.ListResponse:
        request = jobs_pb2.ListRequest(
            page_token=page_token,
            page_size=page_size,
            statuses=list(statuses),
            kind=kind,
            resource_type=resource_type,
            resource_id=resource_id,
            depends_on=depends_on,
        )
        response: jobs_pb2.ListResponse = await self._session.read(self._jobs.List, request)
        return response

    async def list(
        self,
        *,
        statuses: JobStatuses = (),
        kind: str = "",
        resource_type: str = "",
        resource_id: str = "",
        depends_on: str = "",
        page_size: int = 0,
    ) -> AsyncIterator[jobs_pb2.Job]:
        """Every job the filter matches, newest first, fetching pages as it goes;
        `depends_on=job_id`: only that job's children."""
        wanted = list(statuses)  # taken once: an iterator would be empty by the second page
        async for job in every_item(
            lambda token: self.list_page(
                page_token=token,
                statuses=wanted,
                kind=kind,
                resource_type=resource_type,
                resource_id=resource_id,
                depends_on=depends_on,
                page_size=page_size,
            ),
            lambda page: page.jobs,
        ):
            yield job

    async def cancel(self, job_id: str) -> jobs_pb2.Job:
        response: jobs_pb2.CancelResponse = await self._session.write(
            self._jobs.Cancel, jobs_pb2.CancelRequest(job_id=job_id)
        )
        return response.job

    async def retry(self, job_id: str, *, request_id: str | None = None) -> jobs_pb2.Job:
        request = jobs_pb2.RetryRequest(job_id=job_id, request_id=request_id or new_request_id())
        response: jobs_pb2.RetryResponse = await self._session.write(self._jobs.Retry, request)
        return response.job

    def watch(
        self, job_id: str, *, after_sequence: int = 0, deadline_seconds: float | None = None
    ) -> AsyncIterator[jobs_pb2.JobEvent]:
        """The job's events after `after_sequence`, replayed then live, ending after
        its terminal event.

        A watch outlives its server: when the stream breaks (the server was killed,
        restarted or drained) it reconnects with capped, jittered backoff and
        resumes after the last event it yielded, so the caller sees each event once,
        in order; the first event after a break is preceded by one INFO record on
        the `leasehold.client` logger ("reconnected to ..."). Reconnecting goes on
        as long as the job runs: a restart may take as long as its drain does.
        `deadline_seconds` bounds it instead (each break, until events flow
        again); then the last error is raised.

        Reaching the service in the first place is a call like any other: retried
        within `RetryOptions.deadline_seconds`, and a job that is not the caller's
        raises at once."""
        return watch_events(self._session, job_id, after_sequence, deadline_seconds)

    def subscribe(
        self,
        *,
        after_position: str = "",
        kinds: Sequence[str] = (),
        resource_type: str = "",
        event_types: Sequence[str] = (),
        tail: bool = False,
        deadline_seconds: float | None = None,
    ) -> AsyncIterator[jobs_pb2.SubscribeResponse]:
        """The owner's feed (Subscribe): every event of every job of the caller
        that matches the filters (empty: all), in commit order, after
        `after_position` (empty: from the oldest event retention kept), then live.
        It never ends by itself; stop iterating to leave it.

        This is how a backend keeps its own records in step with its jobs without
        polling and without a stream per job, so the feed outlives its server:
        when the stream breaks (the server was killed, restarted or drained) it
        reconnects with capped, jittered backoff and `after_position` set to the
        position of the last response it yielded, so no event is yielded twice or
        skipped. The first response after a break is preceded by one INFO record
        on the `leasehold.client` logger ("reconnected to ..."). Reconnecting goes
        on as long as the caller iterates; `deadline_seconds` bounds each break
        instead, and then the last error is raised.

        Store `response.position` once an event is processed, and pass it back
        as `after_position` to resume in a new process. Storing it and acting on
        the event are two writes, so a crash between them hands that event over
        again: a handler of the feed must be idempotent on its own side.

        `tail=True` starts at the end of the feed (`after_position` must then be
        empty). If the stream breaks before its first event, the reconnect asks
        for the end again, so events committed during that break are not
        replayed; after the first event it resumes from that event's position.

        Reaching the service in the first place is a call like any other:
        retried within `RetryOptions.deadline_seconds` until the service has
        answered. A status that no retry can change (INVALID_ARGUMENT for a bad
        filter or position, OUT_OF_RANGE with reason FEED_POSITION_EXPIRED for a
        position retention has deleted, PERMISSION_DENIED) raises at once."""
        return subscribe(
            self._session,
            feed_filter(kinds, resource_type, event_types),
            after_position,
            tail,
            deadline_seconds,
        )
