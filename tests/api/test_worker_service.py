"""WorkerService against a real server on a real port and a real database (each
engine): the protocol step by step, the fencing of every write, and the answer
to every kind of bad input, each of which must leave the job as it was."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from leasehold._server.app import LeaseholdApp
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.api.helpers import (
    WAIT,
    collect_events,
    drain,
    enqueue,
    error_reason,
    expect_error,
    expect_invalid,
    get_job,
    list_jobs,
    struct,
    wait_for_event,
    wait_for_terminal,
)
from tests.support import OWNER

TOKEN = secrets.token_urlsafe(24)
REMOTE_KIND = "remote.work"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
WorkerStub = worker_pb2_grpc.WorkerServiceStub


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {"remote_kinds": ("remote.*",), "worker_token": TOKEN, "cancel_grace_seconds": 2.0}


@pytest.fixture
def worker(channel: grpc.aio.Channel) -> WorkerStub:
    return WorkerStub(channel)


async def _until_claims_wait(app: LeaseholdApp, count: int) -> None:
    """Until exactly `count` Claims are asleep in the server's long poll. A signal,
    not a sleep: a sleep of any length can end before a loaded server has taken the
    first look."""
    claimer = app.claimer
    assert claimer is not None
    async with asyncio.timeout(WAIT):
        while claimer.waiting != count:
            await asyncio.sleep(0.01)  # a server-side count has no event to wait on


async def claim_one(worker: WorkerStub, wait: float = WAIT, **fields: Any) -> worker_pb2.ClaimedJob:
    request = worker_pb2.ClaimRequest(worker_id="w-test", kinds=[REMOTE_KIND], wait_seconds=wait, **fields)
    response = await worker.Claim(request, metadata=AUTH)
    assert len(response.jobs) == 1, response
    return response.jobs[0]


async def running_remote_job(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub, **fields: Any
) -> worker_pb2.ClaimedJob:
    await enqueue(stub, REMOTE_KIND, {"n": 1}, **fields)
    return await claim_one(worker)


async def test_a_remote_worker_claims_appends_heartbeats_and_completes_with_a_result(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    info = await worker.GetServerInfo(worker_pb2.GetServerInfoRequest(), metadata=AUTH)
    assert info.protocol_version == 1 and "results" in info.features and info.server_version

    job_id = (await enqueue(stub, REMOTE_KIND, {"n": 3})).job.id
    claimed = await claim_one(worker)
    assert claimed.job.id == job_id and claimed.owner_id == OWNER
    assert dict(claimed.payload) == {"n": 3} and claimed.job.attempt == 1
    assert claimed.heartbeat_interval_seconds == pytest.approx(6 / 3)
    lease = {"job_id": job_id, "lease_token": claimed.lease_token}

    appended = await worker.AppendEvent(
        worker_pb2.AppendEventRequest(**lease, type="progress", payload=struct({"done": 1})), metadata=AUTH
    )
    beat = await worker.Heartbeat(
        worker_pb2.HeartbeatRequest(leases=[worker_pb2.LeaseRef(**lease)]), metadata=AUTH
    )
    (state,) = beat.states
    assert not state.lost and not state.cancel_requested
    assert state.lease_expires_at.ToDatetime() > claimed.lease_expires_at.ToDatetime()

    done = await worker.Complete(
        worker_pb2.CompleteRequest(**lease, result=struct({"sum": 6})), metadata=AUTH
    )
    assert done.job.status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert dict((await get_job(stub, job_id)).result) == {"sum": 6}
    (listed,) = (await list_jobs(stub)).jobs
    assert not listed.HasField("result")  # List never carries results
    events = await collect_events(stub, job_id)
    assert [(e.sequence, e.type) for e in events] == [
        (1, "job.queued"),
        (2, "job.started"),
        (appended.sequence, "progress"),
        (4, "job.succeeded"),
    ]


async def test_a_waiting_claim_is_woken_by_an_enqueue(
    app: LeaseholdApp, stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    waiting = asyncio.ensure_future(claim_one(worker, wait=30))
    await _until_claims_wait(app, 1)  # the poll found nothing and is asleep
    assert not waiting.done()
    job_id = (await enqueue(stub, REMOTE_KIND)).job.id
    # Woken with the job, not returned empty at the end of its wait: WAIT is half of it.
    claimed = await asyncio.wait_for(waiting, WAIT)
    assert claimed.job.id == job_id


async def test_a_claim_its_client_cancels_takes_no_job_with_it(
    app: LeaseholdApp, stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    """A worker that gives up a long poll (it is stopping, say) leaves what is
    enqueued next to the next Claim, at attempt 1, long before any lease
    (6 s here) could have lapsed: the dead poll never held it.

    The enqueue waits until the server has heard of the cancel. A cancel and
    the next request may reach it in either order (the client's transport
    sends each in its own time), and an answer already sent cannot be called
    back: its jobs return when their lease lapses."""
    abandoned = worker.Claim(
        worker_pb2.ClaimRequest(worker_id="w-gone", kinds=[REMOTE_KIND], wait_seconds=30), metadata=AUTH
    )
    await _until_claims_wait(app, 1)  # the poll has looked once and is waiting
    abandoned.cancel()
    await _until_claims_wait(app, 0)
    job_id = (await enqueue(stub, REMOTE_KIND)).job.id

    # The next Claim gives up before the lease could lapse: it gets the job only if the dead
    # poll never held it, or handed it back at once.
    assert app.settings.runtime.lease_seconds > 5
    claimed = await claim_one(worker, wait=5)
    assert (claimed.job.id, claimed.job.attempt) == (job_id, 1)
    with pytest.raises(asyncio.CancelledError):
        await abandoned


async def test_an_empty_claim_returns_after_its_wait_and_the_in_process_runtime_leaves_remote_kinds(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    job_id = (await enqueue(stub, "remote.other")).job.id  # remote, but this worker does not ask for it
    response = await worker.Claim(
        worker_pb2.ClaimRequest(worker_id="w", kinds=[REMOTE_KIND], wait_seconds=0.2), metadata=AUTH
    )
    assert list(response.jobs) == []
    # A local job enqueued after it runs to the end: the in-process runtime has claimed since,
    # and it would have taken the older job first had remote kinds been its to take.
    later = (await enqueue(stub, "example.echo")).job.id
    assert (await wait_for_terminal(stub, later)).status == jobs_pb2.JOB_STATUS_SUCCEEDED
    assert (await get_job(stub, job_id)).status == jobs_pb2.JOB_STATUS_QUEUED


async def test_a_cancel_reaches_the_worker_in_its_heartbeat_and_confirm_cancel_ends_the_job(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    claimed = await running_remote_job(stub, worker)
    ref = worker_pb2.LeaseRef(job_id=claimed.job.id, lease_token=claimed.lease_token)
    await stub.Cancel(jobs_pb2.CancelRequest(job_id=claimed.job.id), metadata=(("x-owner-id", OWNER),))
    (state,) = (await worker.Heartbeat(worker_pb2.HeartbeatRequest(leases=[ref]), metadata=AUTH)).states
    assert state.cancel_requested and not state.lost
    done = await worker.ConfirmCancel(
        worker_pb2.ConfirmCancelRequest(job_id=ref.job_id, lease_token=ref.lease_token), metadata=AUTH
    )
    assert done.job.status == jobs_pb2.JOB_STATUS_CANCELLED


@pytest.mark.parametrize(("asked", "answered"), [(0, 1), (1, 1), (2, 2), (3, 2)])
async def test_the_protocol_is_the_lower_of_the_workers_and_the_servers(
    worker: WorkerStub, asked: int, answered: int
) -> None:
    """A version-1 worker asks for nothing and hears 1 (so one that checks for
    exactly 1 keeps working); a protocol-2 worker asks for 2 and gets it."""
    request = worker_pb2.GetServerInfoRequest(protocol_version=asked)
    info = await worker.GetServerInfo(request, metadata=AUTH)
    assert info.protocol_version == answered
    protocol_two = {"idempotent_finish", "append_request_id", "checkpoints", "claim_held_leases"}
    assert protocol_two <= set(info.features)


async def test_a_cancel_ends_a_waiting_claim_that_holds_the_attempt(
    app: LeaseholdApp, stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    """Protocol 2: a worker long-polling for more work names the attempts it
    holds, and hears of a cancel when it happens, not at its next heartbeat
    (a third of the lease away)."""
    claimed = await running_remote_job(stub, worker)
    ref = worker_pb2.LeaseRef(job_id=claimed.job.id, lease_token=claimed.lease_token)
    request = worker_pb2.ClaimRequest(
        worker_id="w-test", kinds=[REMOTE_KIND], wait_seconds=60, held_leases=[ref]
    )
    # The call's deadline is far below its wait: only the cancel can end it in time.
    waiting = asyncio.ensure_future(worker.Claim(request, metadata=AUTH, timeout=3 * WAIT))
    await _until_claims_wait(app, 1)

    await stub.Cancel(jobs_pb2.CancelRequest(job_id=claimed.job.id), metadata=(("x-owner-id", OWNER),))

    answer = await waiting
    assert list(answer.jobs) == []
    assert [(s.job_id, s.cancel_requested, s.lost) for s in answer.held] == [(ref.job_id, True, False)]


async def test_held_leases_are_validated_like_heartbeat_leases(worker: WorkerStub) -> None:
    bad = worker_pb2.ClaimRequest(
        worker_id="w-test",
        kinds=[REMOTE_KIND],
        held_leases=[worker_pb2.LeaseRef(job_id="job_1", lease_token="")],
    )
    await expect_invalid(worker.Claim(bad, metadata=AUTH), "held_leases[0].lease_token")
    many = worker_pb2.ClaimRequest(
        worker_id="w-test",
        kinds=[REMOTE_KIND],
        held_leases=[worker_pb2.LeaseRef(job_id=f"job_{n}", lease_token="t") for n in range(1001)],
    )
    await expect_invalid(worker.Claim(many, metadata=AUTH), "held_leases")


async def test_a_worker_that_ignores_a_cancel_is_fenced_out_after_the_grace(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    claimed = await running_remote_job(stub, worker)
    ref = worker_pb2.LeaseRef(job_id=claimed.job.id, lease_token=claimed.lease_token)
    await stub.Cancel(jobs_pb2.CancelRequest(job_id=ref.job_id), metadata=(("x-owner-id", OWNER),))
    # The grace is 2 s; the rescuer (every lease/4 = 1.5 s) ends the job cancelled.
    await wait_for_event(stub, ref.job_id, "job.cancelled")
    (state,) = (await worker.Heartbeat(worker_pb2.HeartbeatRequest(leases=[ref]), metadata=AUTH)).states
    assert state.lost
    await expect_error(
        worker.Complete(
            worker_pb2.CompleteRequest(job_id=ref.job_id, lease_token=ref.lease_token), metadata=AUTH
        ),
        grpc.StatusCode.ABORTED,
    )
    assert (await get_job(stub, ref.job_id)).status == jobs_pb2.JOB_STATUS_CANCELLED


async def test_a_remote_attempt_past_its_timeout_fails_even_while_its_worker_heartbeats(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    claimed = await running_remote_job(stub, worker, timeout_seconds=1, max_attempts=1)
    ref = worker_pb2.LeaseRef(job_id=claimed.job.id, lease_token=claimed.lease_token)
    ended = asyncio.ensure_future(wait_for_event(stub, ref.job_id, "job.failed"))
    lost = False
    async with asyncio.timeout(WAIT):
        while not lost:
            (state,) = (
                await worker.Heartbeat(worker_pb2.HeartbeatRequest(leases=[ref]), metadata=AUTH)
            ).states
            lost = state.lost
            await asyncio.sleep(0.2)
    event = await asyncio.wait_for(ended, WAIT)
    assert dict(event.payload)["error"] == "Background job timed out."
    job = await get_job(stub, ref.job_id)
    assert job.status == jobs_pb2.JOB_STATUS_FAILED and job.error_type == "TimeoutError"


async def test_fail_retries_after_the_workers_delay_and_snooze_does_not_count_the_attempt(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    claimed = await running_remote_job(stub, worker)
    lease = {"job_id": claimed.job.id, "lease_token": claimed.lease_token}
    failed = await worker.Fail(
        worker_pb2.FailRequest(
            **lease, error_message="rate limited", error_type="HTTP429", retry_after_seconds=1
        ),
        metadata=AUTH,
    )
    assert failed.job.status == jobs_pb2.JOB_STATUS_QUEUED and failed.job.error_type == "HTTP429"
    delay = failed.job.available_at.ToDatetime() - failed.job.updated_at.ToDatetime()
    assert delay.total_seconds() == pytest.approx(1, abs=0.01)  # not the backoff (2 s after attempt 1)

    again = await claim_one(worker)
    assert again.job.attempt == 2
    snoozed = await worker.Snooze(
        worker_pb2.SnoozeRequest(job_id=again.job.id, lease_token=again.lease_token, delay_seconds=1),
        metadata=AUTH,
    )
    assert snoozed.job.status == jobs_pb2.JOB_STATUS_QUEUED and snoozed.job.attempt == 1
    third = await claim_one(worker)
    assert third.job.attempt == 2  # the snoozed attempt was not counted
    events = [e.type for e in await collect_events_until_running(stub, third.job.id)]
    assert "job.snoozed" in events


async def collect_events_until_running(stub: jobs_pb2_grpc.JobServiceStub, job_id: str) -> list[Any]:
    call = stub.WatchEvents(jobs_pb2.WatchEventsRequest(job_id=job_id), metadata=(("x-owner-id", OWNER),))
    seen = []
    async with asyncio.timeout(WAIT):
        async for response in call:
            seen.append(response.event)
            if len([e for e in seen if e.type == "job.started"]) == 3:
                break
    call.cancel()
    return seen


# ----- who may call ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [(), (("authorization", "Bearer wrong-token-0123456789"),), (("authorization", TOKEN),)],
    ids=["missing", "wrong", "not-bearer"],
)
async def test_every_worker_rpc_needs_the_worker_token(
    worker: WorkerStub, metadata: tuple[tuple[str, str], ...]
) -> None:
    calls = [
        worker.Claim(worker_pb2.ClaimRequest(worker_id="w", kinds=[REMOTE_KIND]), metadata=metadata),
        worker.Heartbeat(worker_pb2.HeartbeatRequest(), metadata=metadata),
        worker.AppendEvent(worker_pb2.AppendEventRequest(), metadata=metadata),
        worker.Complete(worker_pb2.CompleteRequest(), metadata=metadata),
        worker.Fail(worker_pb2.FailRequest(), metadata=metadata),
        worker.Snooze(worker_pb2.SnoozeRequest(), metadata=metadata),
        worker.ConfirmCancel(worker_pb2.ConfirmCancelRequest(), metadata=metadata),
        worker.GetServerInfo(worker_pb2.GetServerInfoRequest(), metadata=metadata),
    ]
    for call in calls:
        err = await expect_error(call, grpc.StatusCode.UNAUTHENTICATED)
        assert error_reason(err) == "WORKER_UNAUTHENTICATED"


@pytest.mark.parametrize("rpc", ["Enqueue", "Get", "List", "Cancel", "Retry", "WatchEvents", "BatchEnqueue"])
async def test_a_worker_credential_cannot_act_as_an_owner(
    stub: jobs_pb2_grpc.JobServiceStub, rpc: str
) -> None:
    """Not even beside an owner header, on any JobService RPC: a worker sees
    jobs only through the leases it holds."""
    job_id = (await enqueue(stub, REMOTE_KIND)).job.id
    requests = {
        "Enqueue": jobs_pb2.EnqueueRequest(kind=REMOTE_KIND),
        "Get": jobs_pb2.GetRequest(job_id=job_id),
        "List": jobs_pb2.ListRequest(),
        "Cancel": jobs_pb2.CancelRequest(job_id=job_id),
        "Retry": jobs_pb2.RetryRequest(job_id=job_id),
        "WatchEvents": jobs_pb2.WatchEventsRequest(job_id=job_id),
        "BatchEnqueue": jobs_pb2.BatchEnqueueRequest(requests=[jobs_pb2.EnqueueRequest(kind=REMOTE_KIND)]),
    }
    call = getattr(stub, rpc)(requests[rpc], metadata=(*AUTH, ("x-owner-id", OWNER)))
    err = await expect_error(drain(call) if rpc == "WatchEvents" else call, grpc.StatusCode.UNAUTHENTICATED)
    assert "worker credential" in (err.details() or "")
    job = await get_job(stub, job_id)
    assert (job.status, job.cancel_requested_at.seconds) == (jobs_pb2.JOB_STATUS_QUEUED, 0)
    assert len((await list_jobs(stub)).jobs) == 1  # nothing enqueued, nothing retried


# ----- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kinds": []}, "kinds"),
        ({"kinds": ["Not A Kind"]}, "kinds[0]"),
        ({"kinds": ["example.echo"]}, "kinds[0]"),  # served in process, not remote
        ({"worker_id": ""}, "worker_id"),
        ({"worker_id": "w" * 129}, "worker_id"),
        ({"max_jobs": 101}, "max_jobs"),
        ({"max_jobs": -1}, "max_jobs"),
        ({"wait_seconds": -1}, "wait_seconds"),
        ({"wait_seconds": 61}, "wait_seconds"),
        ({"wait_seconds": float("nan")}, "wait_seconds"),
    ],
)
async def test_a_bad_claim_names_its_field_and_takes_nothing(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub, fields: dict[str, Any], field: str
) -> None:
    job_id = (await enqueue(stub, REMOTE_KIND)).job.id
    request = {"worker_id": "w", "kinds": [REMOTE_KIND], **fields}
    await expect_invalid(worker.Claim(worker_pb2.ClaimRequest(**request), metadata=AUTH), field)
    assert (await get_job(stub, job_id)).status == jobs_pb2.JOB_STATUS_QUEUED


async def test_heartbeat_bounds(worker: WorkerStub) -> None:
    await expect_invalid(worker.Heartbeat(worker_pb2.HeartbeatRequest(), metadata=AUTH), "leases")
    many = [worker_pb2.LeaseRef(job_id=f"job_{i}", lease_token="t") for i in range(1001)]
    await expect_invalid(worker.Heartbeat(worker_pb2.HeartbeatRequest(leases=many), metadata=AUTH), "leases")
    await expect_invalid(
        worker.Heartbeat(
            worker_pb2.HeartbeatRequest(leases=[worker_pb2.LeaseRef(job_id="job_1")]), metadata=AUTH
        ),
        "leases[0].lease_token",
    )


def writes(job_id: str, token: str) -> list[tuple[str, Any]]:
    """Every fenced write, as (RPC name, request) naming `job_id` under `token`."""
    lease = {"job_id": job_id, "lease_token": token}
    return [
        ("AppendEvent", worker_pb2.AppendEventRequest(**lease, type="progress")),
        ("Complete", worker_pb2.CompleteRequest(**lease)),
        ("Fail", worker_pb2.FailRequest(**lease, error_message="x")),
        ("Snooze", worker_pb2.SnoozeRequest(**lease, delay_seconds=5)),
        ("ConfirmCancel", worker_pb2.ConfirmCancelRequest(**lease)),
    ]


async def test_a_write_under_a_wrong_token_or_for_an_unknown_job_is_aborted_and_changes_nothing(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    claimed = await running_remote_job(stub, worker)
    job_id = claimed.job.id
    before = await get_job(stub, job_id)
    attempts = writes(job_id, "wrong-token") + writes("job_does_not_exist", claimed.lease_token)
    answers = []
    for rpc, request in attempts:
        err = await expect_error(getattr(worker, rpc)(request, metadata=AUTH), grpc.StatusCode.ABORTED)
        answers.append((err.details() or "").replace(job_id, "ID").replace("job_does_not_exist", "ID"))
    # A stranger's job and a missing one answer alike.
    assert len(set(answers)) == 1
    beat = await worker.Heartbeat(
        worker_pb2.HeartbeatRequest(
            leases=[
                worker_pb2.LeaseRef(job_id=job_id, lease_token="wrong-token"),
                worker_pb2.LeaseRef(job_id="job_does_not_exist", lease_token=claimed.lease_token),
            ]
        ),
        metadata=AUTH,
    )
    assert [state.lost for state in beat.states] == [True, True]
    after = await get_job(stub, job_id)
    assert after == before


async def test_a_stale_lease_is_aborted_once_another_attempt_holds_the_job(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub
) -> None:
    first = await running_remote_job(stub, worker)
    await worker.Snooze(
        worker_pb2.SnoozeRequest(job_id=first.job.id, lease_token=first.lease_token, delay_seconds=1),
        metadata=AUTH,
    )
    second = await claim_one(worker)
    assert second.lease_token != first.lease_token
    for rpc, request in writes(first.job.id, first.lease_token):
        if rpc == "Snooze":
            continue  # the stale token's own write, sent again: answered (tests/api/test_worker_writes.py)
        await expect_error(getattr(worker, rpc)(request, metadata=AUTH), grpc.StatusCode.ABORTED)
    assert (await get_job(stub, first.job.id)).status == jobs_pb2.JOB_STATUS_RUNNING


@pytest.mark.parametrize(
    ("rpc", "fields", "field"),
    [
        ("AppendEvent", {"type": "job.succeeded"}, "type"),
        ("AppendEvent", {"type": ""}, "type"),
        ("AppendEvent", {"type": "p", "payload": struct({"x": "y" * (256 * 1024)})}, "payload"),
        ("Complete", {"result": struct({"x": "y" * (256 * 1024)})}, "result"),
        ("Fail", {"retry_after_seconds": -1}, "retry_after_seconds"),
        ("Fail", {"retry_after_seconds": 86_401}, "retry_after_seconds"),
        ("Fail", {"error_type": "E" * 129}, "error_type"),
        ("Snooze", {"delay_seconds": 0}, "delay_seconds"),
        ("Snooze", {"delay_seconds": 86_401}, "delay_seconds"),
        ("Complete", {"job_id": ""}, "job_id"),
        ("Complete", {"lease_token": ""}, "lease_token"),
    ],
)
async def test_a_bad_write_names_its_field_and_changes_nothing(
    stub: jobs_pb2_grpc.JobServiceStub, worker: WorkerStub, rpc: str, fields: dict[str, Any], field: str
) -> None:
    claimed = await running_remote_job(stub, worker)
    before = await get_job(stub, claimed.job.id)
    request_type = getattr(worker_pb2, f"{rpc}Request")
    request = request_type(**{"job_id": claimed.job.id, "lease_token": claimed.lease_token, **fields})
    await expect_invalid(getattr(worker, rpc)(request, metadata=AUTH), field)
    assert await get_job(stub, claimed.job.id) == before


@pytest.fixture
async def tokenless_app(
    database_url: str, registry: Any, runtime_settings: Any
) -> AsyncIterator[LeaseholdApp]:
    from leasehold._server.config import Settings

    service = LeaseholdApp(
        Settings(database_url=database_url, listen="127.0.0.1:0", runtime=runtime_settings),
        registry=registry,
    )
    await service.start()
    try:
        yield service
    finally:
        await service.stop(grace_seconds=0.5)


async def test_without_a_configured_token_every_worker_call_is_refused_naming_the_setting(
    tokenless_app: LeaseholdApp,
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{tokenless_app.port}") as channel:
        err = await expect_error(
            WorkerStub(channel).GetServerInfo(worker_pb2.GetServerInfoRequest(), metadata=AUTH),
            grpc.StatusCode.UNAUTHENTICATED,
        )
    assert "LEASEHOLD_WORKER_TOKEN" in (err.details() or "")
