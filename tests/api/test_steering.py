"""Steering over gRPC (DESIGN §11): the new Enqueue fields on Job, a run_at
claimed on time, and Get's wait_reason in each situation that produces it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf import timestamp_pb2

from leasehold._server.jobs.steering import Rate, Steering
from leasehold.v1 import jobs_pb2
from tests.api.helpers import (
    WAIT,
    enqueue,
    get_job,
    start_gate_job,
    wait_for_event,
    wait_for_terminal,
)
from tests.support import Gate

TOKEN = "steering-test-worker-token"


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {
        "steering": Steering(
            kind_limits={"test.gate": 1},
            owner_limit=2,
            kind_rates={"example.echo": Rate(0.001, 1)},
        ),
        "remote_kinds": ("remote.*",),
        "worker_token": TOKEN,
    }


def stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    message = timestamp_pb2.Timestamp()
    message.FromDatetime(moment)
    return message


async def reason(stub: Any, job_id: str, owner: str = "alice") -> int:
    job = await get_job(stub, job_id, owner=owner)
    assert job.status == jobs_pb2.JOB_STATUS_QUEUED, job
    return job.wait_reason


async def test_enqueue_keeps_priority_run_at_and_retry_policy_with_defaults_resolved(stub, app) -> None:
    run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    created = (
        await enqueue(
            stub,
            "example.sleep",
            priority=1,
            run_at=stamp(run_at),
            retry_policy=jobs_pb2.RetryPolicy(non_retryable_error_types=["KeyError", "KeyError"]),
        )
    ).job

    assert created.priority == 1
    assert created.run_at.ToDatetime(UTC) == run_at == created.available_at.ToDatetime(UTC)
    assert created.retry_policy == jobs_pb2.RetryPolicy(
        initial_interval_seconds=1,
        backoff_coefficient=2,
        max_interval_seconds=100,
        non_retryable_error_types=["KeyError"],
    )
    fetched = await get_job(stub, created.id)
    assert (fetched.priority, fetched.run_at, fetched.retry_policy) == (
        1,
        created.run_at,
        created.retry_policy,
    )
    plain = (await enqueue(stub, "example.sleep")).job
    assert plain.priority == 3
    assert not plain.HasField("run_at") and not plain.HasField("retry_policy")


async def test_get_names_why_a_queued_job_waits(stub, app, gate: Gate) -> None:
    owner = "alice"
    later = datetime.now(UTC) + timedelta(hours=1)
    scheduled = (await enqueue(stub, "example.sleep", owner=owner, run_at=stamp(later))).job
    assert await reason(stub, scheduled.id) == jobs_pb2.WAIT_REASON_SCHEDULED
    nobody = (await enqueue(stub, "remote.render", owner=owner)).job
    assert await reason(stub, nobody.id) == jobs_pb2.WAIT_REASON_NO_WORKER

    # test.gate may run one at a time (--kind-limit test.gate=1).
    await start_gate_job(stub, owner="gina")
    held = (await enqueue(stub, "test.gate", owner=owner)).job
    assert await reason(stub, held.id) == jobs_pb2.WAIT_REASON_KIND_LIMIT

    # example.echo's bucket holds one start, refilled once in 1,000 s.
    first = (await enqueue(stub, "example.echo", owner=owner)).job
    await wait_for_terminal(stub, first.id, owner=owner)
    throttled = (await enqueue(stub, "example.echo", owner=owner)).job
    assert await reason(stub, throttled.id) == jobs_pb2.WAIT_REASON_RATE_LIMIT

    policy = jobs_pb2.RetryPolicy(initial_interval_seconds=3600)
    failing = (await enqueue(stub, "example.fail", {"times": 1}, owner=owner, retry_policy=policy)).job
    await wait_for_event(stub, failing.id, "job.retry_scheduled", owner=owner)
    assert await reason(stub, failing.id) == jobs_pb2.WAIT_REASON_BACKOFF

    # bob at his --owner-limit of 2 and carl fill the last three of the 4 slots.
    long_sleep = {"seconds": 60, "steps": 600}
    for busy in ("bob", "bob", "carl"):
        started = (await enqueue(stub, "example.sleep", long_sleep, owner=busy)).job
        await wait_for_event(stub, started.id, "job.started", owner=busy)
    capped = (await enqueue(stub, "example.sleep", owner="bob")).job
    assert await reason(stub, capped.id, owner="bob") == jobs_pb2.WAIT_REASON_OWNER_LIMIT
    waiting_turn = (await enqueue(stub, "example.sleep", owner=owner)).job
    assert await reason(stub, waiting_turn.id) == jobs_pb2.WAIT_REASON_READY

    gate.release.set()
    await wait_for_event(stub, held.id, "job.started", owner=owner)
    running = await get_job(stub, held.id, owner=owner)
    assert running.wait_reason == jobs_pb2.WAIT_REASON_UNSPECIFIED  # only a queued job has one


async def test_a_remote_worker_asking_for_a_kind_clears_no_worker(stub, app, channel) -> None:
    from leasehold.v1 import worker_pb2, worker_pb2_grpc

    worker = worker_pb2_grpc.WorkerServiceStub(channel)
    auth = (("authorization", f"Bearer {TOKEN}"),)
    poll = worker.Claim(
        worker_pb2.ClaimRequest(worker_id="w", kinds=["remote.other"], wait_seconds=WAIT), metadata=auth
    )
    try:
        async with asyncio.timeout(WAIT):  # until the poll is waiting: a count, no event to await
            while app.claimer.waiting != 1:
                await asyncio.sleep(0.01)
        job = (await enqueue(stub, "remote.render", owner="alice")).job
        assert await reason(stub, job.id) == jobs_pb2.WAIT_REASON_NO_WORKER  # asked for another kind
        await enqueue(stub, "remote.other", owner="zed")  # taken by the poll
        response = await poll
        assert len(response.jobs) == 1
        # That worker asked for remote.other a moment ago: still there, busy.
        other = (await enqueue(stub, "remote.other", owner="alice")).job
        assert await reason(stub, other.id) == jobs_pb2.WAIT_REASON_READY
    finally:
        poll.cancel()
