"""The remote store: each write is its WorkerService call, and each status the
server answers is the domain exception the executor already handles."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

import grpc
import pytest
from structlog.testing import capture_logs

from leasehold._server.clock import SystemClock
from leasehold._server.jobs.errors import InvalidArgument, LeaseLost, StorageFull, StorageUnavailable
from leasehold._server.jobs.records import ClaimedJob, JobStatus
from leasehold._server.remote.calls import auth_metadata
from leasehold._server.remote.convert import claimed_from_proto
from leasehold._server.remote.heartbeats import LeaseBook
from leasehold._server.remote.store import RemoteAttemptStore
from leasehold.v1 import worker_pb2_grpc
from leasehold.worker import HandlerRegistry, JobContext
from tests.remote_worker.fake_server import (
    TOKEN,
    WAIT_TIMEOUT_SECONDS,
    FakeWorkerService,
    fake_server,
    running_worker,
)


class Remote(NamedTuple):
    service: FakeWorkerService
    store: RemoteAttemptStore
    claimed: ClaimedJob
    leases: LeaseBook


@pytest.fixture
async def remote() -> AsyncIterator[Remote]:
    """A store on the fake service, holding one claimed job's lease."""
    async with fake_server() as (service, address), grpc.aio.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        metadata = auth_metadata(TOKEN)
        leases = LeaseBook(
            lambda request, timeout: stub.Heartbeat(request, metadata=metadata, timeout=timeout),
            SystemClock(),
        )
        await service.enqueue("test.any")
        claimed = claimed_from_proto(service.queued.pop())
        leases.hold(claimed, 0.05)
        yield Remote(service, RemoteAttemptStore(stub, leases, TOKEN, SystemClock()), claimed, leases)


async def test_each_write_is_its_call_fenced_by_the_lease_token(
    remote: Remote,
) -> None:
    service, store, claimed, leases = remote
    lease = claimed.lease
    event = await store.append_event(lease, "progress", {"done": 1})
    failed = await store.fail(lease, "boom", retryable=False, error_type="ValueError")
    released = await store.release(lease)
    cancelled = await store.mark_cancelled(lease)
    done = await store.succeed(lease, {"answer": 42})
    assert [call.method for call in service.writes()] == [
        "AppendEvent",
        "Fail",
        "Snooze",
        "ConfirmCancel",
        "Complete",
    ]
    assert all(call.request.lease_token == lease.token for call in service.writes())
    assert all(call.metadata["authorization"] == f"Bearer {TOKEN}" for call in service.writes())
    fail, snooze, complete = (
        service.named("Fail")[0],
        service.named("Snooze")[0],
        service.named("Complete")[0],
    )
    assert (fail.request.error_message, fail.request.error_type, fail.request.non_retryable) == (
        "boom",
        "ValueError",
        True,
    )
    assert snooze.request.delay_seconds == 1  # handed back at once, the attempt not counted
    assert dict(complete.request.result) == {"answer": 42}
    assert event.sequence == 1
    assert (failed.status, released.status, cancelled.status, done.status) == (
        JobStatus.QUEUED,
        JobStatus.QUEUED,
        JobStatus.CANCELLED,
        JobStatus.SUCCEEDED,
    )
    assert done.owner_id == "owner-1"


async def test_a_success_without_a_result_sends_none(
    remote: Remote,
) -> None:
    service, store, claimed, leases = remote
    await store.succeed(claimed.lease, None)
    assert not service.named("Complete")[0].request.HasField("result")


@pytest.mark.parametrize(
    ("code", "raised"),
    [
        (grpc.StatusCode.ABORTED, LeaseLost),
        (grpc.StatusCode.UNAVAILABLE, StorageUnavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, StorageUnavailable),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, StorageFull),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
    ],
)
async def test_statuses_become_the_exceptions_the_executor_handles(
    remote: Remote, code: grpc.StatusCode, raised: type
) -> None:
    service, store, claimed, leases = remote
    service.fail_next("Complete", code)
    with pytest.raises(raised):
        await store.succeed(claimed.lease, {"n": 1})


async def test_invalid_argument_names_the_field_from_the_bad_request_detail(
    remote: Remote,
) -> None:
    service, store, claimed, leases = remote
    service.bad_request_field = "payload"
    service.fail_next("AppendEvent", grpc.StatusCode.INVALID_ARGUMENT)
    with pytest.raises(InvalidArgument) as raised:
        await store.append_event(claimed.lease, "progress", {})
    assert (raised.value.field, raised.value.description) == ("payload", "is too large")


async def test_a_lease_known_lost_sends_nothing(
    remote: Remote,
) -> None:
    service, store, claimed, leases = remote
    service.lost.add(claimed.job.id)
    await leases.beat_once()
    with pytest.raises(LeaseLost):
        await store.succeed(claimed.lease, None)
    with pytest.raises(LeaseLost):
        await store.cancel_requested(claimed.lease)
    assert service.writes() == []


async def test_aborted_from_complete_is_logged_lease_lost_and_the_worker_goes_on() -> None:
    async def answer(ctx: JobContext) -> dict[str, int]:
        return {"n": ctx.payload["n"]}

    registry = HandlerRegistry()
    registry.register("test.answer", answer)
    async with fake_server() as (service, address):
        service.fail_next("Complete", grpc.StatusCode.ABORTED)
        with capture_logs() as logs:
            async with running_worker(address, registry):
                first = await service.enqueue("test.answer", {"n": 1})
                await service.until(lambda: len(service.named("Complete")) == 1)
                second = await service.enqueue("test.answer", {"n": 2})
                await service.until(lambda: len(service.named("Complete")) == 2)
                # The first attempt logs its lost lease once the ABORTED answer reaches
                # it, which a loaded machine may let the second job's Complete overtake.
                async with asyncio.timeout(WAIT_TIMEOUT_SECONDS):
                    while not any(entry["event"] == "job.lease_lost" for entry in logs):
                        await asyncio.sleep(0.01)  # a log record has no event to wait on
    assert [call.request.job_id for call in service.named("Complete")] == [first, second]
    lost = [entry for entry in logs if entry["event"] == "job.lease_lost"]
    assert [entry["job_id"] for entry in lost] == [first]
    assert not [entry for entry in logs if entry["log_level"] == "error"]


async def test_an_append_is_retried_after_unavailable_under_one_request_id(remote: Remote) -> None:
    service, store, claimed, leases = remote
    service.fail_next("AppendEvent", grpc.StatusCode.UNAVAILABLE, times=2)

    event = await store.append_event(claimed.lease, "progress", {"done": 1})

    tries = service.named("AppendEvent")
    assert len(tries) == 3 and event.sequence == 3
    assert len({call.request.request_id for call in tries}) == 1 and tries[0].request.request_id
    await store.append_event(claimed.lease, "progress", {"done": 2})
    assert service.named("AppendEvent")[-1].request.request_id != tries[0].request.request_id


async def test_an_outcome_whose_answer_was_lost_is_sent_again_though_the_lease_is_since_reported_lost(
    remote: Remote,
) -> None:
    """The Complete may have landed, and the server then reports its lease
    lost (a Claim's `held` news, a heartbeat): only the retry's answer says
    how the job ended, so the retry goes out with the same token."""
    service, store, claimed, leases = remote
    leases.finishing(claimed.lease)  # the handler has stopped
    service.fail_next("Complete", grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(StorageUnavailable):
        await store.succeed(claimed.lease, {"n": 1})
    service.lost.add(claimed.job.id)
    await leases.beat_once()

    job = await store.succeed(claimed.lease, {"n": 1})

    tries = service.named("Complete")
    assert len(tries) == 2 and {call.request.lease_token for call in tries} == {claimed.lease.token}
    assert job.status is JobStatus.SUCCEEDED
