"""The per-owner limits over a real server (serve --max-kinds-per-owner,
--max-resource-types-per-owner, --max-schedules-per-owner): the first value
past a limit is RESOURCE_EXHAUSTED naming the flag and the request field; what
the owner already has still goes in at the limit; another owner is unaffected."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from leasehold._server.jobs.owner_limits import OwnerLimits
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc, schedules_pb2, schedules_pb2_grpc
from tests.api.helpers import enqueue, error_info, expect_error, field_violations, struct
from tests.api.test_schedules import create_request
from tests.support import OWNER, owner_metadata

LIMIT = 3
OTHER = "bob"


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {
        "remote_kinds": ("remote.*",),
        "owner_limits": OwnerLimits(max_kinds=LIMIT, max_resource_types=LIMIT, max_schedules=LIMIT),
    }


@pytest.fixture
def schedules(channel: grpc.aio.Channel) -> schedules_pb2_grpc.ScheduleServiceStub:
    return schedules_pb2_grpc.ScheduleServiceStub(channel)


def _names(err: grpc.aio.AioRpcError, flag: str, field: str) -> None:
    info = error_info(err)
    assert info.reason == flag.replace("-", "_").upper() + "_EXCEEDED"
    assert dict(info.metadata) == {"limit": flag, "value": str(LIMIT)}
    assert flag in err.details() and field in err.details()
    assert field_violations(err) == [field]


def _item(kind: str, **fields: Any) -> jobs_pb2.EnqueueRequest:
    return jobs_pb2.EnqueueRequest(kind=kind, payload=struct(), **fields)


async def _batch(stub: jobs_pb2_grpc.JobServiceStub, items: list[jobs_pb2.EnqueueRequest], owner: str) -> Any:
    request = jobs_pb2.BatchEnqueueRequest(requests=items)
    return await stub.BatchEnqueue(request, metadata=owner_metadata(owner))


async def test_a_kind_past_the_limit_is_refused_and_known_kinds_still_go_in(
    stub: jobs_pb2_grpc.JobServiceStub,
) -> None:
    for number in range(LIMIT):
        await enqueue(stub, f"remote.k{number}")

    err = await expect_error(enqueue(stub, "remote.new"), grpc.StatusCode.RESOURCE_EXHAUSTED)
    _names(err, "max-kinds-per-owner", "kind")
    assert "remote.new" in err.details()

    assert (await enqueue(stub, "remote.k0")).created  # a kind the owner has: at the limit, fine
    assert (await enqueue(stub, "remote.new", owner=OTHER)).created  # another owner has room


async def test_a_batch_counts_its_new_kinds_together_and_names_the_first_past_the_limit(
    stub: jobs_pb2_grpc.JobServiceStub,
) -> None:
    await enqueue(stub, "remote.k0")
    items = [
        _item("remote.k0"),
        _item("remote.k1"),
        _item("remote.k1"),
        _item("remote.k2"),
        _item("remote.k3"),
    ]

    err = await expect_error(_batch(stub, items, OWNER), grpc.StatusCode.RESOURCE_EXHAUSTED)
    _names(err, "max-kinds-per-owner", "requests[4].kind")

    answer = await _batch(stub, items[:4], OWNER)  # exactly up to the limit: every item goes in
    assert len(answer.responses) == 4
    listed = await stub.List(jobs_pb2.ListRequest(page_size=100), metadata=owner_metadata())
    assert {job.kind for job in listed.jobs} == {"remote.k0", "remote.k1", "remote.k2"}


async def test_a_resource_type_past_the_limit_is_refused(stub: jobs_pb2_grpc.JobServiceStub) -> None:
    for number in range(LIMIT):
        await enqueue(stub, "remote.k0", resource_type=f"type{number}", resource_id="1")

    err = await expect_error(
        enqueue(stub, "remote.k0", resource_type="type-new", resource_id="1"),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    _names(err, "max-resource-types-per-owner", "resource_type")
    batch = [_item("remote.k0", resource_type="type-new", resource_id="2")]
    err = await expect_error(_batch(stub, batch, OWNER), grpc.StatusCode.RESOURCE_EXHAUSTED)
    _names(err, "max-resource-types-per-owner", "requests[0].resource_type")

    assert (await enqueue(stub, "remote.k0", resource_type="type0", resource_id="2")).created
    assert (await enqueue(stub, "remote.k0", owner=OTHER, resource_type="type-new", resource_id="1")).created


async def test_a_schedule_past_the_limit_is_refused(
    schedules: schedules_pb2_grpc.ScheduleServiceStub,
) -> None:
    for number in range(LIMIT):
        await schedules.CreateSchedule(create_request(schedule_id=f"s{number}"), metadata=owner_metadata())

    err = await expect_error(
        schedules.CreateSchedule(create_request(schedule_id="one-more"), metadata=owner_metadata()),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    _names(err, "max-schedules-per-owner", "schedule_id")

    await schedules.DeleteSchedule(
        schedules_pb2.DeleteScheduleRequest(schedule_id="s0"), metadata=owner_metadata()
    )
    await schedules.CreateSchedule(create_request(schedule_id="one-more"), metadata=owner_metadata())
    await schedules.CreateSchedule(create_request(schedule_id="theirs"), metadata=owner_metadata(OTHER))


async def test_a_schedule_of_a_new_kind_counts_against_the_kinds(
    stub: jobs_pb2_grpc.JobServiceStub, schedules: schedules_pb2_grpc.ScheduleServiceStub
) -> None:
    for number in range(LIMIT):
        await enqueue(stub, f"remote.k{number}")
    job = schedules_pb2.ScheduleJob(kind="remote.new", payload=struct())

    err = await expect_error(
        schedules.CreateSchedule(create_request(job=job), metadata=owner_metadata()),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    _names(err, "max-kinds-per-owner", "job.kind")
