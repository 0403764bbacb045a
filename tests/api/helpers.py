"""Small steps the gRPC end-to-end tests share.

Everything here talks to the real server through the real channel. Waiting is done
on the job's own event stream (WatchEvents): every state a test waits for (running,
retry scheduled, terminal) has an event, so nothing here sleeps or polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.support import OWNER, owner_metadata

Stub = jobs_pb2_grpc.JobServiceStub

# Upper bound for anything that should happen "soon" (a claim, a short handler).
WAIT = 15.0
# The app fixture's execution slots (tests/conftest.py: runtime_settings).
CONCURRENCY = 4

TERMINAL = frozenset(
    {jobs_pb2.JOB_STATUS_SUCCEEDED, jobs_pb2.JOB_STATUS_FAILED, jobs_pb2.JOB_STATUS_CANCELLED}
)
TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled"})

QUEUED = jobs_pb2.JOB_STATUS_QUEUED
RUNNING = jobs_pb2.JOB_STATUS_RUNNING
SUCCEEDED = jobs_pb2.JOB_STATUS_SUCCEEDED
FAILED = jobs_pb2.JOB_STATUS_FAILED
CANCELLED = jobs_pb2.JOB_STATUS_CANCELLED


def struct(value: dict[str, Any] | None = None) -> struct_pb2.Struct:
    result = struct_pb2.Struct()
    if value:
        result.update(value)
    return result


async def enqueue(
    stub: Stub,
    kind: str = "example.echo",
    payload: dict[str, Any] | None = None,
    *,
    owner: str = OWNER,
    **fields: Any,
) -> jobs_pb2.EnqueueResponse:
    request = jobs_pb2.EnqueueRequest(kind=kind, payload=struct(payload), **fields)
    return await stub.Enqueue(request, metadata=owner_metadata(owner))


async def get_job(stub: Stub, job_id: str, *, owner: str = OWNER) -> jobs_pb2.Job:
    response = await stub.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=owner_metadata(owner))
    return response.job


async def list_jobs(stub: Stub, *, owner: str = OWNER, **fields: Any) -> jobs_pb2.ListResponse:
    return await stub.List(jobs_pb2.ListRequest(**fields), metadata=owner_metadata(owner))


async def list_all(
    stub: Stub, *, owner: str = OWNER, page_size: int = 500, page_token: str = "", **fields: Any
) -> list[jobs_pb2.Job]:
    """Every job the owner can see with these filters (from `page_token` on),
    following page tokens to the last page."""
    found: list[jobs_pb2.Job] = []
    token = page_token
    while True:
        page = await list_jobs(stub, owner=owner, page_size=page_size, page_token=token, **fields)
        found.extend(page.jobs)
        token = page.next_page_token
        if not token:
            return found


async def collect_events(
    stub: Stub,
    job_id: str,
    *,
    owner: str = OWNER,
    after: int = 0,
    timeout: float = WAIT,
) -> list[jobs_pb2.JobEvent]:
    """Follow WatchEvents until the server ends the stream; it must end OK."""
    call = stub.WatchEvents(
        jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=after),
        metadata=owner_metadata(owner),
    )
    events: list[jobs_pb2.JobEvent] = []
    try:
        async with asyncio.timeout(timeout):
            async for response in call:
                assert response is not None, "a WatchEventsResponse could not be decoded"
                events.append(response.event)
    finally:
        call.cancel()
    assert await call.code() == grpc.StatusCode.OK
    return events


async def wait_for_terminal(
    stub: Stub, job_id: str, *, owner: str = OWNER, timeout: float = WAIT
) -> jobs_pb2.Job:
    """Follow the job's events to its terminal event, then read the job."""
    events = await collect_events(stub, job_id, owner=owner, timeout=timeout)
    assert events and events[-1].type in TERMINAL_EVENTS, [e.type for e in events]
    job = await get_job(stub, job_id, owner=owner)
    assert job.status in TERMINAL
    return job


async def wait_for_event(
    stub: Stub,
    job_id: str,
    event_type: str,
    *,
    owner: str = OWNER,
    after: int = 0,
    timeout: float = WAIT,
) -> jobs_pb2.JobEvent:
    """The first event of `event_type` after `after` (waiting live for it)."""
    call = stub.WatchEvents(
        jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=after),
        metadata=owner_metadata(owner),
    )
    try:
        async with asyncio.timeout(timeout):
            async for response in call:
                if response.event.type == event_type:
                    return response.event
    finally:
        call.cancel()
    raise AssertionError(f"job {job_id} ended without a {event_type} event")


async def start_gate_job(
    stub: Stub, payload: dict[str, Any] | None = None, *, owner: str = OWNER, **fields: Any
) -> jobs_pb2.Job:
    """Enqueue a `test.gate` job and return it once it is running (job.started seen)."""
    response = await enqueue(stub, "test.gate", payload, owner=owner, **fields)
    await wait_for_event(stub, response.job.id, "job.started", owner=owner)
    job = await get_job(stub, response.job.id, owner=owner)
    assert job.status == jobs_pb2.JOB_STATUS_RUNNING
    return job


async def fill_slots(stub: Stub, *, owner: str = OWNER) -> list[str]:
    """Occupy every execution slot with a running gate job, so that whatever is
    enqueued next stays queued until the gate is released."""
    jobs = await asyncio.gather(*(start_gate_job(stub, owner=owner) for _ in range(CONCURRENCY)))
    return [job.id for job in jobs]


# ----- errors ---------------------------------------------------------------------


async def expect_error(awaitable: Awaitable[Any], code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await awaitable
    assert caught.value.code() == code, (caught.value.code(), caught.value.details())
    return caught.value


async def drain(call: Any) -> list[Any]:
    """Read a server stream to its end (raises AioRpcError when it fails)."""
    return [item async for item in call]


def rich_status(err: grpc.aio.AioRpcError) -> status_pb2.Status:
    status = rpc_status.from_call(err)
    assert status is not None, "no grpc-status-details-bin trailer"
    return status


def field_violations(err: grpc.aio.AioRpcError) -> list[str]:
    fields: list[str] = []
    for detail in rich_status(err).details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            fields.extend(violation.field for violation in bad_request.field_violations)
    return fields


def error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    for detail in rich_status(err).details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("no ErrorInfo detail")


def error_reason(err: grpc.aio.AioRpcError) -> str:
    return error_info(err).reason


async def expect_invalid(awaitable: Awaitable[Any], field: str) -> grpc.aio.AioRpcError:
    err = await expect_error(awaitable, grpc.StatusCode.INVALID_ARGUMENT)
    assert field_violations(err) == [field], (field_violations(err), err.details())
    return err


def event_summary(events: Sequence[jobs_pb2.JobEvent]) -> list[tuple[int, str]]:
    return [(event.sequence, event.type) for event in events]


def by_id_call(stub: Stub, rpc: str, job_id: str, owner: str, after: int = 0) -> Awaitable[Any]:
    """Call one of the RPCs that take a job id (Get, Cancel, Retry, WatchEvents,
    drained) as `owner`: the set every existence test probes."""
    metadata = owner_metadata(owner)
    if rpc == "Get":
        return stub.Get(jobs_pb2.GetRequest(job_id=job_id), metadata=metadata)
    if rpc == "Cancel":
        return stub.Cancel(jobs_pb2.CancelRequest(job_id=job_id), metadata=metadata)
    if rpc == "Retry":
        return stub.Retry(jobs_pb2.RetryRequest(job_id=job_id), metadata=metadata)
    request = jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=after)
    return drain(stub.WatchEvents(request, metadata=metadata))
