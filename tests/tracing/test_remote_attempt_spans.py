"""A remote worker's attempt is in the caller's trace too: the server hands the
job's traceparent over in ClaimedJob, and the `leasehold worker` runtime (the
`Worker` class, over a real port) opens the attempt's span as its child."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold._server.remote.worker import Worker
from leasehold._server.tracing import ATTRIBUTE_ATTEMPT, ATTRIBUTE_OUTCOME
from leasehold.v1 import jobs_pb2, worker_pb2, worker_pb2_grpc
from leasehold.worker import HandlerRegistry, JobContext
from tests.api.helpers import SUCCEEDED, WAIT, Stub, struct, wait_for_terminal
from tests.support import owner_metadata
from tests.tracing.conftest import SpanRecorder, caller_span

TOKEN = secrets.token_urlsafe(24)
KIND = "remote.traced"


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {"remote_kinds": ("remote.*",), "worker_token": TOKEN}


async def _fail_once(ctx: JobContext) -> None:
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")


@pytest.fixture
async def remote_worker(app: LeaseholdApp) -> AsyncIterator[Worker]:
    registry = HandlerRegistry()
    registry.register(KIND, _fail_once)
    worker = Worker(f"127.0.0.1:{app.port}", registry, TOKEN, claim_wait_seconds=1)
    running = asyncio.create_task(worker.run(), name="test-remote-worker")
    try:
        yield worker
    finally:
        await worker.stop()
        await running


async def _enqueue(stub: Stub, metadata: tuple[tuple[str, str], ...]) -> str:
    retries = jobs_pb2.RetryPolicy(initial_interval_seconds=0.05, max_interval_seconds=0.05)
    request = jobs_pb2.EnqueueRequest(kind=KIND, payload=struct(), retry_policy=retries)
    return str((await stub.Enqueue(request, metadata=metadata)).job.id)


async def test_each_remote_attempts_span_is_the_child_of_the_callers_span(
    stub: Stub, remote_worker: Worker, spans: SpanRecorder
) -> None:
    with caller_span() as caller:
        job_id = await _enqueue(stub, caller.metadata)
    assert (await wait_for_terminal(stub, job_id)).status == SUCCEEDED

    attempts = await spans.attempts_of(job_id, count=2)

    for span in attempts:
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == caller.context.trace_id
        assert span.parent.span_id == caller.context.span_id
    assert [(s.attributes or {})[ATTRIBUTE_ATTEMPT] for s in attempts] == [1, 2]
    assert [(s.attributes or {})[ATTRIBUTE_OUTCOME] for s in attempts] == ["failed", "succeeded"]


async def test_a_remote_job_without_a_traceparent_runs_in_a_root_span(
    stub: Stub, remote_worker: Worker, spans: SpanRecorder
) -> None:
    job_id = await _enqueue(stub, owner_metadata())
    await wait_for_terminal(stub, job_id)

    attempts = await spans.attempts_of(job_id, count=2)

    assert [span.parent for span in attempts] == [None, None]


async def test_claimed_job_carries_the_traceparent_in_version_00_form(
    stub: Stub, channel: grpc.aio.Channel
) -> None:
    """What any remote worker reads, whatever its language: the job's traceparent,
    or an empty string when it has none."""
    sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    traced = await _enqueue(stub, (*owner_metadata(), ("traceparent", sent)))
    untraced = await _enqueue(stub, owner_metadata())
    worker = worker_pb2_grpc.WorkerServiceStub(channel)

    response = await worker.Claim(
        worker_pb2.ClaimRequest(worker_id="w-test", kinds=[KIND], max_jobs=2, wait_seconds=WAIT),
        metadata=(("authorization", f"Bearer {TOKEN}"),),
    )

    assert {claimed.job.id: claimed.traceparent for claimed in response.jobs} == {traced: sent, untraced: ""}
