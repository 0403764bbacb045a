"""Cancel and Retry over gRPC (DESIGN §2, §3 Cancel)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from leasehold._server.jobs.records import NewJob
from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    CANCELLED,
    FAILED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    WAIT,
    collect_events,
    enqueue,
    error_reason,
    event_summary,
    expect_error,
    fill_slots,
    get_job,
    list_all,
    start_gate_job,
    wait_for_event,
    wait_for_terminal,
)
from tests.support import OWNER, owner_metadata


async def _cancel(stub, job_id: str) -> jobs_pb2.Job:
    return (await stub.Cancel(jobs_pb2.CancelRequest(job_id=job_id), metadata=owner_metadata())).job


async def _retry(stub, job_id: str) -> jobs_pb2.Job:
    return (await stub.Retry(jobs_pb2.RetryRequest(job_id=job_id), metadata=owner_metadata())).job


async def _handler_running(gate) -> None:
    async with asyncio.timeout(WAIT):
        await gate.started.wait()


# ----- Cancel ---------------------------------------------------------------------------


async def test_cancel_of_a_queued_job_cancels_it_at_once(stub, app, gate):
    await fill_slots(stub)
    queued = (await enqueue(stub, "example.echo")).job

    cancelled = await _cancel(stub, queued.id)

    assert cancelled.status == CANCELLED
    assert cancelled.attempt == 0
    assert cancelled.HasField("completed_at")
    assert not cancelled.HasField("started_at")
    assert event_summary(await collect_events(stub, queued.id)) == [(1, "job.queued"), (2, "job.cancelled")]

    # Once slots free up, the cancelled job is never claimed: a job enqueued after it runs,
    # and it is still untouched.
    gate.release.set()
    later = (await enqueue(stub, "example.echo")).job
    assert (await wait_for_terminal(stub, later.id)).status == SUCCEEDED
    still = await get_job(stub, queued.id)
    assert still == cancelled


async def test_cancel_of_a_running_job_only_requests_it(stub, app, gate):
    job = await start_gate_job(stub, {"check_cancel": True})
    await _handler_running(gate)

    requested = await _cancel(stub, job.id)

    assert requested.status == RUNNING
    assert requested.HasField("cancel_requested_at")
    assert not requested.HasField("completed_at")
    # Asking again changes nothing and writes no second event.
    again = await _cancel(stub, job.id)
    assert again.cancel_requested_at == requested.cancel_requested_at
    assert again.status == RUNNING

    gate.release.set()
    finished = await wait_for_terminal(stub, job.id)

    assert finished.status == CANCELLED
    assert finished.cancel_requested_at == requested.cancel_requested_at
    assert finished.HasField("completed_at")
    assert event_summary(await collect_events(stub, job.id)) == [
        (1, "job.queued"),
        (2, "job.started"),
        (3, "job.cancel_requested"),
        (4, "job.cancelled"),
    ]


async def test_cancel_wins_over_a_handler_that_returns_normally(stub, app, gate):
    job = await start_gate_job(stub)  # no check_cancel: the handler just returns
    await _handler_running(gate)
    await _cancel(stub, job.id)

    gate.release.set()
    finished = await wait_for_terminal(stub, job.id)

    assert finished.status == CANCELLED
    types = [event.type for event in await collect_events(stub, job.id)]
    assert types[-2:] == ["job.cancel_requested", "job.cancelled"]
    assert "job.succeeded" not in types


async def test_a_handler_failing_after_a_cancel_request_is_not_retried(stub, app, gate):
    # Design §3: attempts left *and no cancel request* → queued; otherwise failed.
    job = await start_gate_job(stub, {"fail": "late failure"}, max_attempts=3)
    await _handler_running(gate)
    await _cancel(stub, job.id)

    gate.release.set()
    finished = await wait_for_terminal(stub, job.id)

    assert finished.status == FAILED
    assert finished.attempt == 1
    assert finished.error_message == "late failure"
    assert [event.type for event in await collect_events(stub, job.id)] == [
        "job.queued",
        "job.started",
        "job.cancel_requested",
        "job.failed",
    ]


async def test_concurrent_cancels_of_a_running_job_write_one_request(stub, app, gate):
    job = await start_gate_job(stub, {"check_cancel": True})

    answers = await asyncio.gather(*(_cancel(stub, job.id) for _ in range(10)))

    assert {answer.status for answer in answers} == {RUNNING}
    assert len({answer.cancel_requested_at.ToNanoseconds() for answer in answers}) == 1
    gate.release.set()
    assert (await wait_for_terminal(stub, job.id)).status == CANCELLED
    types = [event.type for event in await collect_events(stub, job.id)]
    assert types.count("job.cancel_requested") == 1 and types.count("job.cancelled") == 1


async def test_concurrent_cancels_of_a_queued_job_cancel_it_once(stub, app):
    await fill_slots(stub)
    job = (await enqueue(stub, "example.echo")).job

    answers = await asyncio.gather(*(_cancel(stub, job.id) for _ in range(10)))

    assert all(answer == answers[0] for answer in answers)
    assert answers[0].status == CANCELLED
    assert event_summary(await collect_events(stub, job.id)) == [(1, "job.queued"), (2, "job.cancelled")]


async def test_cancel_during_retry_backoff_cancels_at_once(stub, app):
    job = (await enqueue(stub, "example.fail", {"message": "boom"}, max_attempts=3)).job
    await wait_for_event(stub, job.id, "job.retry_scheduled")  # now queued for ~2 s

    cancelled = await _cancel(stub, job.id)

    assert cancelled.status == CANCELLED
    assert cancelled.attempt == 1
    assert event_summary(await collect_events(stub, job.id)) == [
        (1, "job.queued"),
        (2, "job.started"),
        (3, "job.retry_scheduled"),
        (4, "job.cancelled"),
    ]
    copy = await _retry(stub, job.id)
    assert copy.retry_of_job_id == job.id and copy.attempt == 0


@pytest.mark.parametrize("kind", ["example.echo", "example.fail"])
async def test_cancel_of_a_finished_job_returns_it_unchanged(stub, app, kind):
    job = (await enqueue(stub, kind, {"message": "boom"}, max_attempts=1)).job
    finished = await wait_for_terminal(stub, job.id)
    events = await collect_events(stub, job.id)

    assert await _cancel(stub, job.id) == finished
    assert await get_job(stub, job.id) == finished
    assert await collect_events(stub, job.id) == events


async def test_cancel_of_a_cancelled_job_returns_it_unchanged(stub, app):
    await fill_slots(stub)
    job = (await enqueue(stub, "example.echo")).job
    cancelled = await _cancel(stub, job.id)

    assert await _cancel(stub, job.id) == cancelled
    assert len(await collect_events(stub, job.id)) == 2


# ----- Retry ----------------------------------------------------------------------------


async def test_retry_of_a_failed_job_creates_a_linked_copy_that_runs(stub, app):
    source = (
        await enqueue(
            stub,
            "example.fail",
            {"message": "boom-from-the-payload"},
            resource_type="doc",
            resource_id="r1",
            max_attempts=1,
            timeout_seconds=77,
        )
    ).job
    failed = await wait_for_terminal(stub, source.id)
    assert failed.status == FAILED

    copy = await _retry(stub, source.id)

    assert copy.id != source.id
    assert copy.retry_of_job_id == source.id
    assert (copy.kind, copy.resource_type, copy.resource_id) == ("example.fail", "doc", "r1")
    assert (copy.max_attempts, copy.timeout_seconds) == (1, 77)
    assert copy.status == QUEUED and copy.attempt == 0
    assert copy.error_message == "" and copy.error_type == ""
    assert not copy.HasField("started_at") and not copy.HasField("completed_at")
    # The source is left as it was.
    assert await get_job(stub, source.id) == failed

    rerun = await wait_for_terminal(stub, copy.id)
    # It ran with the copied payload: the same message.
    assert rerun.status == FAILED and rerun.attempt == 1
    assert (rerun.error_message, rerun.error_type) == ("boom-from-the-payload", "RuntimeError")
    assert [job.id for job in await list_all(stub)] == [copy.id, source.id]


async def test_retry_of_a_cancelled_job_creates_a_copy_that_runs(stub, app, gate):
    await fill_slots(stub)
    source = (await enqueue(stub, "example.echo", {"copied": ["payload", 1]})).job
    await _cancel(stub, source.id)

    copy = await _retry(stub, source.id)
    assert copy.status == QUEUED and copy.retry_of_job_id == source.id
    assert (copy.max_attempts, copy.timeout_seconds) == (3, 900)

    gate.release.set()
    assert (await wait_for_terminal(stub, copy.id)).status == SUCCEEDED
    echo = [event for event in await collect_events(stub, copy.id) if event.type == "echo"]
    assert len(echo) == 1
    assert echo[0].payload.fields["copied"].list_value.values[0].string_value == "payload"
    assert (await get_job(stub, source.id)).status == CANCELLED


async def test_retry_of_a_retry_links_to_its_own_source(stub, app):
    source = (await enqueue(stub, "example.fail", {"message": "boom"}, max_attempts=1)).job
    await wait_for_terminal(stub, source.id)
    first = await _retry(stub, source.id)
    await wait_for_terminal(stub, first.id)

    second = await _retry(stub, first.id)
    again = await _retry(stub, source.id)

    assert second.retry_of_job_id == first.id
    assert again.retry_of_job_id == source.id
    assert len({source.id, first.id, second.id, again.id}) == 4


async def _assert_not_retryable(stub, job_id: str) -> None:
    before = [job.id for job in await list_all(stub)]
    err = await expect_error(_retry(stub, job_id), grpc.StatusCode.FAILED_PRECONDITION)
    assert error_reason(err) == "JOB_NOT_RETRYABLE"
    assert job_id in err.details()
    assert [job.id for job in await list_all(stub)] == before


async def test_retry_of_a_queued_job_is_failed_precondition(stub, app):
    await fill_slots(stub)
    queued = (await enqueue(stub, "example.echo")).job
    await _assert_not_retryable(stub, queued.id)
    assert (await get_job(stub, queued.id)).status == QUEUED


async def test_retry_of_a_running_job_is_failed_precondition(stub, app):
    running = await start_gate_job(stub)
    await _assert_not_retryable(stub, running.id)


async def test_retry_of_a_succeeded_job_is_failed_precondition(stub, app):
    job = (await enqueue(stub, "example.echo")).job
    assert (await wait_for_terminal(stub, job.id)).status == SUCCEEDED
    await _assert_not_retryable(stub, job.id)


async def test_retry_of_a_job_whose_kind_is_no_longer_served_is_failed_precondition(stub, app):
    # A job of a kind this server does not serve (enqueued under another
    # configuration), cancelled while queued.
    orphan, _ = await app.repository.enqueue(NewJob(owner_id=OWNER, kind="gone.kind", payload={}))
    await app.repository.cancel(OWNER, orphan.id)
    before = [job.id for job in await list_all(stub)]

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.Retry(jobs_pb2.RetryRequest(job_id=orphan.id), metadata=owner_metadata())

    err = raised.value
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(err) == "KIND_NOT_SERVED" and "gone.kind" in err.details()
    assert [job.id for job in await list_all(stub)] == before
