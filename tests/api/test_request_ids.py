"""Idempotent calls over gRPC (DESIGN §14, AIP-155): `request_id` on Enqueue,
BatchEnqueue and Retry, against a real server on each database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import ManualClock
from leasehold._server.config import Settings
from leasehold._server.jobs.idempotency import REQUEST_ID_WINDOW
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc
from tests.api.helpers import (
    FAILED,
    enqueue,
    error_reason,
    expect_error,
    expect_invalid,
    list_all,
    rich_status,
    struct,
    wait_for_terminal,
)
from tests.database_reads import scalar
from tests.support import OTHER_OWNER, OWNER, owner_metadata, sqlite_url, test_registry

Stub = jobs_pb2_grpc.JobServiceStub


def later() -> timestamp_pb2.Timestamp:
    """A run_at an hour ahead: the job stays queued, so answers compare whole."""
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    return stamp


def count(app: LeaseholdApp, statement: str) -> int:
    value: int = scalar(app.settings.database_url, statement)
    return value


def queued_events(app: LeaseholdApp) -> int:
    return count(app, "SELECT count(*) FROM job_events WHERE type = 'job.queued'")


async def batch(
    stub: Stub, items: list[jobs_pb2.EnqueueRequest], request_id: str = "", owner: str = OWNER
) -> Any:
    request = jobs_pb2.BatchEnqueueRequest(requests=items, request_id=request_id)
    return await stub.BatchEnqueue(request, metadata=owner_metadata(owner))


async def retry(stub: Stub, job_id: str, request_id: str = "") -> jobs_pb2.Job:
    request = jobs_pb2.RetryRequest(job_id=job_id, request_id=request_id)
    return (await stub.Retry(request, metadata=owner_metadata(OWNER))).job


async def failed_job(stub: Stub) -> str:
    first = await enqueue(stub, "example.fail", {"message": "boom"}, max_attempts=1)
    assert (await wait_for_terminal(stub, first.job.id)).status == FAILED
    return first.job.id


async def test_a_repeated_enqueue_returns_the_first_job_and_makes_no_second(
    app: LeaseholdApp, stub: Stub
) -> None:
    run_at = later()
    first = await enqueue(stub, payload={"n": 1}, run_at=run_at, request_id="enqueue-1")

    again = await enqueue(stub, payload={"n": 1}, run_at=run_at, request_id="enqueue-1")

    assert first.created and again == first  # the whole answer, created flag included
    assert [job.id for job in await list_all(stub)] == [first.job.id]
    assert count(app, "SELECT count(*) FROM jobs") == 1
    assert queued_events(app) == 1


async def test_a_repeat_shows_the_job_as_it_is_now(stub: Stub) -> None:
    first = await enqueue(stub, payload={"n": 1}, request_id="enqueue-1")
    finished = await wait_for_terminal(stub, first.job.id)

    again = await enqueue(stub, payload={"n": 1}, request_id="enqueue-1")

    assert again.job == finished and again.created


async def test_a_resource_keyed_repeat_keeps_the_first_calls_created_flags(stub: Stub) -> None:
    keyed = {"resource_type": "doc", "resource_id": "7", "run_at": later()}
    existing = await enqueue(stub, **keyed)
    first = await enqueue(stub, request_id="enqueue-7", **keyed)
    assert (first.job.id, first.created) == (existing.job.id, False)

    again = await enqueue(stub, request_id="enqueue-7", **keyed)

    assert again == first


async def test_a_repeated_batch_replays_the_whole_response(app: LeaseholdApp, stub: Stub) -> None:
    run_at = later()
    items = [
        jobs_pb2.EnqueueRequest(kind="example.echo", payload=struct({"i": i}), run_at=run_at)
        for i in range(3)
    ] + [
        jobs_pb2.EnqueueRequest(kind="example.echo", resource_type="doc", resource_id="a", run_at=run_at)
        for _ in range(2)
    ]

    first = await batch(stub, items, "batch-1")
    again = await batch(stub, items, "batch-1")

    assert [r.created for r in first.responses] == [True, True, True, True, False]
    assert again == first
    assert count(app, "SELECT count(*) FROM jobs") == 4
    assert queued_events(app) == 4


async def test_two_retries_with_one_request_id_make_one_new_job(app: LeaseholdApp, stub: Stub) -> None:
    source = await failed_job(stub)

    first = await retry(stub, source, "retry-1")
    again = await retry(stub, source, "retry-1")

    assert first.retry_of_job_id == source
    assert again.id == first.id
    assert count(app, "SELECT count(*) FROM jobs") == 2


async def test_two_retries_without_a_request_id_make_two_new_jobs(app: LeaseholdApp, stub: Stub) -> None:
    """Today's behaviour, kept and documented: a Retry without a request_id acts every time."""
    source = await failed_job(stub)

    first = await retry(stub, source)
    second = await retry(stub, source)

    assert first.id != second.id
    assert {first.retry_of_job_id, second.retry_of_job_id} == {source}
    assert count(app, "SELECT count(*) FROM jobs") == 3


async def test_twenty_concurrent_repeats_make_one_job(app: LeaseholdApp, stub: Stub) -> None:
    answers = await asyncio.gather(
        *(enqueue(stub, payload={"n": 1}, request_id="burst-1") for _ in range(20))
    )

    assert len({answer.job.id for answer in answers}) == 1
    assert all(answer.created for answer in answers)
    assert count(app, "SELECT count(*) FROM jobs") == 1
    assert queued_events(app) == 1


async def test_another_owners_identical_request_id_is_independent(stub: Stub) -> None:
    mine = await enqueue(stub, payload={"n": 1}, request_id="shared-1")

    theirs = await enqueue(stub, payload={"n": 1}, request_id="shared-1", owner=OTHER_OWNER)

    assert theirs.created and theirs.job.id != mine.job.id
    assert [job.id for job in await list_all(stub, owner=OTHER_OWNER)] == [theirs.job.id]
    assert [job.id for job in await list_all(stub)] == [mine.job.id]


@pytest.mark.parametrize("reuse", ["other-payload", "other-method"])
async def test_a_request_id_reused_for_a_different_request_is_refused(
    app: LeaseholdApp, stub: Stub, reuse: str
) -> None:
    first = await enqueue(stub, payload={"n": 1}, request_id="once-1")

    if reuse == "other-payload":
        call = enqueue(stub, payload={"n": 2}, request_id="once-1")
    else:
        call = batch(stub, [jobs_pb2.EnqueueRequest(kind="example.echo", payload=struct({"n": 1}))], "once-1")
    err = await expect_error(call, grpc.StatusCode.FAILED_PRECONDITION)

    assert err.details().startswith("request_id:")
    assert error_reason(err) == "REQUEST_ID_REUSED"
    assert "request_id" in str(rich_status(err).details)  # the violation's subject
    assert [job.id for job in await list_all(stub)] == [first.job.id]


@pytest.mark.parametrize(
    ("request_id", "why"),
    [("x" * 129, "over 128 characters"), ("bad\x07id", "a control character"), ("café", "not ASCII")],
)
async def test_a_malformed_request_id_is_refused_and_nothing_is_written(
    app: LeaseholdApp, stub: Stub, request_id: str, why: str
) -> None:
    await expect_invalid(enqueue(stub, request_id=request_id), "request_id")
    item = jobs_pb2.EnqueueRequest(kind="example.echo")
    await expect_invalid(batch(stub, [item], request_id), "request_id")
    await expect_invalid(retry(stub, "job_0", request_id), "request_id")

    assert count(app, "SELECT count(*) FROM jobs") == 0
    assert count(app, "SELECT count(*) FROM request_ids") == 0


async def test_a_request_id_of_128_printable_characters_is_accepted(stub: Stub) -> None:
    request_id = "~ !" + "x" * 125
    first = await enqueue(stub, request_id=request_id)
    assert (await enqueue(stub, request_id=request_id)).job.id == first.job.id


async def test_an_item_of_a_batch_carries_no_request_id_of_its_own(app: LeaseholdApp, stub: Stub) -> None:
    items = [
        jobs_pb2.EnqueueRequest(kind="example.echo"),
        jobs_pb2.EnqueueRequest(kind="example.echo", request_id="i"),
    ]

    await expect_invalid(batch(stub, items, "batch-1"), "requests[1].request_id")
    await expect_invalid(batch(stub, items), "requests[1].request_id")

    assert count(app, "SELECT count(*) FROM jobs") == 0
    assert count(app, "SELECT count(*) FROM request_ids") == 0


def manual_settings(database_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        listen="127.0.0.1:0",
        runtime=RuntimeSettings(concurrency=2, lease_seconds=6, poll_seconds=0.05),
        retention_seconds=0,  # keeps every job: the sweep of request ids runs anyway
    )


async def test_after_the_window_and_a_sweep_the_request_id_acts_again(database_url: str) -> None:
    clock = ManualClock(datetime.now(UTC))
    app = LeaseholdApp(manual_settings(database_url), clock=clock, registry=test_registry())
    port = await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = Stub(channel)
            first = await enqueue(stub, payload={"n": 1}, request_id="daily-1")
            assert app.retention is not None
            clock.advance(REQUEST_ID_WINDOW.total_seconds() - 1)
            assert await app.retention.forget_request_ids() == 0
            assert (await enqueue(stub, payload={"n": 1}, request_id="daily-1")).job.id == first.job.id

            clock.advance(2)
            assert await app.retention.forget_request_ids() == 1
            again = await enqueue(stub, payload={"n": 1}, request_id="daily-1")

            assert again.created and again.job.id != first.job.id
            assert len(await list_all(stub)) == 2
    finally:
        await app.stop(grace_seconds=0.5)


async def test_a_request_id_survives_a_server_restart(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    answers = []
    for _ in range(2):
        app = LeaseholdApp(manual_settings(url), registry=test_registry())
        port = await app.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                answers.append(await enqueue(Stub(channel), payload={"n": 1}, request_id="restart-1"))
        finally:
            await app.stop(grace_seconds=0.5)

    assert answers[1].job.id == answers[0].job.id and answers[1].created
    assert scalar(url, "SELECT count(*) FROM jobs") == 1
