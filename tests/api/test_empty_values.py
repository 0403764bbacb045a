"""A `Struct` holding a `Value` with no kind set (a generated client's default,
easily sent by mistake) is refused as INVALID_ARGUMENT naming where it is, by
every RPC that takes a Struct, instead of being stored as a null the sender
never meant; each on a real port and a real database (each engine)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from leasehold.v1 import (
    jobs_pb2,
    jobs_pb2_grpc,
    schedules_pb2,
    schedules_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.api.helpers import enqueue, expect_invalid, get_job, list_jobs, struct
from tests.support import owner_metadata

TOKEN = secrets.token_urlsafe(24)
AUTH = (("authorization", f"Bearer {TOKEN}"),)
KIND = "remote.work"


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {"remote_kinds": ("remote.*",), "worker_token": TOKEN}


def with_empty_value() -> struct_pb2.Struct:
    """{"items": [1], "total": <a Value with no kind>}."""
    value = struct({"items": [1]})
    value.fields["total"].Clear()  # the map entry exists, its Value has no kind
    return value


def nested_in_a_list() -> struct_pb2.Struct:
    value = struct({"items": [1]})
    value.fields["items"].list_value.values.add()
    return value


def under_an_odd_key() -> struct_pb2.Struct:
    value = struct({"odd key": {"y": 1}})
    value.fields["odd key"].struct_value.fields["x"].Clear()
    return value


Call = Callable[[grpc.aio.Channel, struct_pb2.Struct], Awaitable[Any]]


def by_enqueue(channel: grpc.aio.Channel, payload: struct_pb2.Struct) -> Awaitable[Any]:
    request = jobs_pb2.EnqueueRequest(kind="example.echo", payload=payload)
    return jobs_pb2_grpc.JobServiceStub(channel).Enqueue(request, metadata=owner_metadata())


def by_batch_enqueue(channel: grpc.aio.Channel, payload: struct_pb2.Struct) -> Awaitable[Any]:
    items = [
        jobs_pb2.EnqueueRequest(kind="example.echo", payload=struct({"n": 1})),
        jobs_pb2.EnqueueRequest(kind="example.echo", payload=payload),
    ]
    request = jobs_pb2.BatchEnqueueRequest(requests=items)
    return jobs_pb2_grpc.JobServiceStub(channel).BatchEnqueue(request, metadata=owner_metadata())


def by_create_schedule(channel: grpc.aio.Channel, payload: struct_pb2.Struct) -> Awaitable[Any]:
    request = schedules_pb2.CreateScheduleRequest(
        schedule_id="nightly",
        cron="0 3 * * *",
        job=schedules_pb2.ScheduleJob(kind="example.echo", payload=payload),
    )
    return schedules_pb2_grpc.ScheduleServiceStub(channel).CreateSchedule(request, metadata=owner_metadata())


OWNER_CALLS: dict[str, tuple[Call, str]] = {
    "Enqueue": (by_enqueue, "payload"),
    "BatchEnqueue": (by_batch_enqueue, "requests[1].payload"),
    "CreateSchedule": (by_create_schedule, "job.payload"),
}


@pytest.mark.parametrize("rpc", list(OWNER_CALLS))
async def test_an_owner_call_refuses_a_value_with_no_kind(channel: grpc.aio.Channel, rpc: str) -> None:
    call, field = OWNER_CALLS[rpc]
    await expect_invalid(call(channel, with_empty_value()), f"{field}.total")
    await expect_invalid(call(channel, nested_in_a_list()), f"{field}.items[1]")
    await expect_invalid(call(channel, under_an_odd_key()), f'{field}["odd key"].x')

    assert not (await list_jobs(jobs_pb2_grpc.JobServiceStub(channel))).jobs


async def test_worker_writes_refuse_a_value_with_no_kind(channel: grpc.aio.Channel) -> None:
    stub = jobs_pb2_grpc.JobServiceStub(channel)
    worker = worker_pb2_grpc.WorkerServiceStub(channel)
    job_id = (await enqueue(stub, KIND, {"n": 1})).job.id
    (claimed,) = (
        await worker.Claim(
            worker_pb2.ClaimRequest(worker_id="w-test", kinds=[KIND], wait_seconds=5), metadata=AUTH
        )
    ).jobs
    lease = {"job_id": job_id, "lease_token": claimed.lease_token}

    await expect_invalid(
        worker.AppendEvent(
            worker_pb2.AppendEventRequest(**lease, type="progress", payload=nested_in_a_list()), metadata=AUTH
        ),
        "payload.items[1]",
    )
    await expect_invalid(
        worker.Complete(worker_pb2.CompleteRequest(**lease, result=with_empty_value()), metadata=AUTH),
        "result.total",
    )

    assert (await get_job(stub, job_id)).status == jobs_pb2.JOB_STATUS_RUNNING  # nothing was written
    # A null said as such (null_value) is a value like any other.
    done = await worker.Complete(
        worker_pb2.CompleteRequest(**lease, result=struct({"total": None, "items": [None]})), metadata=AUTH
    )
    assert done.job.status == jobs_pb2.JOB_STATUS_SUCCEEDED
