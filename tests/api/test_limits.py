"""DESIGN §13's limits over a real server: watch streams in total and per owner,
and events per job (a handler's append in process, a remote worker's AppendEvent).
Each refusal is RESOURCE_EXHAUSTED whose message and ErrorInfo name the limit's
flag, and a watch slot is free again once its stream ends."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from leasehold._server.api.watch_streams import WatchLimits
from leasehold._server.app import LeaseholdApp
from leasehold._server.runtime.registry import HandlerRegistry
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from leasehold.worker import EventLimitReached, JobContext
from tests.api.helpers import (
    FAILED,
    SUCCEEDED,
    WAIT,
    collect_events,
    enqueue,
    error_info,
    expect_error,
    get_job,
    start_gate_job,
)
from tests.support import Gate, owner_metadata, test_registry

TOKEN = secrets.token_urlsafe(24)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
MAX_EVENTS = 5  # job.queued and job.started, then room for three of the handler's


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {
        "watch_limits": WatchLimits(max_streams=3, max_streams_per_owner=2),
        "max_events_per_job": MAX_EVENTS,
        "remote_kinds": ("remote.*",),
        "worker_token": TOKEN,
    }


@pytest.fixture
def registry(gate: Gate) -> HandlerRegistry:
    registry = test_registry(gate)
    registry.register("test.chatty", _chatty)
    registry.register("test.overflowing", _overflowing)
    return registry


async def _chatty(ctx: JobContext) -> dict[str, Any]:
    """Appends until refused, then finishes: the limit is a fact it can handle."""
    appended = 0
    try:
        while True:
            await ctx.append_event("chatter", {"n": appended})
            appended += 1
    except EventLimitReached as exc:
        return {"appended": appended, "refused": str(exc)}


async def _overflowing(ctx: JobContext) -> None:
    while True:
        await ctx.append_event("chatter")


def _watch(stub: jobs_pb2_grpc.JobServiceStub, job_id: str, owner: str) -> Any:
    return stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id), metadata=owner_metadata(owner))


async def _open(call: Any) -> None:
    """Until the stream is accepted: its first event (the replayed job.queued) arrived."""
    first = await asyncio.wait_for(call.read(), WAIT)
    assert first.event.type == "job.queued"


async def _refused(call: Any) -> error_details_pb2.ErrorInfo:
    err = await expect_error(call.read(), grpc.StatusCode.RESOURCE_EXHAUSTED)
    info = error_info(err)
    assert info.metadata["limit"] in err.details()
    return info


async def _until(probe: Any, what: str) -> None:
    async with asyncio.timeout(WAIT):
        while not probe():
            await asyncio.sleep(0.01)  # a server-side count has no event to wait on


async def test_watch_streams_per_owner_and_in_total_are_limited_and_freed_when_a_stream_ends(
    app: LeaseholdApp, stub: jobs_pb2_grpc.JobServiceStub
) -> None:
    jobs = {owner: await start_gate_job(stub, owner=owner) for owner in ("alice", "bob")}
    alice = [_watch(stub, jobs["alice"].id, "alice") for _ in range(2)]
    for call in alice:
        await _open(call)

    info = await _refused(_watch(stub, jobs["alice"].id, "alice"))
    assert (info.reason, info.domain) == ("MAX_WATCH_STREAMS_PER_OWNER_EXCEEDED", "leasehold")
    assert dict(info.metadata) == {"limit": "max-watch-streams-per-owner", "value": "2"}

    bob = _watch(stub, jobs["bob"].id, "bob")
    await _open(bob)  # another owner still has room: three open now, the total
    info = await _refused(_watch(stub, jobs["bob"].id, "bob"))
    assert (info.reason, dict(info.metadata)) == (
        "MAX_WATCH_STREAMS_EXCEEDED",
        {"limit": "max-watch-streams", "value": "3"},
    )

    alice[0].cancel()  # the client goes away: its slot is freed for the owner and the total
    await _until(lambda: app.watch_streams.open == 2, "the cancelled stream's slot to be freed")
    again = _watch(stub, jobs["alice"].id, "alice")
    await _open(again)
    for call in (alice[1], bob, again):
        call.cancel()
    await _until(lambda: app.watch_streams.open == 0, "every slot to be freed")


async def test_a_stream_that_ends_with_its_job_frees_its_slot(
    app: LeaseholdApp, stub: jobs_pb2_grpc.JobServiceStub
) -> None:
    for _ in range(3):  # past the per-owner limit of 2, one after another
        job = (await enqueue(stub, "example.echo")).job
        events = await collect_events(stub, job.id)
        assert events[-1].type == "job.succeeded"
    assert app.watch_streams.open == 0


async def test_a_handler_is_refused_past_the_events_per_job_limit_and_can_still_finish(
    stub: jobs_pb2_grpc.JobServiceStub,
) -> None:
    job = (await enqueue(stub, "test.chatty")).job
    events = await collect_events(stub, job.id)

    assert [e.type for e in events] == ["job.queued", "job.started", *["chatter"] * 3, "job.succeeded"]
    done = await get_job(stub, job.id)
    assert done.status == SUCCEEDED
    assert done.result["appended"] == 3
    assert "max-events-per-job (5)" in done.result["refused"]


async def test_an_uncaught_event_limit_fails_the_job_without_another_attempt(
    stub: jobs_pb2_grpc.JobServiceStub,
) -> None:
    job = (await enqueue(stub, "test.overflowing", max_attempts=3)).job
    events = await collect_events(stub, job.id)

    assert events[-1].type == "job.failed"
    done = await get_job(stub, job.id)
    assert (done.status, done.attempt) == (FAILED, 1)
    assert done.error_type == "EventLimitReached"
    assert "max-events-per-job" in done.error_message


async def test_a_remote_workers_append_event_past_the_limit_is_resource_exhausted_naming_it(
    stub: jobs_pb2_grpc.JobServiceStub, channel: grpc.aio.Channel
) -> None:
    worker = worker_pb2_grpc.WorkerServiceStub(channel)
    job = (await enqueue(stub, "remote.work")).job
    claimed = (
        await worker.Claim(
            worker_pb2.ClaimRequest(worker_id="w", kinds=["remote.work"], wait_seconds=WAIT), metadata=AUTH
        )
    ).jobs[0]

    def append() -> Any:
        token = claimed.lease_token
        request = worker_pb2.AppendEventRequest(job_id=job.id, lease_token=token, type="chatter")
        return worker.AppendEvent(request, metadata=AUTH)

    assert [(await append()).sequence for _ in range(3)] == [3, 4, 5]
    err = await expect_error(append(), grpc.StatusCode.RESOURCE_EXHAUSTED)
    info = error_info(err)
    assert (info.reason, dict(info.metadata)) == (
        "MAX_EVENTS_PER_JOB_EXCEEDED",
        {"limit": "max-events-per-job", "value": "5"},
    )
    assert "max-events-per-job" in err.details()
    # The lease still holds: the worker can finish the job.
    request = worker_pb2.CompleteRequest(job_id=job.id, lease_token=claimed.lease_token)
    assert (await worker.Complete(request, metadata=AUTH)).job.status == SUCCEEDED
    # A wrong token is still ABORTED, not told about the limit.
    wrong = worker_pb2.AppendEventRequest(job_id=job.id, lease_token="nope" * 8, type="chatter")
    await expect_error(worker.AppendEvent(wrong, metadata=AUTH), grpc.StatusCode.ABORTED)
