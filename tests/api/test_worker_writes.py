"""Worker protocol 2's repeatable writes over a real port and a real database
(each engine), on a manual clock: a finishing write sent again answers the job
as the first left it (after a restart, and from another replica too), a token
that never held the job is refused byte for byte as before, an AppendEvent
sent again with its request_id adds one event, and its reply says whether a
cancel was asked for."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold._server.clock import ManualClock, SystemClock
from leasehold._server.config import Settings
from leasehold._server.jobs.records import JobStatus
from leasehold._server.remote.convert import claimed_from_proto
from leasehold._server.remote.heartbeats import LeaseBook
from leasehold._server.remote.store import RemoteAttemptStore
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.api.helpers import (
    enqueue,
    error_reason,
    expect_error,
    expect_invalid,
    get_job,
    rich_status,
    struct,
)
from tests.support import OWNER, owner_metadata, test_registry

TOKEN = secrets.token_urlsafe(24)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
KIND = "remote.work"


@dataclass
class Server:
    app: LeaseholdApp
    jobs: jobs_pb2_grpc.JobServiceStub
    worker: worker_pb2_grpc.WorkerServiceStub


def settings(database_url: str) -> Settings:
    return Settings(
        database_url=database_url,
        listen="127.0.0.1:0",
        runtime=RuntimeSettings(concurrency=1, lease_seconds=30, poll_seconds=0.05),
        remote_kinds=("remote.*",),
        worker_token=TOKEN,
    )


@asynccontextmanager
async def serving(database_url: str, clock: ManualClock) -> AsyncIterator[Server]:
    """One server (a replica, when another runs on the same database)."""
    app = LeaseholdApp(settings(database_url), clock=clock, registry=test_registry())
    port = await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Server(
                app, jobs_pb2_grpc.JobServiceStub(channel), worker_pb2_grpc.WorkerServiceStub(channel)
            )
    finally:
        await app.stop(grace_seconds=0.5)


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock(datetime.now(UTC))


@pytest.fixture
async def server(database_url: str, manual_clock: ManualClock) -> AsyncIterator[Server]:
    async with serving(database_url, manual_clock) as running:
        yield running


async def claim(server: Server, **enqueue_fields: Any) -> worker_pb2.ClaimedJob:
    await enqueue(server.jobs, KIND, {"n": 1}, **enqueue_fields)
    response = await server.worker.Claim(
        worker_pb2.ClaimRequest(worker_id="w-test", kinds=[KIND], wait_seconds=5), metadata=AUTH
    )
    (claimed,) = response.jobs
    return claimed


async def logged(server: Server, job_id: str) -> list[Any]:
    """The job's events as stored (WatchEvents would wait for a live job's end)."""
    repository = server.app.repository
    assert repository is not None
    return list(await repository.list_events(OWNER, job_id, 0, 1000))


def lease_of(claimed: worker_pb2.ClaimedJob) -> dict[str, str]:
    return {"job_id": claimed.job.id, "lease_token": claimed.lease_token}


def complete(worker: worker_pb2_grpc.WorkerServiceStub, lease: dict[str, str]) -> Awaitable[Any]:
    return worker.Complete(worker_pb2.CompleteRequest(**lease, result=struct({"total": 3})), metadata=AUTH)


def refusal(err: grpc.aio.AioRpcError) -> tuple[Any, ...]:
    """Everything a worker sees of a refusal."""
    return (err.code(), err.details(), rich_status(err).SerializeToString(deterministic=True))


Write = Callable[[worker_pb2_grpc.WorkerServiceStub, dict[str, str]], Awaitable[Any]]

WRITES: dict[str, Write] = {
    "Complete": complete,
    "Fail": lambda w, lease: w.Fail(
        worker_pb2.FailRequest(**lease, error_message="boom", retry_after_seconds=60), metadata=AUTH
    ),
    "Snooze": lambda w, lease: w.Snooze(worker_pb2.SnoozeRequest(**lease, delay_seconds=60), metadata=AUTH),
    "ConfirmCancel": lambda w, lease: w.ConfirmCancel(
        worker_pb2.ConfirmCancelRequest(**lease), metadata=AUTH
    ),
}


@pytest.mark.parametrize("rpc", list(WRITES))
async def test_a_finishing_write_sent_again_answers_the_same_job(server: Server, rpc: str) -> None:
    claimed = await claim(server, max_attempts=3)
    lease = lease_of(claimed)
    if rpc == "ConfirmCancel":
        await server.jobs.Cancel(jobs_pb2.CancelRequest(job_id=claimed.job.id), metadata=owner_metadata())

    first = await WRITES[rpc](server.worker, lease)
    again = await WRITES[rpc](server.worker, lease)

    assert again == first
    events = [event.type for event in await logged(server, claimed.job.id)]
    assert len(events) == len(set(events))  # the write's lifecycle event once


async def test_a_fail_sent_again_answers_as_it_left_the_job_while_attempt_two_runs(
    server: Server, manual_clock: ManualClock
) -> None:
    claimed = await claim(server, max_attempts=3)
    lease = lease_of(claimed)
    first = await WRITES["Fail"](server.worker, lease)
    manual_clock.advance(61)
    second = await server.worker.Claim(
        worker_pb2.ClaimRequest(worker_id="w-2", kinds=[KIND], wait_seconds=5), metadata=AUTH
    )
    assert second.jobs[0].job.attempt == 2

    again = await WRITES["Fail"](server.worker, lease)

    assert again == first and again.job.status == jobs_pb2.JOB_STATUS_QUEUED and again.job.attempt == 1
    assert (await get_job(server.jobs, claimed.job.id)).status == jobs_pb2.JOB_STATUS_RUNNING


async def test_only_the_token_that_finished_the_job_is_answered_again(server: Server) -> None:
    claimed = await claim(server)
    stranger = {"job_id": claimed.job.id, "lease_token": "never-held-this-job"}
    before = refusal(await expect_error(complete(server.worker, stranger), grpc.StatusCode.ABORTED))

    await complete(server.worker, lease_of(claimed))
    after = refusal(await expect_error(complete(server.worker, stranger), grpc.StatusCode.ABORTED))
    # Another write by the token that completed: the record is of a Complete.
    other = await expect_error(WRITES["Fail"](server.worker, lease_of(claimed)), grpc.StatusCode.ABORTED)

    assert after == before and refusal(other) == before
    # While the token that completed is still answered: only it learns the outcome.
    assert (await complete(server.worker, lease_of(claimed))).job.status == jobs_pb2.JOB_STATUS_SUCCEEDED


async def test_a_repeat_is_answered_after_a_restart_and_by_another_replica(
    database_url: str, manual_clock: ManualClock
) -> None:
    async with serving(database_url, manual_clock) as first:
        claimed = await claim(first)
        lease = lease_of(claimed)
        async with serving(database_url, manual_clock) as replica:
            done = await complete(first.worker, lease)
            assert await complete(replica.worker, lease) == done
    async with serving(database_url, manual_clock) as restarted:
        assert await complete(restarted.worker, lease) == done
        assert done.job.status == jobs_pb2.JOB_STATUS_SUCCEEDED


async def test_an_append_sent_again_with_its_request_id_adds_one_event(server: Server) -> None:
    claimed = await claim(server)
    lease = lease_of(claimed)

    def append(request_id: str, done: int) -> Awaitable[worker_pb2.AppendEventResponse]:
        request = worker_pb2.AppendEventRequest(
            **lease, type="progress", payload=struct({"done": done}), request_id=request_id
        )
        return server.worker.AppendEvent(request, metadata=AUTH)

    first = await append("step-1", 1)
    again = await append("step-1", 1)
    mismatch = await expect_error(append("step-1", 2), grpc.StatusCode.FAILED_PRECONDITION)

    assert again.sequence == first.sequence
    assert error_reason(mismatch) == "REQUEST_ID_REUSED"
    events = await logged(server, claimed.job.id)
    assert [event.type for event in events].count("progress") == 1
    await expect_invalid(append("x" * 129, 1), "request_id")
    await expect_invalid(append("tab\there", 1), "request_id")


async def test_an_append_reply_says_whether_a_cancel_was_asked_for(server: Server) -> None:
    claimed = await claim(server)
    request = worker_pb2.AppendEventRequest(**lease_of(claimed), type="progress", payload=struct({}))

    before = await server.worker.AppendEvent(request, metadata=AUTH)
    await server.jobs.Cancel(jobs_pb2.CancelRequest(job_id=claimed.job.id), metadata=owner_metadata())
    after = await server.worker.AppendEvent(request, metadata=AUTH)

    assert not before.cancel_requested and after.cancel_requested


async def test_the_server_names_its_new_features(server: Server) -> None:
    info = await server.worker.GetServerInfo(worker_pb2.GetServerInfoRequest(), metadata=AUTH)
    assert {"idempotent_finish", "append_request_id"} <= set(info.features)


async def test_the_python_worker_s_retried_finishing_write_gets_the_job_back(server: Server) -> None:
    """What `leasehold worker`'s executor does when a Complete's reply is lost
    (UNAVAILABLE): it sends the same Complete again, and is told it landed."""
    claimed = claimed_from_proto(await claim(server))
    leases = LeaseBook(
        lambda request, timeout: server.worker.Heartbeat(request, metadata=AUTH, timeout=timeout),
        SystemClock(),
    )
    leases.hold(claimed, 10)
    store = RemoteAttemptStore(server.worker, leases, TOKEN, SystemClock())

    first = await store.succeed(claimed.lease, {"total": 3})
    again = await store.succeed(claimed.lease, {"total": 3})

    assert again == first and again.status is JobStatus.SUCCEEDED
